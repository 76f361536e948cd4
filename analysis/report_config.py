"""Which sweep of an experiment the report judges (latest_sweep), and the config a sweep is
reported with: what its manifest recorded (its claims and table), with
the code that its experiment's own YAML names today (its tables' function, its report module).
A file in the store never decides which code the report imports: a manifest that names other
code is reported without it, and says so (untrusted_code). Nothing here imports what it names
but report_module."""

import copy
import functools
import importlib.util
from pathlib import Path

from harness import store
from harness.names import available_experiments, experiment_file
from harness.yaml_files import read_yaml

IMPORTED = {"derive": "tables", "report": "report module"}  # config keys that name code


def trusted_config(
    manifest: dict | None, experiment: str, config_dirs: list[Path], current_claims: bool = False
) -> dict:
    """The sweep's experiment config (its claims and table, as the manifest recorded them),
    with the tables' function and report module that the experiment's own config names
    (conf/experiment/, or a --config-dir's): code is never imported because a file in the store
    names it. current_claims: the claims the experiment's own config states today instead (the
    recorded ones where it has no config here)."""
    config = dict(manifest.get("experiment_config") or {}) if manifest else {}
    for key in IMPORTED:
        config.pop(key, None)
    own = own_config(experiment, config_dirs)
    if own is not None:
        config.update({key: str(own[key]) for key in IMPORTED if own.get(key)})
        if current_claims:
            config["claims"] = own.get("claims") or []
    return config


def own_config(experiment: str, config_dirs: list[Path]) -> dict | None:
    """The experiment node of the experiment's YAML as it is today (conf/experiment/ or a
    --config-dir's), read as YAML, nothing imported; None where there is none here."""
    if experiment not in available_experiments(config_dirs):
        return None
    path = experiment_file(experiment, config_dirs)
    return copy.deepcopy(_yaml_experiment(str(path), path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _yaml_experiment(path: str, version: int) -> dict:
    """A YAML file's experiment node as Hydra reads it (1e-5 a float, as in the manifest),
    read once for each version of the file (its mtime)."""
    return (read_yaml(Path(path)) or {}).get("experiment") or {}


def claims_changed(manifest: dict | None, experiment: str, config_dirs: list[Path]) -> bool:
    """Whether the claims a sweep recorded in its manifest differ from those its experiment's
    YAML states today (a claim since fixed, added or removed); False where either is unknown."""
    own = own_config(experiment, config_dirs)
    if manifest is None or own is None:
        return False
    recorded = (manifest.get("experiment_config") or {}).get("claims") or []
    today = own.get("claims") or []
    return recorded != today


def report_module(config: dict):
    """The experiment's own report module (config `report`), or None."""
    return importlib.import_module(config["report"]) if config.get("report") else None


def untrusted_code(manifest: dict | None, config: dict) -> list[str]:
    """A note for each piece of code the manifest names that the experiment's config does not."""
    recorded = (manifest or {}).get("experiment_config") or {}
    return [
        f"**Not loaded:** the {what} `{recorded[key]}` that the sweep's manifest names: the "
        "experiment's own config does not (give its --config-dir to load its own)."
        for key, what in IMPORTED.items()
        if recorded.get(key) and recorded[key] != config.get(key)
    ]


def module_file(module: str | None) -> Path | None:
    """The file a module is loaded from, without importing it; None where it cannot be found
    (the section says why)."""
    try:
        spec = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin else None


def latest_sweep(root: Path, experiment: str) -> tuple[str | None, list[str]]:
    """The newest sweep with rows (else the newest), and the newer ones with none landed yet,
    of those python -m harness again did not make (its reruns, whose manifests name their
    original as again_of: all of them where there is no other). A sweep folder that a kill left
    with nothing but an hour-old temporary file (a manifest cut short) is no sweep: it goes."""
    every = [store.SweepPaths(root, experiment, s) for s in store.sweeps(root, experiment)]
    kept = [paths for paths in every if not store.prune(paths)]
    originals = []
    for paths in reversed(kept):  # the newest first: the chosen one is near the end
        if not (store.read_manifest(paths) or {}).get("again_of"):
            originals.insert(0, paths.sweep)
            if store.result_files(root, experiment, paths.sweep):
                break
    sweeps = originals or [paths.sweep for paths in kept]
    landed = [sweep for sweep in sweeps if store.result_files(root, experiment, sweep)]
    chosen = landed[-1] if landed else (sweeps[-1] if sweeps else None)
    return chosen, sweeps[sweeps.index(chosen) + 1 :] if chosen else []
