"""Peak memory and an isolated-process runner: generic, for any experiment (timing and FLOP/s
are harness.measuring.timing's).

The runner knows nothing about what it measures: it runs a picklable module-level function in a
fresh child process and hands back its result, or a status saying why there is none. Children are
forked from a multiprocessing forkserver that has already imported torch, so a measurement costs
a fork rather than a new interpreter, and each one starts with nothing allocated by an earlier one.

Memory is named for what it is: `rss_delta_mib` (CPU: peak resident memory during the call minus
resident memory just before it) or `cuda_peak_mib` (the CUDA allocator's peak during the call
minus what was allocated before it). Neither is ever reported for the other device.
"""

import functools
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from harness.measuring import took

MIB = 1024 * 1024
DEFAULT_MEMORY_CAP_MIB = 8192
MEMORY_CAP_ENV = "HARNESS_MEMORY_CAP_MIB"

Status = Literal["ok", "failed", "oom", "killed", "timeout"]


@dataclass(frozen=True)
class Outcome:
    """What came back from an isolated run: the function's value when status is "ok"."""

    status: Status
    value: Any = None
    error: str = ""


# The isolated runner


def run_isolated(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    *,
    memory_cap_mib: int | None = None,
    timeout_s: float | None = None,
) -> Outcome:
    """Run fn(*args, **kwargs) in a fresh child process; never raises because of the child.

    memory_cap_mib bounds how much address space the child may add after it starts (None: the
    HARNESS_MEMORY_CAP_MIB environment variable, else 8192; 0: no cap). Pass 0 for CUDA work:
    the CUDA driver reserves far more address space than it uses.
    """
    took("memory")
    cap = default_memory_cap_mib() if memory_cap_mib is None else memory_cap_mib
    context = _forkserver()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(sender, fn, args, kwargs or {}, cap))
    child.daemon = True
    try:
        child.start()  # raises here, in the caller, if fn or its arguments do not pickle
    except BaseException:
        receiver.close()
        raise
    finally:
        sender.close()
    try:
        outcome = _await_child(child, receiver, timeout_s)
        if outcome.status == "oom" and cap:
            outcome = Outcome("oom", error=f"{outcome.error} (memory cap {cap} MiB)")
        return outcome
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join()


def default_memory_cap_mib() -> int:
    """The cap for CPU measurement children: HARNESS_MEMORY_CAP_MIB if set, else 8192 (0: none)."""
    value = os.environ.get(MEMORY_CAP_ENV, "").strip()
    if not value:
        return DEFAULT_MEMORY_CAP_MIB
    if not value.isdigit():
        raise ValueError(
            f"{MEMORY_CAP_ENV} must be a whole number of MiB (0: no cap), got {value!r}"
        )
    return int(value)


@functools.cache
def _forkserver() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    # The server imports these once; every child is a fork of it. Failed imports are ignored.
    # torch._inductor too: torch.profiler (which a child may use to see which kernel ran)
    # imports it at its first use, 1.6 s a child here where a preloaded one costs nothing.
    context.set_forkserver_preload(["torch", "torch._inductor", "harness.measuring.memory"])
    return context


def _await_child(child, receiver, timeout_s: float | None) -> Outcome:
    if not receiver.poll(timeout_s):
        child.kill()
        return Outcome("timeout", error=f"timed out after {timeout_s} s")
    try:
        status, value, error = receiver.recv()
        return Outcome(status, value, error)
    except (EOFError, OSError):
        pass  # the child died without answering; its exit code says how
    child.join()
    code = child.exitcode
    if code is not None and code < 0:
        return Outcome("killed", error=f"killed by {signal.Signals(-code).name}")
    return Outcome("failed", error=f"the child exited with code {code} without a result")


