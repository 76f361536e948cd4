"""harness.launchers.in_process: the config of each in-process job equals the one Hydra's
BasicLauncher composes for it (load_sweep_config, then the job's id and number), for every
experiment's seeded grid and for a config-group override; and its run folder holds what Hydra's
would."""

from pathlib import Path

import pytest
import yaml
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, open_dict

from harness.launchers.in_process import InProcess
from harness.names import CONF, available_experiments
from harness.planning.config import compose_config
from harness.planning.experiment import config_values
from harness.planning.plan import job_overrides, plan

SUPPORT = Path(__file__).resolve().parent / "support"  # the probe experiments
EXPERIMENTS = available_experiments()
SAMPLE = 7  # points per experiment, spread over its grid


def hydras_own(loader, master, overrides: list[str], job: int):
    """What BasicLauncher.launch composes for a job."""
    cfg = loader.load_sweep_config(master, overrides)
    with open_dict(cfg):
        cfg.hydra.job.id = cfg.hydra.job.num = job
    return OmegaConf.to_container(cfg)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_jobs_config_is_hydras_own(initialized, name, tmp_path):
    master = compose_config(
        [f"+experiment={name}", f"out={tmp_path}", "sweep_id=S", "seed=3"], name, []
    )
    sweep = plan(master, [])
    runner = InProcess(master, task_function=None)
    step = max(1, len(sweep.points) // SAMPLE)
    points = [*sweep.points, sweep.points[0]]  # back to the first: values reset
    for i, point in enumerate(points):
        overrides = job_overrides(sweep, point)
        shape = runner.prepare(overrides, point.job)
        assert runner.config_yaml(shape.values) == yaml.dump(shape.values, sort_keys=False)
        if i % step and i < len(points) - 1:
            continue  # its config is not asked for: the lines of several jobs wait to be set
        fast = OmegaConf.to_container(shape.cfg)
        assert fast == hydras_own(initialized, master, overrides, point.job), point.overrides
        assert shape.values == config_values(shape.cfg), "the values set without resolving"
        dirs = shape.cfg.hydra.sweep
        assert shape.run_dir() == (Path(str(dirs.dir)) / str(dirs.subdir)).absolute()
    assert len(runner.composed) == 1, "one composition for the whole grid"


def test_a_config_group_override_is_composed_by_hydra(tmp_path):
    with initialize_config_dir(config_dir=str(CONF), job_name="harness", version_base=None):
        loader = GlobalHydra.instance().config_loader()
        base = ["+experiment=sized", f"out={tmp_path}", "sweep_id=S"]
        master = compose_config(base, "sized", [SUPPORT / "conf"])
        runner = InProcess(master, task_function=None)
        jobs = [("size=large", "point=1"), ("size=small", "point=2"), ("size=large", "point=2")]
        for job, (size, point) in enumerate(jobs):
            overrides = [*base, size, point, f"job={job}"]
            fast = OmegaConf.to_container(runner.prepare(overrides, job).cfg)
            assert fast == hydras_own(loader, master, overrides, job)
            assert fast["width"] == (64 if size == "size=large" else 8)
        assert len(runner.composed) == 2, "one composition per choice of the group"


def test_an_added_key_is_composed_by_hydra_for_every_point(initialized, tmp_path):
    master = compose_config(["+experiment=exp014_tiled", "sweep_id=S"], "exp014_tiled", [])
    runner = InProcess(master, task_function=None)
    for job, note in enumerate(["a", "b"]):
        overrides = ["+experiment=exp014_tiled", "sweep_id=S", f"+note={note}", f"job={job}"]
        fast = OmegaConf.to_container(runner.prepare(overrides, job).cfg)
        assert fast == hydras_own(initialized, master, overrides, job) and fast["note"] == note


def test_an_in_process_job_leaves_its_config_overrides_and_log(harness):
    result = harness("+experiment=exp014_tiled", "length=32,48", "block=16")
    assert result.returncode == 0, result.stderr
    (sweep_runs,) = (harness.cwd / "outputs" / "runs" / "exp014_tiled").iterdir()
    for job, length in enumerate((32, 48)):
        folder = sweep_runs / f"job-{job}"
        assert (folder / "harness.log").is_file()
        config = OmegaConf.load(folder / ".hydra" / "config.yaml")
        assert (config.length, config.block, config.job) == (length, 16, job)
        overrides = OmegaConf.to_container(OmegaConf.load(folder / ".hydra" / "overrides.yaml"))
        assert f"length={length}" in overrides and f"job={job}" in overrides
    hydra = OmegaConf.load(sweep_runs / ".hydra" / "hydra.yaml")
    assert hydra.hydra.launcher._target_.endswith("BasicLauncher")


def test_a_failed_points_traceback_is_in_its_own_log(probe, gate):
    """The log follows the jobs: job 1's traceback in job 1's folder, none in job 0's or 2's."""
    result = probe("point=0,1,2", f"folder={gate}", "fail=1")
    assert result.returncode == 1
    (sweep_runs,) = (probe.cwd / "outputs" / "runs" / "rendezvous").iterdir()
    logs = [(sweep_runs / f"job-{job}" / "harness.log").read_text() for job in range(3)]
    assert "Traceback" in logs[1] and "point 1 fails, as asked" in logs[1]
    assert "Traceback" not in logs[0] + logs[2]
