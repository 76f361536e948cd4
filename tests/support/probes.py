"""Experiments for the harness's own tests: points that wait, through files, for each other or
for the test, so that a test can prove two points ran at once, or act while a point runs,
without resting on timing."""

import base64
import decimal
import importlib
import json
import logging
import math
import os
import resource
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy
import torch

SUPPORT = Path(__file__).resolve().parent  # the probes, and their configs in conf/
# The PYTHONPATH under which `python -m harness` finds both the harness and the probes.
PROBE_PATH = os.pathsep.join([str(SUPPORT.parent.parent), str(SUPPORT)])


def rendezvous(
    *,
    point: int,
    folder: str,
    expect: int = 0,
    release: str = "",
    hold: int = 0,
    timeout_s: float = 120.0,
    fail: int = -1,
) -> list[dict]:
    """Arrive (leave a file of its own in `folder`), then wait until `expect` arrivals are
    there and, if `release` names one, until that file exists in `folder` (only the points
    numbered `hold` or more wait for it). One row: how many arrivals it saw. A point that
    waits longer than timeout_s fails, and so does point number `fail` at once."""
    if point == fail:
        raise RuntimeError(f"point {point} fails, as asked (fail={fail})")
    here = Path(folder)
    (here / f"arrived-{point}-{time.monotonic_ns()}-{os.getpid()}").touch()  # pid last
    held = release and point >= hold
    deadline = time.monotonic() + timeout_s
    while len(arrivals(here)) < expect or (held and not (here / release).exists()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"point {point} waited {timeout_s:g} s in {folder}")
        time.sleep(0.05)
    return [{"arrivals": len(arrivals(here))}]


LEAKED = []  # what leaky left in this module: a new process, or a module imported anew, has none


def leaky(*, point: int, folder: str, module: str = "", hold: int = -1) -> list[dict]:
    """A point that says what state it starts from, then leaves every piece of it changed:
    torch's threads, default dtype, grad mode, autocast and RNG, an environment variable, the
    working directory, sys.path, a logging handler, this module's own list; with `module`, the
    VALUE of that module of the user's (imported by name) too. Once it has seen all that, its
    arrival in `folder` names its process; point `hold` then waits for the file "release" there.
    One row: what it saw."""
    here = Path(folder)
    seen = {
        "torch_threads": torch.get_num_threads(), "dtype": str(torch.get_default_dtype()),
        "grad": torch.is_grad_enabled(), "autocast": torch.is_autocast_enabled("cpu"),
        "draw": torch.rand(1).item(),
        "env": os.environ.get("LEAKY", ""), "cwd": os.getcwd(), "path": len(sys.path),
        "handlers": len(logging.getLogger().handlers), "leaked": len(LEAKED),
        "value": importlib.import_module(module).VALUE if module else 0,
    }  # fmt: skip
    # After the seeing: a test that edits the module once a point arrived edits it after the read.
    (here / f"arrived-{point}-{time.monotonic_ns()}-{os.getpid()}").touch()
    if point == hold:
        wait_for(lambda: (here / "release").exists(), 120, "the release")
    torch.set_num_threads(1 if seen["torch_threads"] > 1 else 2)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.set_autocast_enabled("cpu", True)
    torch.manual_seed(12345)
    os.environ["LEAKY"] = f"point {point}"
    os.chdir(folder)
    sys.path.append(folder)
    logging.getLogger().addHandler(logging.NullHandler())
    LEAKED.append(point)
    return [seen]


