"""For the tests: the harness's and the analysis's command lines, called in the test's own process
(call_command: what `python -m harness ...` prints and exits with, at the cost of a call), or
started as processes of their own where the test is about a process (start_command)."""

import contextlib
import faulthandler
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from harness.launchers.fresh import ProcessState

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"  # the test probes: a user's own experiment, on its own path
# The commands the tests call, by the name a test gives: each one's module and its arguments.
# The report is the harness's: python -m harness report.
COMMANDS = {"harness": ("harness", []), "analysis": ("harness", ["report"])}


def start_command(module: str, *args: str, cwd: Path, env: dict | None = None):
    """`python -m module args...` in `cwd`, started in its own session as from a terminal
    (Ctrl-C's SIGINT not ignored, even when the tests run in the background); the Popen."""
    return subprocess.Popen(
        [sys.executable, "-m", COMMANDS[module][0], *COMMANDS[module][1], *args],
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

    Afterwards this process is as it was (harness.launchers.fresh.ProcessState: a user's experiment,
    edited between two calls, is read anew), and Hydra's global state cleared. A call still running
    after `timeout` seconds has every thread's stack written to the test's stderr
    (faulthandler), saying where it hangs."""
    top, first = COMMANDS[module]
    argv = [sys.executable, "-m", top, *first, *args]
    if timeout:
        faulthandler.dump_traceback_later(timeout, file=sys.__stderr__)
    with _as_a_fresh_process(cwd, env or {}), _captured() as (out, err):
        try:
            code = importlib.import_module("harness.command.cli").main([*first, *args])
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


@contextlib.contextmanager
def _as_a_fresh_process(cwd: Path, env: dict):
    """The call's working directory and environment (PYTHONPATH's folders on sys.path), and
    afterwards this process's state back (harness.launchers.fresh), Hydra's global state cleared."""
    before = ProcessState()
    os.chdir(cwd)
    os.environ.update(env)
    added = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        before.restore()
        _clear_hydra()


def _clear_hydra() -> None:
    """Hydra's global state as a new process has it: no config loader, no job's config."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobRuntime

    GlobalHydra.instance().clear()
    for kind in (HydraConfig, JobRuntime):
        Singleton._instances.pop(kind, None)
