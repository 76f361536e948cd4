"""resume=SWEEP_ID: the sweep's points without an answer, under the config they first ran with."""

import json
import re
import tempfile
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig

from harness import files, store
from harness.command.status import still_scheduled
from harness.errors import BadInput
from harness.names import (
    RESUME_SETTINGS,
    SET_BY_HARNESS,
    available_experiments,
    check_name,
    key_of,
)
from harness.pinning import codestore
from harness.planning.checks import check_code
from harness.planning.config import command, compose_config, results_root
from harness.planning.experiment import Experiment, config_values, hasher, keyed_config
from harness.planning.plan import Point, Sweep, reuse_setting, sweep_of
from harness.searching import search


def resumed(
    overrides: list[Override], sweep_id: str, config_dirs: list[Path], hold: ExitStack
) -> tuple[Sweep, DictConfig]:
    """The sweep to resume, with its points that have no answer yet, and its config; `hold`
    keeps the sweep claimed for this command (store.claim) until it closes.

    The experiment is the sweep's own (+experiment, if given, must name it). The config is
    composed from the sweep's own overrides, its launcher settings unless the command line
    names a launcher, and the command line's settings (out, wait, Hydra's, and the
    experiment's `resources`: parameters such as memory_cap_mib that change how a point runs,
    not what it computes); each point then runs the values its sweep planned (the manifest's),
    whatever the experiment's YAML says now, with more room if asked. Users' experiments come
    from the command line's --config-dir. Points that SLURM still queues or runs are left to it.
    """
    results = results_root(overrides)
    given = next((str(o.value()) for o in overrides if key_of(o.input_line) == "experiment"), None)
    sweep_id = store.named_sweep(results, check_name("sweep id", sweep_id), given)
    paths = _sweep_to_resume(results, sweep_id, given)
    experiment = paths.experiment
    _check_writable(paths.folder)
    try:  # before the manifest is read: what it says now is what this command goes on
        hold.enter_context(store.claim(paths))
    except (store.Claimed, files.Linked) as taken:
        raise BadInput(str(taken)) from None
    manifest = _manifest_to_resume(paths)
    _check_config_dirs(manifest, paths, config_dirs)
    resources = manifest.get("experiment_config", {}).get("resources") or []
    settings = _settings(overrides, sweep_id, resources)
    # The code store and code are this command's own: a manifest names no folder to run from.
    replaced = {key_of(line) for line in settings} | {*SET_BY_HARNESS, "hydra.searchpath",
                                                      "code_store", "code"}  # fmt: skip
    original = [line for line in manifest["overrides"] if key_of(line) not in replaced]
    launcher = manifest.get("hydra_overrides", [])
    if any(key_of(line) == "hydra/launcher" for line in settings):  # another launcher: its own
        launcher = []
    launcher = [line for line in launcher if key_of(line) not in replaced]
    _check_recorded(sweep_id, [*original, *launcher])
    cfg = compose_config(
        [*original, *launcher, *settings, f"sweep_id={sweep_id}"], experiment, config_dirs
    )
    values = config_values(cfg)
    code_store, digest = _code(manifest, values, sweep_id, config_dirs)
    experiment_ = Experiment.load(values["experiment"])  # from the code's snapshot
    _check_planned_config(manifest, keyed_config(values, experiment_.parameters), sweep_id)
    searched = search.of_manifest(manifest)
    if searched:  # the sweep's own search, as planned
        search.check_launcher(cfg.hydra.launcher)
        experiment_ = replace(experiment_, config={**experiment_.config, "search": searched})
    sweep = sweep_of(cfg, experiment_, [])
    sweep.command, sweep.config_dirs = manifest.get("command"), config_dirs
    sweep.code, sweep.code_store = digest, code_store
    sweep.reuse = reuse_setting(cfg, experiment_, config_dirs)
    if manifest.get("reuse") != sweep.reuse:  # what a job reading its plan from it takes
        manifest["reuse"] = sweep.reuse
        store.write_manifest(results, manifest)
    scheduled = set(still_scheduled(manifest))
    if scheduled:
        print(f"{len(scheduled)} points are still queued or running on SLURM: left to it")
    changed = {key: values[key] for key in resources if _key_given(key, settings)}
    sweep.points = _unfinished(sweep, manifest, scheduled, values)
    if searched:  # no point takes back a trial a kill left running without its job
        for line in search.fail_orphans(paths.folder, {p.job for p in sweep.points} | scheduled):
            print(line)
    if changed:  # the manifest says what each point runs with, so its rerun's rows match it
        _rerun_with(changed, sweep, experiment_, manifest, values)
    return sweep, cfg


