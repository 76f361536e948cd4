"""The settings of a process that change what a computation returns or how long it takes,
besides those a ProcessState keeps itself (harness.launchers.fresh): each by name, how to read
it and how to set it back."""

import contextlib
import decimal
import functools
import gc
import locale
import operator
import os
import resource
import sys
import threading
import time
import warnings
from collections.abc import Callable


@functools.cache
def settings() -> dict[str, tuple[Callable[[], object], Callable[[object], None]]]:
    """What else of this process changes what a computation returns or how long it takes, by
    name: (read it, set it back). Read before and after each unit of work, and set back where
    it differs; the environment (TZ among it) is back by then, so time.tzset reads it again."""
    import numpy
    import torch

    flags = {"cudnn": ("enabled", "benchmark", "deterministic"),
             "cuda.matmul": ("allow_fp16_reduced_precision_reduction",
                             "allow_bf16_reduced_precision_reduction"),
             "mkldnn": ("enabled",), "opt_einsum": ("enabled",)}  # fmt: skip
    settings = {}
    for where, names in flags.items():
        owner = operator.attrgetter(where)(torch.backends)
        for name in names:
            settings[f"torch.backends.{where}.{name}"] = (
                functools.partial(getattr, owner, name),
                functools.partial(setattr, owner, name),
            )
    for kind in ("flash", "mem_efficient", "math", "cudnn"):  # SDPA's backends, each allowed
        settings[f"SDPA's {kind} backend"] = (
            getattr(torch.backends.cuda, f"{kind}_sdp_enabled"),
            getattr(torch.backends.cuda, f"enable_{kind}_sdp"),
        )
    settings |= {
        "torch's default device": (
            lambda: str(torch.get_default_device()),
            lambda device: torch.set_default_device(None if device == "cpu" else device),
        ),
        "float32 precision (TF32)": (_precision, _set_precision),
        "flush-denormal mode": (_flushes_denormals, torch.set_flush_denormal),
        "autograd's anomaly mode": (
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda mode: torch.set_anomaly_enabled(*mode),
        ),
        "NumPy's floating-point errors": (numpy.geterr, lambda errors: numpy.seterr(**errors)),
        "the warnings filters": (lambda: list(warnings.filters), _set_warning_filters),
        "the time zone": (lambda: time.tzname, lambda _: time.tzset()),
        "the umask": (_umask, os.umask),
        "the resource limits": (_limits, _set_limits),
        "the scheduling priority": (
            lambda: os.getpriority(os.PRIO_PROCESS, 0),
            lambda nice: os.setpriority(os.PRIO_PROCESS, 0, nice),
        ),
        "the CPU affinity": (
            lambda: os.sched_getaffinity(0),
            lambda cpus: os.sched_setaffinity(0, cpus),
        ),
        "the recursion limit": (sys.getrecursionlimit, sys.setrecursionlimit),
        "the thread switch interval": (sys.getswitchinterval, sys.setswitchinterval),
        "the garbage collector": (lambda: (gc.isenabled(), gc.get_threshold()), _set_gc),
        "decimal's context": (_decimal, _set_decimal),
        "the locale": (
            lambda: locale.setlocale(locale.LC_ALL),
            lambda name: locale.setlocale(locale.LC_ALL, name),
        ),
        "the standard streams": (lambda: (sys.stdin, sys.stdout, sys.stderr), _set_streams),
        "a trace or profile function": (
            lambda: (
                sys.gettrace(),
                sys.getprofile(),
                threading.gettrace(),
                threading.getprofile(),
            ),
            _set_tracing,
        ),
    }
    return settings


def set_back(saved: dict) -> list[str]:
    """Each of the _settings that differs from `saved` set back; the names of those that still
    differ (a hard limit lowered cannot be raised again)."""
    unset = []
    for name, (get, put) in settings().items():
        if get() != saved[name]:
            with contextlib.suppress(OSError, ValueError, RuntimeError):  # named, as unset
                put(saved[name])
            if get() != saved[name]:
                unset.append(name)
    return unset


PRECISIONS = ("fp32_precision", "cuda.matmul.fp32_precision", "cudnn.fp32_precision",
              "cudnn.conv.fp32_precision", "cudnn.rnn.fp32_precision", "mkldnn.fp32_precision",
              "mkldnn.matmul.fp32_precision", "mkldnn.conv.fp32_precision",
              "mkldnn.rnn.fp32_precision")  # fmt: skip
LEGACY_PRECISIONS = ("cuda.matmul.allow_tf32", "cudnn.allow_tf32")  # before torch 2.9


def _precision() -> tuple:
    """float32 matmul precision as set_float32_matmul_precision left it ("mixed": set both
    ways), and each backend's precision."""
    import torch

    try:
        matmul = torch.get_float32_matmul_precision()
    except RuntimeError:  # set through the new API and the legacy one
        matmul = "mixed"
    new = hasattr(torch.backends, "fp32_precision")
    return matmul, *(operator.attrgetter(path)(torch.backends)
                     for path in (PRECISIONS if new else LEGACY_PRECISIONS))  # fmt: skip


def _set_precision(saved: tuple) -> None:
    import torch

    matmul, *each = saved
    if matmul != "mixed":
        torch.set_float32_matmul_precision(matmul)
    paths = PRECISIONS if hasattr(torch.backends, "fp32_precision") else LEGACY_PRECISIONS
    for path, value in zip(paths, each, strict=True):
        where, _, name = path.rpartition(".")
        owner = operator.attrgetter(where)(torch.backends) if where else torch.backends
        if getattr(owner, name) != value:
            setattr(owner, name, value)


def _flushes_denormals() -> bool:
    """Whether this thread flushes denormals, as torch.set_flush_denormal makes it (the CPU's
    FTZ and DAZ flags, which NumPy's arithmetic obeys too): a product of NumPy's, some 4 times
    cheaper than one of torch's."""
    import numpy

    return float(numpy.float32(1e-39) * numpy.float32(0.5)) == 0.0  # a denormal float32, halved


def _set_warning_filters(filters: list) -> None:
    warnings.filters[:] = filters
    warnings._filters_mutated()  # noqa: SLF001 - the caches of warnings that were shown once


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


LIMITS = [getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")]


def _limits() -> list:
    return [resource.getrlimit(limit) for limit in LIMITS]


def _set_limits(limits: list) -> None:
    for limit, value in zip(LIMITS, limits, strict=True):
        if resource.getrlimit(limit) != value:
            resource.setrlimit(limit, value)  # a raised hard limit: ValueError unless root


def _set_gc(state: tuple) -> None:
    enabled, threshold = state
    gc.enable() if enabled else gc.disable()
    gc.set_threshold(*threshold)


def _decimal() -> tuple:
    """decimal's context in this thread: precision, rounding, exponents, and its traps."""
    context = decimal.getcontext()
    traps = tuple(sorted(signal.__name__ for signal, on in context.traps.items() if on))
    return (context.prec, context.rounding, context.Emin, context.Emax, context.capitals,
            context.clamp, traps)  # fmt: skip


def _set_decimal(saved: tuple) -> None:
    *fields, traps = saved
    traps = [getattr(decimal, name) for name in traps]
    decimal.setcontext(decimal.Context(*fields, flags=[], traps=traps))


def _set_streams(streams: tuple) -> None:
    sys.stdin, sys.stdout, sys.stderr = streams


def _set_tracing(functions: tuple) -> None:
    sys.settrace(functions[0])
    sys.setprofile(functions[1])
    threading.settrace(functions[2])
    threading.setprofile(functions[3])
