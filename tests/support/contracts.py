"""The contracts every launcher and every sink keeps, as checks that the tests run on each one
the configs name (the registries: hydra/launcher/*.yaml and sinks/*.yaml, the project's and the
probes' config dirs), so that a new launcher or sink is tested by adding its YAML."""

import os
import signal
import time
from pathlib import Path

import yaml
from hydra.utils import get_class
from probes import PROBE_PATH, arrivals, await_arrivals

from harness import store
from harness.names import CONF

SUPPORT_CONF = Path(__file__).resolve().parent / "conf"


def launchers(*, detached: bool) -> list[str]:
    """The launchers the configs name, by hydra/launcher option ("basic": Hydra's own default,
    which the harness runs as a loop here), those whose jobs run on without this process
    (detached: SLURM's, tested against the test cluster) or the others."""
    found = {"basic": False}
    for folder in (CONF, SUPPORT_CONF):
        for path in sorted((folder / "hydra" / "launcher").glob("*.yaml")):
            target = yaml.safe_load(path.read_text())["_target_"]
            found[path.stem] = getattr(get_class(target), "detached", False)
    return [name for name, runs_on in found.items() if runs_on == detached]


def sinks() -> list[str]:
    """The sinks the project's configs offer (conf/sinks/*.yaml)."""
    return sorted(path.stem for path in (CONF / "sinks").glob("*.yaml"))


def points_run_once_and_a_failure_is_a_row(probe, gate, settings: list[str], env=None) -> None:
    """A grid's points each run once and land one ok row; a point that raises is a failed row
    with its error, the others still run, and a resume runs it alone, once it can pass. env:
    the environment the commands take beside the probes' path."""
    env = {"PYTHONPATH": PROBE_PATH, **(env or {})}
    ran = probe("point=0,1,2,3", f"folder={gate}", *settings, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    rows = store.read(probe.results, "rendezvous").sort_values("job")
    assert rows["job"].tolist() == [0, 1, 2, 3] and set(rows["status"]) == {"ok"}
    assert sorted(path.name.split("-")[1] for path in arrivals(gate)) == ["0", "1", "2", "3"]
    faulty = ["--config-dir", str(SUPPORT_CONF), "+experiment=faulty", f"folder={gate}"]
    first = probe.harness(*faulty, "fail=1", *settings, env=env)
    assert first.returncode == 1 and "1 of 3 points have no answer" in first.stderr, first
    assert "Traceback" not in first.stdout + first.stderr
    (sweep,) = store.sweeps(probe.results, "faulty")
    rows = store.read(probe.results, "faulty").set_index("job").sort_index()
    assert rows["status"].tolist() == ["ok", "failed", "ok"]
    assert rows.loc[1, "error"].startswith("RuntimeError: point 1 fails until")
    assert "| failed" in probe.harness("status", sweep, env=env).stdout
    (gate / "fixed").touch()
    resumed = probe.harness("--config-dir", str(SUPPORT_CONF), f"resume={sweep}", env=env)
    assert resumed.returncode == 0 and "1 points to run" in resumed.stdout, resumed.stderr
    rows = store.read(probe.results, "faulty").sort_values("job")
    assert rows["job"].tolist() == [0, 1, 2] and set(rows["status"]) == {"ok"}


def ctrl_c_ends_the_points_and_resume_finishes_them(probe, gate, settings: list[str]) -> None:
    """Ctrl-C while points run: the harness exits 130 with the resume command and no
    traceback, no point's process outlives it, and the resume runs each point left once."""
    sweeping = probe.start("point=0,1,2,3", f"folder={gate}", "release=open", *settings)
    await_arrivals(gate, 1)
    os.killpg(sweeping.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
    output, _ = sweeping.communicate(timeout=120)
    assert sweeping.returncode == 130, output
    assert "Traceback" not in output and "interrupted; finish it with:" in output, output
    processes = [Path(f"/proc/{path.name.rsplit('-', 1)[1]}") for path in arrivals(gate)]
    deadline = time.monotonic() + 60
    while any(p.exists() for p in processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.exists() for p in processes), "a point outlived its sweep"
    (gate / "open").touch()
    (sweep,) = store.sweeps(probe.results, "rendezvous")
    resumed = probe(f"resume={sweep}")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = store.read(probe.results, "rendezvous").sort_values("job")
    assert rows["job"].tolist() == [0, 1, 2, 3] and set(rows["status"]) == {"ok"}