def _code(manifest: dict, values: dict, sweep_id: str, config_dirs: list[Path]) -> tuple:
    """The code the resumed points run, imported from its snapshot from now on: the sweep's own
    (its manifest's code_digest, from this command's code store, never a folder the manifest
    names), or with code=current this tree's, pinned now."""
    choice, pinned = values.get("code"), manifest.get("code_digest")
    check_code(choice, " (the sweep's own)")
    if choice is None and not isinstance(pinned, str):
        raise BadInput(f"sweep {sweep_id}'s manifest names no code (code_digest): resume it with "
                       "code=current to run this tree's")  # fmt: skip
    code_store = codestore.store_of(values.get("code_store"))
    if choice is None:  # an edit made to fix what failed would not run: say so
        try:
            now = codestore.collect(values["experiment"], values["out"], code_store,
                                    config_dirs).digest  # fmt: skip
        except BadInput:  # this tree cannot be read as code: the sweep's own runs all the same
            now = pinned
        if now != pinned:
            print(
                f"note: the code has changed since sweep {sweep_id} pinned it: its points run "
                f"the sweep's own code {pinned}; code=current runs the code as it is now"
            )
    if choice == "current":
        digest = codestore.pin(values["experiment"], values["out"], code_store, config_dirs)
        if digest != pinned:
            had = f"the sweep's was {pinned}" if pinned else "its manifest named none"
            print(f"its points run this tree's code {digest} ({had}); their rows say so")
        pinned = digest
    codestore.enter(code_store, pinned)
    return code_store, pinned


def _check_planned_config(manifest: dict, now: dict, sweep_id: str) -> None:
    """BadInput (one line) where a key that decides the points' answers (keyed_config: the
    seed, the run target, ...) has another value in the config now than the sweep planned (its
    experiment's YAML edited since): its points' rows would be of another config than its
    planned points' config_hash."""
    planned = manifest.get("keyed_config")
    if not isinstance(planned, dict):
        return
    flat_now, flat_planned = _flat(now), _flat(planned)
    differ = sorted(key for key in {*flat_now, *flat_planned}
                    if _text(flat_now.get(key)) != _text(flat_planned.get(key)))  # fmt: skip
    if differ:
        key = differ[0]
        raise BadInput(
            f"{key} is {flat_now.get(key)!r} in the config now, where sweep {sweep_id} planned "
            f"{flat_planned.get(key)!r}: a resume runs the sweep as it was planned; set it back "
            "(the experiment's YAML), or run a new sweep"
        )


def _flat(node: dict, above: str = "") -> dict:
    found = {}
    for key, value in node.items():
        if isinstance(value, dict):
            found |= _flat(value, f"{above}{key}.")
        else:
            found[f"{above}{key}"] = value
    return found