def _seen_state() -> dict:
    """What a point could see of the state an earlier point on its process left (unsettling)."""
    umask = os.umask(0)
    os.umask(umask)
    tiny = torch.full((1,), 1e-39, dtype=torch.float32)  # a denormal: flushed to 0 when told to
    return {
        "default_device": str(torch.get_default_device()),
        "flushes_denormals": (tiny * 0.5).item() == 0.0,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "numpy_errors": str(sorted(numpy.geterr().items())),
        "warning_filters": len(warnings.filters),
        "time_zone": "/".join(time.tzname),
        "umask": umask,
        "open_files": str(resource.getrlimit(resource.RLIMIT_NOFILE)),
        "recursion_limit": sys.getrecursionlimit(),
        "anomaly_mode": torch.is_anomaly_enabled(),
        "matmul_name": torch.matmul.__name__,
        "threads_running": threading.active_count(),
        "decimal_digits": decimal.getcontext().prec,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32_matmul": str(getattr(torch.backends.cuda.matmul, "fp32_precision", None)),
        "sdpa_math": torch.backends.cuda.math_sdp_enabled(),
        "sum_of_products": float(torch.matmul(torch.ones(8, 8), torch.ones(8, 8)).sum()),
    }


def _patch_matmul() -> None:
    original = torch.matmul

    def patched(*args, **kwargs):
        return original(*args, **kwargs) * 2

    torch.matmul = patched


def _fewer_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


UNSETTLE = {  # one thing a point may leave changed in its process, by name
    "default_device": lambda: torch.set_default_device("meta"),
    "flush_denormals": lambda: torch.set_flush_denormal(True),
    "matmul_precision": lambda: torch.set_float32_matmul_precision("medium"),
    "numpy_errors": lambda: numpy.seterr(all="raise"),
    "warning_filters": lambda: warnings.filterwarnings("ignore", "unsettling"),
    "time_zone": lambda: (os.environ.__setitem__("TZ", "Asia/Kolkata"), time.tzset()),
    "umask": lambda: os.umask(0o077),
    "open_files": _fewer_open_files,
    "recursion_limit": lambda: sys.setrecursionlimit(5000),
    "anomaly_mode": lambda: torch.set_anomaly_enabled(True),
    "patch": _patch_matmul,
    "thread": lambda: threading.Thread(target=time.sleep, args=(600,), name="left-running").start(),
    "decimal_digits": lambda: setattr(decimal.getcontext(), "prec", 5),
    "cudnn_benchmark": lambda: setattr(torch.backends.cudnn, "benchmark", True),
    "tf32_matmul": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
    "sdpa_math": lambda: torch.backends.cuda.enable_math_sdp(False),
    "nothing": lambda: None,
}


def unsettling(*, change: str, folder: str) -> list[dict]:
    """A point that says what state it starts from, then leaves one thing of its process
    changed (UNSETTLE[change]). Its arrival in `folder` names its process. One row: what it
    saw, each setting a column."""
    (Path(folder) / f"arrived-{change}-{time.monotonic_ns()}-{os.getpid()}").touch()
    seen = _seen_state()
    UNSETTLE[change]()
    return [seen]


def _wait_in_child(folder: str) -> None:
    (Path(folder) / f"child-{os.getpid()}").touch()
    wait_for(lambda: (Path(folder) / "release").exists(), 600, "the release")


def isolated(*, folder: str, point: int = 0) -> list[dict]:
    """A point whose work runs in an isolated measurement child (harness.measuring.memory), which
    says it started (the file child-PID in `folder`) and waits for the file "release" there."""
    from harness.measuring.memory import run_isolated

    outcome = run_isolated(_wait_in_child, (folder,), memory_cap_mib=0)
    return [{"child": outcome.status}]


def arrivals(folder: Path) -> list[Path]:
    """The arrival files in `folder`, one each time a point ran."""
    return sorted(Path(folder).glob("arrived-*"))