def _child_main(sender, fn, args, kwargs, cap_mib: int) -> None:
    _end_with_the_parent()
    try:
        if cap_mib:
            _cap_address_space(cap_mib)
        message = ("ok", fn(*args, **kwargs), "")
    except BaseException as error:  # everything becomes a status for the parent
        status, said = _classify(error), f"{type(error).__name__}: {error}".strip()
        cuda_not_started = "cuda" in said.lower() and not torch.cuda.is_initialized()
        if status == "oom" and cap_mib and cuda_not_started:
            # CUDA reserves far more address space than it uses: it could not start at all
            hint = f"CUDA cannot start under a cap of {cap_mib} MiB: give CUDA work 0"
            status, said = "failed", f"{said} ({hint})"
        message = (status, None, said)
    try:
        sender.send(message)
    except Exception as error:  # e.g. an unpicklable result
        sender.send(("failed", None, f"the result could not be sent back: {error!r}"))
    finally:
        sender.close()


def _end_with_the_parent() -> None:
    """This child ends the moment the process that asked for it does (a SIGKILL of the sweep, or
    of the warm worker that ran the point): the parent's end of multiprocessing's sentinel pipe
    closes with it. The forkserver this child was forked from, and the resource tracker, end
    once no process of theirs is left."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def follow() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=follow, name="end-with-the-parent", daemon=True).start()


def _cap_address_space(cap_mib: int) -> None:
    """Let the address space grow by at most cap_mib from here (what is mapped already is free)."""
    mapped = proc_status_kib("VmSize") * 1024
    limit = mapped + cap_mib * MIB
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def is_out_of_memory(error: BaseException) -> bool:
    """Whether an exception says that memory ran out: MemoryError, CUDA's, or an allocator's
    message (what an address-space cap makes of a large allocation)."""
    return _classify(error) == "oom"


def _classify(error: BaseException) -> Status:
    if isinstance(error, MemoryError | torch.cuda.OutOfMemoryError):
        return "oom"
    text = str(error).lower()
    out_of_memory = ("can't allocate memory", "cannot allocate memory", "out of memory")
    if isinstance(error, RuntimeError | OSError) and any(s in text for s in out_of_memory):
        return "oom"
    return "failed"


# Memory


def measure_memory(
    fn: Callable[[], object], *, device: str | torch.device, warmup: int = 0
) -> dict[str, float]:
    """Peak memory of one call to fn over what existed just before it, named for the device.

    CPU: {"rss_delta_mib"}; run it in a process that did nothing else (run_isolated), with the
    call's inputs already allocated so they are part of the baseline, and keep warmup at 0 (an
    allocator reusing a warm-up's pages would hide them). CUDA: {"cuda_peak_mib",
    "cuda_reserved_mib"}, the latter the allocator's absolute peak reservation, inputs and caches
    included; a warm-up call there keeps one-off workspaces out of the figure.
    """
    took("memory")
    for _ in range(warmup):
        fn()
    if torch.device(device).type == "cuda":
        return _cuda_peak(fn, torch.device(device))
    return {"rss_delta_mib": _rss_peak_delta_mib(fn)}


def _rss_peak_delta_mib(fn: Callable[[], object]) -> float:
    """VmHWM after the call minus VmRSS before it, with the high-water mark reset to VmRSS first.

    The kernel keeps VmHWM per address space: a fork starts it at the child's RSS and an exec
    starts it afresh, whereas ru_maxrss carries the parent's peak across fork + exec (vfork).
    """
    reset = _reset_high_water_mark()
    before_kib = proc_status_kib("VmRSS")
    if not reset and proc_status_kib("VmHWM") > before_kib + 1024:
        raise RuntimeError(
            "cannot reset VmHWM (/proc/self/clear_refs) and an earlier peak exceeds the current "
            "resident memory, so the call's peak cannot be told apart from it"
        )
    fn()
    return (proc_status_kib("VmHWM") - before_kib) / 1024


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # "5": reset the peak resident set size (Linux 4.0+)
        return True
    except OSError:
        return False


def proc_status_kib(field: str) -> int:
    """A field of this process's /proc/self/status in kiB (VmRSS: its resident memory now)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _cuda_peak(fn: Callable[[], object], device: torch.device) -> dict[str, float]:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return {
        "cuda_peak_mib": (torch.cuda.max_memory_allocated(device) - before) / MIB,
        "cuda_reserved_mib": torch.cuda.max_memory_reserved(device) / MIB,
    }