def _text(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _settings(overrides: list[Override], sweep_id: str, resources: list[str]) -> list[str]:
    """The command line's overrides a resume takes (RESUME_SETTINGS, Hydra's, the experiment's
    resources), resume= last, with the sweep's id; BadInput of one line naming any other."""
    allowed = (*RESUME_SETTINGS, *resources)
    settings = [
        f"resume={sweep_id}" if key_of(o.input_line) == "resume" else o.input_line  # last: its id
        for o in overrides
        if _a_setting(o, allowed)
    ]
    extra = [o.input_line for o in overrides if not _a_setting(o, (*allowed, "experiment"))]
    if extra:
        may = ", ".join([*(k for k in RESUME_SETTINGS if k != "resume"), "hydra.*", *resources])
        raise BadInput(
            f"resume={sweep_id} reruns that sweep's own points; drop {' '.join(extra)} "
            f"(a resume may set {may})"
        )
    return settings


def _rerun_with(changed: dict, sweep: Sweep, experiment: Experiment, manifest: dict,
                values: dict) -> None:  # fmt: skip
    """The points to rerun with the resources changed on the command line, and the manifest
    rewritten to say so."""
    config_hash = hasher(experiment.name, values)
    for point in sweep.points:
        point.params = experiment.params({**point.params, **changed})
        if point.cell is None:  # a trial's digest is its cell's and slot's
            point.config_hash = config_hash(point.params)
    rerun = {point.job: point for point in sweep.points}
    for entry in manifest["points"]:
        if entry["job"] in rerun:
            entry.update(rerun[entry["job"]].planned())
    store.write_manifest(sweep.results, manifest)


def _a_setting(override: Override, allowed: tuple[str, ...]) -> bool:
    """Whether a resume takes the override: Hydra's own, or a key of `allowed`."""
    return override.is_hydra_override() or key_of(override.input_line) in allowed


def _sweep_to_resume(results: Path, sweep_id: str, given: str | None) -> store.SweepPaths:
    """Where the sweep lies, its experiment found from the sweep itself; one line when there is
    no such sweep, or it is another experiment's than +experiment (`given`) names."""
    experiment = store.experiment_of(results, sweep_id)
    if experiment is None:
        known = ", ".join(store.sweeps(results, given)[-3:]) if given else ""
        said = f" (latest of {given}: {known or 'none yet'})" if given else ""
        raise BadInput(f"no sweep {sweep_id} in {results}{said}")
    if given is not None and given != experiment:
        raise BadInput(
            f"sweep {sweep_id} is {experiment}'s, not {given}'s: resume it with "
            f"+experiment={experiment}, or with resume={sweep_id} alone"
        )
    return store.SweepPaths(results, experiment, sweep_id)


def _manifest_to_resume(sweep: store.SweepPaths) -> dict:
    """The sweep's manifest; one line when it is missing or cannot be read."""
    manifest = store.read_manifest(sweep)
    if manifest is None:
        raise BadInput(f"{sweep.manifest} is missing or unreadable: cannot resume")
    return manifest


def _check_config_dirs(manifest: dict, sweep: store.SweepPaths, config_dirs: list[Path]) -> None:
    """One line with the command that works when the sweep's experiment is one of a
    --config-dir that this command line does not give (the manifest says which it was run
    with; the harness does not import code from a folder because a manifest names it)."""
    experiment, sweep_id = sweep.experiment, sweep.sweep
    if experiment in available_experiments(config_dirs):
        return
    recorded = [Path(folder) for folder in manifest.get("config_dirs") or []]
    if not recorded:
        raise BadInput(f"sweep {sweep_id} is of experiment {experiment}, which is not here")
    shown = command([f"resume={sweep_id}"], recorded, sweep.root.parent)
    raise BadInput(
        f"sweep {sweep_id} is of {experiment}, an experiment of --config-dir "
        f"{' '.join(map(str, recorded))}; resume it with: {shown}"
    )


# What a resume never takes from a manifest, which anyone who can write to outputs/ can edit:
# a key that names code to import or run (a _target_, the experiment's run, check or report, a
# callback, a job's environment, a SLURM task's setup lines). Given on the command line, a
# resume takes them.
CODE_KEYS = re.compile(r"(^|\.)_|^experiment\.|^hydra\.(callbacks|job\.env_set|launcher\.setup)")


def _check_recorded(sweep_id: str, lines: list[str]) -> None:
    """One line if the sweep's manifest carries an override that could run code (CODE_KEYS)."""
    named = [line for line in lines if not isinstance(line, str) or CODE_KEYS.search(key_of(line))]
    if named:
        raise BadInput(
            f"the manifest of sweep {sweep_id} carries {str(named[0])[:120]!r}, which names code "
            "to run: a resume takes that only from its own command line"
        )


def _key_given(key: str, lines: list[str]) -> bool:
    return any(key_of(line) == key for line in lines)


def _check_writable(folder: Path) -> None:
    """One line (bad input) unless a file can be written in `folder`."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise BadInput(f"cannot write to {folder}: {error.strerror or error}") from None


def _unfinished(sweep: Sweep, manifest: dict, scheduled: set[int], values: dict) -> list[Point]:
    """The manifest's points without an answer yet (store.DONE: ok, unsupported) that SLURM
    does not still queue or run (`scheduled`).

    Their rows in a compacted file move back into job files of their own, which their reruns
    replace, so that the folder as it lies holds each row once after the resume too; the files
    the read skipped as damaged (their points count as not run) are moved aside, and the
    temporary files of their killed runs (and any older than an hour) removed.
    """
    rows = store.read(sweep.results, sweep.experiment.name, sweep.id)
    statuses = store.job_statuses(store.as_planned(rows, manifest, sweep.results))
    for moved in store.set_aside(sweep.paths):
        print(f"moved a damaged file aside: {moved}")
    done = set(statuses[statuses.isin(store.DONE)].index)
    config_hash = hasher(sweep.experiment.name, values)
    points = [
        Point(p["job"], p.get("overrides", []), p["params"],
              p.get("config_hash") or config_hash(p["params"]), p.get("cell"), p.get("slot"))
        for p in manifest["points"]
        if p["job"] not in done and p["job"] not in scheduled
    ]  # fmt: skip
    names = [sweep.paths.job(p.job).file.name for p in points]
    files.remove_temporaries(sweep.paths.folder, files.STALE_S, of=names)  # their killed runs'
    store.release(sweep.paths, [p.job for p in points])
    return points