def await_arrivals(folder: Path, count: int, timeout_s: float = 120.0) -> None:
    """For the tests: wait until `count` points have arrived in `folder`, at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    while len(arrivals(folder)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(arrivals(folder))} of {count} points arrived in {folder}")
        time.sleep(0.05)


def sized(*, width: int, point: int = 0) -> list[dict]:
    """One row from a config that chooses a config group (size: small or large)."""
    return [{"area": width * point}]


def trainer(
    *,
    steps: int,
    folder: str,
    checkpoint_every: int = 4,
    hold_at: int = 0,
    until: str = "release",
    timeout_s: float = 120.0,
    seed: int = 0,
    state_kib: int = 0,
    tracker=None,
) -> list[dict]:
    """A training run without a model: a row per step (step, value = step * 10 + seed), a
    checkpoint every `checkpoint_every` steps. A run that did not resume from a checkpoint
    holds after step `hold_at` (0: never) until the file `until` exists in `folder`, or, with
    until="stopping", until SLURM asks its task to stop (tracker.stopping); it leaves the file
    "held-PID" there meanwhile. Then one final row (step 0, value -1). Its checkpoints carry
    `state_kib` KiB of weights besides the step. In a point of several processes each logs its
    rows, and the processes meet at every step (an all-reduce, as DistributedDataParallel's)."""
    state = tracker.restore() if tracker is not None else None
    first = state["step"] + 1 if state else 1
    stopping = until == "stopping"
    released = (lambda: tracker.stopping) if stopping else (Path(folder) / until).exists
    rows = []
    for step in range(first, steps + 1):
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(torch.ones(1))  # fails once a process is gone
        row = {"step": step, "value": step * 10 + seed, "pid": os.getpid()}
        tracker.log(row) if tracker is not None else rows.append(row)
        if step == hold_at and state is None:
            hold(folder, step, timeout_s, released)
        if tracker is not None and (step % checkpoint_every == 0 or tracker.stopping):
            tracker.save({"step": step, "weights": torch.rand(256 * state_kib)})
    return [*rows, {"step": 0, "value": -1, "pid": os.getpid()}]


def hold(folder: str, step: int, timeout_s: float, released: Callable[[], bool]) -> None:
    """A training probe held at `step` until released() (the file "held-PID" in `folder`
    meanwhile); TimeoutError after timeout_s."""
    (Path(folder) / f"held-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while not released():
        if time.monotonic() > deadline:
            raise TimeoutError(f"held at step {step} for {timeout_s:g} s")
        time.sleep(0.05)


def steps_by_rank(rows) -> dict[int, list[int]]:
    """rank -> the steps of the trainer's rows of a point of several processes, in order."""
    train = rows[rows["step"] > 0]
    return {int(rank): group["step"].tolist() for rank, group in train.groupby("rank")}


def held(folder: Path) -> list[Path]:
    """The "held-PID" files trainer runs left in `folder`."""
    return sorted(Path(folder).glob("held-*"))


def wait_for(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    interval: float = 0.1,
    describe: Callable[[], str] | None = None,
):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds
    (with ``describe()`` in the message, e.g. the job's state)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{describe()}" if describe else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


def faulty(
    *,
    point: int,
    tag: str = "t",
    folder: str = "",
    fail: int = -1,
    exit_at: int = -1,
    exit_with: str = "sys.exit",
    kinds: bool = False,
    pad_kib: int = 0,
    clash: str = "",
    row_status: str = "",
    unheld: str = "",
) -> list[dict]:
    """What users' experiments do wrong, one knob each: point `fail` raises (until the file
    "fixed" is in `folder`); point `exit_at` ends the process (exit_with: sys.exit or os._exit,
    with code 0, or SIGSEGV); with `kinds`, the column `val` is an int in point 0 and a str
    elsewhere; each row carries `pad_kib` KiB of random text, and a column named `clash` where
    it names one (a harness's column, a parameter), and the status `row_status` where it gives
    one; `unheld` gives point 1's val what a Parquet column cannot hold (UNHELD). One row: the
    tag it saw, and val (two with unheld=mixed)."""
    if point == fail and not (Path(folder) / "fixed").exists():
        raise RuntimeError(f"point {point} fails until {folder}/fixed exists")
    if point == exit_at and exit_with == "SIGSEGV":  # as a crash in a kernel would end it
        os.kill(os.getpid(), signal.SIGSEGV)
    if point == exit_at:
        sys.exit(0) if exit_with == "sys.exit" else os._exit(0)
    val = point if point == 0 or not kinds else f"text-{point}"
    pad = base64.b64encode(os.urandom(768 * pad_kib)).decode()  # what compression cannot shrink
    said = {**({clash: 1} if clash else {}), **({"status": row_status} if row_status else {})}
    row = {"tag_seen": tag, "val": val, "pad": pad, **said}
    if unheld and point == 1:
        return [{**row, "val": value} for value in UNHELD[unheld]]
    return [row]


UNHELD = {  # faulty's unheld: the values of val in point 1's rows
    "bigint": [2**70], "tensor": [torch.tensor(1.5)], "mixed": [1, "n/a"], "list": [[1, "a"]],
}  # fmt: skip


class BrokenSink:
    """A sink (harness.running.sinks) that fails at its second write, as a full disk or a dead
    server would make one fail."""

    def __init__(self):
        self.writes = 0

    def open(self, point, continues_after) -> None:
        pass

    def write(self, rows: list[dict]) -> None:
        self.writes += 1
        if self.writes == 2:
            raise ConnectionError("the sink's server went away")

    def close(self) -> None:
        pass


def scripted(*, side: str, folder: str) -> list[dict]:
    """A timing whose value is a script's: the next of FOLDER/SIDE.json's "values" (its "next"
    says which), one a process, so that a test knows what each process of a gate measures."""
    path = Path(folder) / f"{side}.json"
    script = json.loads(path.read_text())
    value = script["values"][script["next"]]
    path.write_text(json.dumps({**script, "next": script["next"] + 1}))
    return [{"time_ms": float(value)}]


def pair(*, slower: float = 1.0, products: int = 20, width: int = 128,
         min_time_s: float = 0.2) -> list[dict]:  # fmt: skip
    """Two timings in a row, prefixed as docs/own-experiments.md says: `first` and `second`,
    each `products` products of width x width matrices a call, on one thread; `slower` is a
    knob that multiplies second's work alone (slower=1.25: 25 products for 20), a known
    slowdown for the gate's calibration (tests/benchmarks/gate_calibration.py)."""
    from harness.measuring.timing import time_call

    torch.set_num_threads(1)
    a = torch.randn(width, width, generator=torch.Generator().manual_seed(0))

    def call(count: int):
        def products_of_a():
            for _ in range(count):
                a @ a

        return products_of_a

    row = {}
    for prefix, count in (("first", products), ("second", round(products * slower))):
        timed = time_call(call(count), min_time_s=min_time_s)
        row |= {f"{prefix}_{name}": value for name, value in timed.items()}
    return [row]


def tuned(
    *,
    lr: float,
    variant: str = "a",
    steps: int = 20,
    folder: str = "",
    hold_at: int = 0,
    checkpoint_every: int = 2,
    timeout_s: float = 120.0,
    tracker=None,
) -> list[dict]:
    """A search's probe: a training run without a model whose score peaks at lr = 1e-2 (variant
    b: 1e-3): 1 - (log10 lr - log10 best)^2, reached linearly over the steps (phase "train",
    a row each), then one held-out row (phase "eval"). A run that restored nothing holds after
    step `hold_at` (0: never) until the file "release" exists in `folder` ("held-PID" there
    meanwhile); it checkpoints every `checkpoint_every` steps."""
    best = {"a": -2.0, "b": -3.0}[variant]
    score = 1.0 - (math.log10(lr) - best) ** 2
    state = tracker.restore() if tracker is not None else None
    rows = []
    for step in range((state["step"] if state else 0) + 1, steps + 1):
        row = {"phase": "train", "step": step, "score": score * step / steps, "pid": os.getpid()}
        tracker.log(row) if tracker is not None else rows.append(row)
        if step == hold_at and state is None:
            hold(folder, step, timeout_s, (Path(folder) / "release").exists)
        if tracker is not None and step % checkpoint_every == 0:
            tracker.save({"step": step})
    return [*rows, {"phase": "eval", "step": steps, "score": score, "pid": os.getpid()}]


def check_tuned(lr: float) -> None:
    if not lr > 0:
        raise ValueError(f"lr must be above 0, got {lr}")


def columns_as_parameters(*, point: int = 0, Status: str = "ok") -> list[dict]:  # noqa: N803
    """A parameter named as the harness's status column (compared without case): refused at
    planning, before anything runs."""
    return [{"value": point}]
