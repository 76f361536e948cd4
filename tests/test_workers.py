"""The local launcher's warm workers (harness/launchers/workers.py): points run one after another
in a process that stays, each from the same state whatever ran before it; a worker that dies
fails only its point, and a new one takes its place; fresh=true, or a worker grown past
worker_rss_mib, gives points processes of their own."""

import functools
import logging
import os
import random
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy
import pytest
import torch
from probes import PROBE_PATH, SUPPORT, UNSETTLE, _seen_state, arrivals, await_arrivals

from harness import store
from harness.launchers import warm
from harness.launchers.fresh import ProcessState

ROOT = Path(__file__).resolve().parents[1]
ONE_WORKER = ["hydra/launcher=local", "hydra.launcher.max_parallel=1"]
SEEN = ["torch_threads", "dtype", "grad", "autocast", "draw", "env", "cwd", "path", "handlers",
        "value"]  # fmt: skip
STATE = list(_seen_state())  # what the unsettling probe sees, a column each


@pytest.fixture
def leaky(harness, gate):
    """The leaky probe (tests/support/probes.py) with the probes' config dir: run or start."""
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=leaky", f"folder={gate}"]

    def run(*args: str, env: dict | None = None):
        return harness(*given, *args, env={"PYTHONPATH": PROBE_PATH, **(env or {})})

    def start(*args: str, env: dict | None = None):
        return harness.start(*given, *args, env={"PYTHONPATH": PROBE_PATH, **(env or {})})

    run.start, run.results = start, harness.results
    return run


def pids(gate) -> list[str]:
    """The process each point ran in, by point (the arrival files' last part)."""
    ordered = sorted(arrivals(gate), key=lambda path: int(path.name.split("-")[1]))
    return [path.name.rsplit("-", 1)[1] for path in ordered]


@pytest.mark.process
def test_each_point_on_a_warm_worker_starts_from_the_same_state(leaky, gate):
    """Four points on one worker, each leaving its state changed (threads, dtype, grad mode,
    RNG, environment, directory, sys.path, a log handler): each saw what the first saw, in the
    one process. Its module's own list is kept, as in one process (fresh=true for that)."""
    result = leaky("point=0,1,2,3", *ONE_WORKER)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = store.read(leaky.results).sort_values("job")
    assert set(rows["status"]) == {"ok"} and len(rows) == 4
    first = rows[SEEN].iloc[0].to_dict()
    assert all(rows[SEEN].iloc[i].to_dict() == first for i in range(4)), rows[SEEN]
    assert first["env"] == "" and first["grad"] and not first["autocast"]
    assert rows["leaked"].tolist() == [0, 1, 2, 3], "an unchanged module is kept, with its state"
    assert first["dtype"] == "torch.float32"
    assert len(set(pids(gate))) == 1, "one warm worker ran them all"


@pytest.mark.process
def test_rows_do_not_depend_on_the_order_in_which_points_reach_a_worker(harness, gate):
    """One point for each thing a point may leave changed in its process (tests/support/probes.py
    UNSETTLE), on one worker, in one order and then in the other: every point saw the state the
    first saw. What a worker cannot put back (a patched library function, a thread still
    running) makes it give its slot to a new worker, and its log says why."""
    kinds = list(UNSETTLE)
    given = ["--config-dir", str(SUPPORT / "conf"), "+experiment=unsettling", f"folder={gate}",
             *ONE_WORKER, "reuse=false"]  # fmt: skip
    seen = {}
    for order in (kinds, kinds[::-1]):
        result = harness(*given, f"change={','.join(order)}", env={"PYTHONPATH": PROBE_PATH})
        assert result.returncode == 0, result.stdout + result.stderr
        sweep = store.newest_sweep(harness.results, "unsettling")
        rows = store.read(harness.results, "unsettling", sweep)
        assert set(rows["status"]) == {"ok"}, rows[["change", "status", "error"]]
        seen[order[0]] = rows.set_index("change")[STATE].sort_index()
    forward, backward = seen.values()
    baseline = forward.loc["nothing"]
    assert baseline["default_device"] == "cpu" and baseline["matmul_name"] == "matmul"
    differing = {(kind, column) for frame in (forward, backward) for kind in kinds
                 for column in STATE if frame.loc[kind, column] != baseline[column]}  # fmt: skip
    assert not differing, f"points saw another point's leftovers: {sorted(differing)}"
    logs = "".join(p.read_text() for p in harness.cwd.glob("outputs/runs/**/workers.log"))
    assert "torch.matmul" in logs and "left-running" in logs, logs


