"""resume=SWEEP_ID: the sweep's points without an answer, under the config they first ran with."""

import tempfile
from pathlib import Path

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig

from harness import store
from harness.config import SET_BY_HARNESS, compose_config, key_of, results_root
from harness.experiment import BadInput, Experiment, config_hash, config_values
from harness.plan import Point, Sweep, sweep_of
from harness.status import still_scheduled

RESUME_SETTINGS = ("out", "resume", "wait")  # what a resume may set besides Hydra's settings


def resumed(
    overrides: list[Override], experiment: str, sweep_id: str, config_dirs: list[Path]
) -> tuple[Sweep, DictConfig]:
    """The sweep to resume, with its points that have no answer yet, and its config.

    The config is composed from the sweep's own overrides, its launcher settings unless the
    command line names a launcher, and the command line's settings (out, wait, Hydra's, and
    the experiment's `resources`: parameters such as memory_cap_mib that change how a point
    runs, not what it computes), so each job recomposes what it first ran, with more room if
    asked; users' experiments come from the command line's --config-dir. Points that SLURM
    still queues or runs are left to it.
    """
    results = results_root(overrides)
    manifest = store.read_manifest(results, experiment, sweep_id)
    if manifest is None:
        folder = store.sweep_dir(results, experiment, sweep_id)
        if folder.is_dir():
            raise BadInput(f"{folder / store.MANIFEST} is missing or unreadable: cannot resume")
        known = ", ".join(store.sweeps(results, experiment)[-3:]) or "none yet"
        raise BadInput(f"no sweep {sweep_id} of {experiment} in {results} (latest: {known})")
    _check_writable(store.sweep_dir(results, experiment, sweep_id))
    resources = manifest.get("experiment_config", {}).get("resources") or []
    allowed = (*RESUME_SETTINGS, *resources)
    settings = [
        o.input_line for o in overrides if o.is_hydra_override() or key_of(o.input_line) in allowed
    ]
    extra = [o.input_line for o in overrides if o.input_line not in settings]
    extra = [line for line in extra if key_of(line) != "experiment"]
    if extra:
        may = ", ".join(["out", "wait", "hydra.*", *resources])
        raise BadInput(
            f"resume={sweep_id} reruns that sweep's own points; drop {' '.join(extra)} "
            f"(a resume may set {may})"
        )
    replaced = {key_of(line) for line in settings} | {*SET_BY_HARNESS, "hydra.searchpath"}
    original = [line for line in manifest["overrides"] if key_of(line) not in replaced]
    launcher = manifest.get("hydra_overrides", [])
    if any(key_of(line) == "hydra/launcher" for line in settings):  # another launcher: its own
        launcher = []
    launcher = [line for line in launcher if key_of(line) not in replaced]
    cfg = compose_config(
        [*original, *launcher, *settings, f"sweep_id={sweep_id}"], experiment, config_dirs
    )
    values = config_values(cfg)
    experiment_ = Experiment.load(values["experiment"])
    sweep = sweep_of(cfg, experiment_, [])
    sweep.command = manifest.get("command")
    scheduled = set(still_scheduled(manifest))
    if scheduled:
        print(f"{len(scheduled)} points are still queued or running on SLURM: left to it")
    changed = {key: values[key] for key in resources if _key_given(key, settings)}
    sweep.points = [
        Point(p.job, p.overrides, experiment_.params({**p.params, **changed}))
        for p in _unfinished(sweep, manifest)
        if p.job not in scheduled
    ]
    if changed:  # the manifest says what each point runs with, so its rerun's rows match it
        rerun = {p.job: p.params for p in sweep.points}
        for point in manifest["points"]:
            if point["job"] in rerun:
                point["params"] = rerun[point["job"]]
                point["config_hash"] = config_hash(experiment, rerun[point["job"]])
        store.write_manifest(results, manifest)
    return sweep, cfg


def _key_given(key: str, lines: list[str]) -> bool:
    return any(key_of(line) == key for line in lines)


def _check_writable(folder: Path) -> None:
    """One line (bad input) unless a file can be written in `folder`."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise BadInput(f"cannot write to {folder}: {error.strerror or error}") from None


def _unfinished(sweep: Sweep, manifest: dict) -> list[Point]:
    """The manifest's points without an answer yet (store.DONE: ok, unsupported).

    Their rows in a compacted file move back into job files of their own, which their reruns
    replace, so that the folder as it lies holds each row once after the resume too; the files
    the read skipped as damaged (their points count as not run) are moved aside.
    """
    rows = store.read(sweep.results, sweep.experiment.name, sweep.id)
    statuses = store.job_statuses(store.as_planned(rows, manifest, sweep.results))
    for moved in store.set_aside(sweep.results, sweep.experiment.name, sweep.id):
        print(f"moved a damaged file aside: {moved}")
    done = set(statuses[statuses.isin(store.DONE)].index)
    points = [
        Point(p["job"], p["overrides"], p["params"])
        for p in manifest["points"]
        if p["job"] not in done
    ]
    store.release(sweep.results, sweep.experiment.name, sweep.id, [p.job for p in points])
    return points
