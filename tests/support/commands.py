"""For the tests: the harness's and the analysis's command lines, called in the test's own process
(call_command: what `python -m harness ...` prints and exits with, at the cost of a call), or
started as processes of their own where the test is about a process (start_command)."""

import contextlib
import faulthandler
import importlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from harness import lifetime

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"  # the test probes: a user's own experiment, on its own path
MAINS = {"harness": "harness.cli", "analysis": "analysis.__main__"}  # module -> its main's


def start_command(module: str, *args: str, cwd: Path, env: dict | None = None):
    """`python -m module args...` in `cwd`, started in its own session as from a terminal
    (Ctrl-C's SIGINT not ignored, even when the tests run in the background); the Popen."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def call_command(module: str, *args: str, cwd: Path, env: dict | None = None, timeout=600):
    """`python -m module args...` as a call of its main in this process, run in `cwd` with `env`
    added to the environment (PYTHONPATH's folders on sys.path); a CompletedProcess of what it
    wrote to stdout and stderr (its own and its child processes', at the file descriptors) and
    its exit code: 1 and the traceback on stderr for an exception, as Python's would be.

    Afterwards this process is as it was: working directory, environment, sys.path, the
    modules imported from PYTHONPATH's folders (a user's experiment, edited between two calls,
    is read anew), what the harness keeps for a process's lifetime (harness.lifetime),
    logging's handlers and levels, signal handlers, Hydra's global state, and torch's threads,
    default dtype, grad mode and random state. A call still running after `timeout` seconds has
    every thread's stack written to the test's stderr (faulthandler), saying where it hangs."""
    argv = [sys.executable, "-m", module, *args]
    if timeout:
        faulthandler.dump_traceback_later(timeout, file=sys.__stderr__)
    with _as_a_fresh_process(cwd, env or {}), _captured() as (out, err):
        try:
            code = importlib.import_module(MAINS[module]).main(list(args))
        except SystemExit as stop:
            code = stop.code
        except BaseException:  # noqa: BLE001 - what an uncaught exception does to a process
            traceback.print_exc()
            code = 1
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)  # sys.exit("text"): the text, exit code 1
            code = 1
    faulthandler.cancel_dump_traceback_later()
    return subprocess.CompletedProcess(argv, code or 0, out.text, err.text)


def _environment(extra: dict | None) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), **(extra or {})}


class _Output:
    text = ""


@contextlib.contextmanager
def _captured():
    """File descriptors 1 and 2, and sys.stdout and sys.stderr over them, into two files: what
    the call prints, and what the processes it starts print, in the order written."""
    outputs, saved_streams = [_Output(), _Output()], (sys.stdout, sys.stderr)
    for stream in saved_streams:
        stream.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        with contextlib.ExitStack() as stack:
            for fd, file in zip((1, 2), (out, err), strict=True):
                stack.enter_context(_redirected(fd, file.fileno()))
            sys.stdout, sys.stderr = (
                stack.enter_context(open(fd, "w", buffering=1, encoding="utf-8",
                                         errors="backslashreplace", closefd=False))
                for fd in (1, 2)
            )  # fmt: skip
            try:
                yield outputs
            finally:
                sys.stdout, sys.stderr = saved_streams
        for output, file in zip(outputs, (out, err), strict=True):  # flushed, fds back: read
            file.seek(0)
            output.text = file.read().decode("utf-8", "backslashreplace")


@contextlib.contextmanager
def _redirected(fd: int, to: int):
    saved = os.dup(fd)
    os.dup2(to, fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)


@contextlib.contextmanager
def _as_a_fresh_process(cwd: Path, env: dict):
    """The call's working directory and environment, and afterwards this process's state back."""
    saved_cwd, saved_environ, saved_path = os.getcwd(), dict(os.environ), list(sys.path)
    saved_signals = {signum: signal.getsignal(signum) for signum in SIGNALS}
    saved_logging = _logging_state()
    saved_torch = _torch_state()
    added = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    modules = set(sys.modules)
    os.chdir(cwd)
    os.environ.update(env)
    sys.path[:0] = [p for p in added if p not in sys.path]
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.path[:] = saved_path
        _forget_modules_from(added, set(sys.modules) - modules)
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
        _restore_logging(saved_logging)
        _restore_torch(saved_torch)
        _clear_hydra()
        lifetime.forget()


def _forget_modules_from(folders: list[str], new: set[str]) -> None:
    """Modules imported during the call from a PYTHONPATH folder of its own (a user's
    experiments): the next call imports them afresh, as a new process would."""
    roots = [Path(folder).resolve() for folder in folders]
    roots = [root for root in roots if root not in (ROOT, SUPPORT)]  # this process's own too
    for name in new:
        origin = getattr(sys.modules.get(name), "__file__", None)
        if origin and any(Path(origin).resolve().is_relative_to(root) for root in roots):
            del sys.modules[name]


def _logging_state():
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return {
        logger: (list(logger.handlers), logger.level, logger.disabled, logger.propagate)
        for logger in loggers
        if isinstance(logger, logging.Logger)
    }


def _restore_logging(saved: dict) -> None:
    now = _logging_state()
    for logger, (handlers, *_) in now.items():
        kept = saved.get(logger, ([],))[0]
        for handler in handlers:
            if handler not in kept:
                logger.removeHandler(handler)
                handler.close()
    for logger, (handlers, level, disabled, propagate) in saved.items():
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.disabled, logger.propagate = disabled, propagate


def _torch_state():
    import torch  # the harness's calls import it anyway: its state from before the first

    return (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled(),
            torch.random.get_rng_state(), torch.are_deterministic_algorithms_enabled())  # fmt: skip


def _restore_torch(saved) -> None:
    import torch

    threads, dtype, grad, rng, deterministic = saved
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
    torch.random.set_rng_state(rng)
    torch.use_deterministic_algorithms(deterministic)


def _clear_hydra() -> None:
    """Hydra's global state as a new process has it: no config loader, no job's config."""
    if "hydra" not in sys.modules:
        return
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobRuntime

    GlobalHydra.instance().clear()
    for kind in (HydraConfig, JobRuntime):
        Singleton._instances.pop(kind, None)