@pytest.mark.process
def test_a_module_outside_the_pinned_code_edited_during_a_sweep_is_read_anew(leaky, gate, tmp_path):
    """A module imported by name from outside the experiment's folder (so outside the sweep's
    pinned code) is read anew once edited, as a new process would: point 0 reads VALUE 1 and
    holds; the file is edited; point 1, on the same worker, reads the new VALUE. (The
    experiment's own folder is pinned: tests/test_code.py.)"""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "edited_module.py").write_text("VALUE = 1\n")
    env = {"PYTHONPATH": os.pathsep.join([PROBE_PATH, str(folder)])}
    sweeping = leaky.start("point=0,1", "module=edited_module", "hold=0", *ONE_WORKER, env=env)
    await_arrivals(gate, 1)
    (folder / "edited_module.py").write_text("VALUE = 22  # edited\n")
    (gate / "release").touch()
    output, _ = sweeping.communicate(timeout=120)
    assert sweeping.returncode == 0, output
    rows = store.read(leaky.results).sort_values("job")
    assert rows["value"].tolist() == [1, 22]
    assert len(set(pids(gate))) == 1


@pytest.mark.process
def test_a_worker_that_crashes_fails_its_point_alone_and_a_new_one_runs_the_rest(probe, gate):
    """A segfault in point 1 (as a kernel's would be) ends its worker: point 1 is a killed row
    saying so, and points 2 and 3 run on the new worker of that slot."""
    faulty = ["--config-dir", str(SUPPORT / "conf"), "+experiment=faulty", f"folder={gate}"]
    result = probe.harness(*faulty, "point=0,1,2,3", "exit_at=1", "exit_with=SIGSEGV",
                           *ONE_WORKER, env={"PYTHONPATH": PROBE_PATH})  # fmt: skip
    assert result.returncode == 1 and "1 of 4 points have no answer" in result.stderr
    rows = store.read(probe.results).set_index("job").sort_index()
    assert rows["status"].tolist() == ["ok", "killed", "ok", "ok"]
    assert rows.loc[1, "error"] == "its worker process was killed by SIGSEGV"


@pytest.mark.process
@pytest.mark.parametrize(
    "setting, processes",
    [
        ([], 1),
        (["hydra.launcher.fresh=true"], 2),
        (["++experiment.fresh=true"], 2),  # as an experiment's own config may say
        (["hydra.launcher.worker_rss_mib=1"], 2),
    ],
    ids=["warm", "fresh", "experiment-fresh", "past-its-rss"],
)
def test_fresh_and_a_grown_worker_give_points_processes_of_their_own(
    probe, gate, setting, processes
):
    """Two points on one slot: one warm worker runs both, unless each point is to have a
    process of its own (fresh) or the worker grew past its limit after the first."""
    result = probe("point=0,1", f"folder={gate}", *ONE_WORKER, *setting)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(set(pids(gate))) == processes


def test_a_process_state_restores_what_a_unit_of_work_changed(tmp_path, monkeypatch):
    """harness.launchers.fresh in this process: what a point may change, changed, and put back."""
    monkeypatch.setenv("KEPT", "yes")
    before = ProcessState()
    threads, draws = torch.get_num_threads(), (random.random(), torch.rand(1))
    random.setstate(before.random)
    torch.random.set_rng_state(before.torch[-1])
    os.environ["LEAKY"] = "x"
    del os.environ["KEPT"]
    os.chdir(tmp_path)
    sys.path.append(str(tmp_path))
    (tmp_path / "snapshot_probe.py").write_text("VALUE = 1\n")
    __import__("snapshot_probe")
    handler = logging.NullHandler()
    logging.getLogger("harness.test").addHandler(handler)
    torch.set_num_threads(threads + 1)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    before.restore()
    assert "LEAKY" not in os.environ and os.environ["KEPT"] == "yes"
    assert os.getcwd() == before.cwd and str(tmp_path) not in sys.path
    assert "snapshot_probe" not in sys.modules
    assert handler not in logging.getLogger("harness.test").handlers
    assert torch.get_num_threads() == threads and torch.get_default_dtype() == torch.float32
    assert torch.is_grad_enabled()
    assert (random.random(), torch.rand(1)) == draws, "the random states as they were"


def test_a_process_state_names_what_it_cannot_put_back(monkeypatch):
    """Settings set back and so not named, nor a library's own wrapper of its own function; a
    replaced function (however it names itself), an added method and a thread still running,
    named."""
    before = ProcessState()
    torch.set_float32_matmul_precision("medium")
    numpy.seterr(all="raise")
    old = os.umask(0o077)
    warnings.filterwarnings("ignore", "a test's")
    before.restore()
    assert torch.get_float32_matmul_precision() == "highest" and os.umask(old) == old
    assert numpy.geterr()["divide"] == "warn" and before.left() == []
    # torch's own wrapper of its own function (what importing torch._dynamo does): not named
    monkeypatch.setattr(torch, "manual_seed", torch._disable_dynamo(torch.manual_seed))  # noqa: SLF001
    assert before.left() == []
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", functools.wraps(softmax)(lambda x: x))
    monkeypatch.setattr(torch.Tensor, "add", lambda *args: None, raising=False)
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="left-behind")
    thread.start()
    try:
        assert sorted(before.left()) == ["thread 'left-behind' still running",
                                         "torch.Tensor.add replaced",
                                         "torch.nn.functional.softmax replaced"]  # fmt: skip
    finally:
        release.set()
        thread.join()


def test_an_experiments_fresh_that_is_not_true_or_false_is_one_line(probe, gate):
    result = probe("point=0", f"folder={gate}", *ONE_WORKER, "++experiment.fresh=maybe")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "experiment.fresh must be true or false, got 'maybe'" in result.stderr
    assert not list(probe.results.glob("*/*/*.parquet")), "nothing ran"


@pytest.mark.parametrize(
    ("arguments", "wanted"),
    [
        (["+experiment=exp014_tiled", "hydra/launcher=local"], True),
        (["+experiment=x", "hydra/launcher=local", "hydra.launcher.max_parallel=4"], True),
        (["+experiment=x", "hydra/launcher=local", "hydra.launcher.fresh=true"], False),
        (["+experiment=x", "hydra/launcher=local", "hydra.launcher.fresh=false"], True),
        (["+experiment=x", "hydra/launcher=slurm"], False),
        (["+experiment=x", "hydra/launcher=local", "hydra/launcher=slurm"], False),
        (["+experiment=x"], False),
    ],
)
def test_the_command_line_starts_the_forkserver_only_for_warm_workers(arguments, wanted):
    assert warm.wanted(arguments) is wanted


@pytest.mark.process
def test_the_forkserver_holds_none_of_the_sweeps_output(tmp_path):
    """A reader of the sweep's output (a pipe) sees its end when the sweep's process ends, not
    when the forkserver has unloaded torch: the forkserver gets /dev/null for stdout and stderr,
    and the process that started it gets its own back."""
    code = (
        "import os, sys\n"
        "from multiprocessing import forkserver\n"
        "from harness.launchers import warm\n"
        "warm.warm_up()\n"
        "pid = forkserver._forkserver._forkserver_pid\n"
        "print(os.readlink(f'/proc/{pid}/fd/1'), os.readlink(f'/proc/{pid}/fd/2'))\n"
        "print('stderr still ours', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [os.devnull, os.devnull]
    assert "stderr still ours" in done.stderr
