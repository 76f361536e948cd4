"""One job of a sweep: run one point of the grid and write its rows. Hydra's task function."""

import logging
import random
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import provenance, store
from harness.experiment import Experiment, config_hash, config_values

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """Hydra's task function for a sweep's jobs: run the point a job's config describes, write
    its rows, return a short summary of them. It carries what every job of the sweep shares
    (the command that started the sweep), so that no job reads the sweep's manifest; it is
    pickled into each submitit job as it is."""

    command: str | None = None

    def __call__(self, cfg: DictConfig) -> dict:
        return self.run(config_values(cfg), HydraConfig.get().runtime.output_dir)

    def run(self, values: dict, run_dir: str) -> dict:
        """Run the point of a job's config `values` (resolved, without Hydra's node), write its
        rows, and return a short summary of them."""
        return run_point(values, run_dir, self.command)


def run_point(values: dict, run_dir: str, command: str | None) -> dict:
    """Run the point of a job's config values, write its rows, return a short summary."""
    experiment = Experiment.load(values["experiment"])
    params = experiment.params(values)
    root = Path(values["out"]) / "results"
    sweep, job = values["sweep_id"], values["job"]
    started, clock = datetime.now(UTC), time.perf_counter()
    rows = measure(experiment, params, values["seed"])
    harness_columns = {
        "job": job,
        "config_hash": config_hash(experiment.name, params),
        "started_at": started,
        "duration_s": time.perf_counter() - clock,
        "command": command,
        "run_dir": run_dir,
        **provenance.provenance(str(params.get("device", "cpu"))),
    }
    rows = [_row(row, params, harness_columns) for row in rows]
    store.write_rows(store.job_file(root, experiment.name, sweep, job), rows)
    _keep_package_list(store.sweep_dir(root, experiment.name, sweep))
    return summary(rows, params)


def measure(experiment: Experiment, params: dict, seed: int) -> list[dict]:
    """The experiment's rows for one point; a point that raises is one failed row."""
    _seed_everything(seed)
    try:
        rows = [dict(row) for row in experiment.run(**params)]
        _check_rows(rows, reserved=set(params) | set(store.HARNESS_COLUMNS) - {"status", "error"})
        return rows
    except Exception as error:
        log.error("%s failed:\n%s", experiment.name, traceback.format_exc())
        return [{"status": "failed", "error": f"{type(error).__name__}: {error}"}]


def summary(rows: list[dict], params: dict) -> dict:
    """The status of the point's rows (the worst one) and their first row's numbers."""
    statuses = [row["status"] for row in rows]
    status = next((s for s in statuses if s != "ok"), "ok")
    first = rows[0]
    metrics = {
        k: v
        for k, v in first.items()
        if k not in params and k not in store.HARNESS_COLUMNS and isinstance(v, int | float)
    }
    error = next((row.get("error") for row in rows if row.get("error")), None)
    return {"status": status, "error": error, "metrics": metrics, "seconds": first["duration_s"]}


def _check_rows(rows: list[dict], reserved: set[str]) -> None:
    if not rows:
        raise ValueError("the experiment returned no rows")
    clashes = sorted(
        {key for row in rows for key in row} & (reserved | set(store.PARTITIONS.names))
    )
    if clashes:
        raise ValueError(f"the experiment's rows reuse the columns {', '.join(clashes)}")


def _row(row: dict, params: dict, harness_columns: dict) -> dict:
    status = row.pop("status", "ok")
    error = row.pop("error", None)
    return {
        "job": harness_columns["job"],
        "status": status,
        **params,
        **row,
        "error": error,
        **{k: v for k, v in harness_columns.items() if k != "job"},
    }


def _keep_package_list(folder: Path) -> None:
    """Keep the full package list once per sweep, named by the digest that rows carry."""
    listing = provenance.packages()
    path = folder / f"_packages-{provenance.packages_digest(listing)}.json"
    if not path.exists():
        store.write_json(path, {"packages": list(listing)})


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    # torch.manual_seed also seeds each device type the build knows, queued with a stack trace
    # until that device starts (a millisecond a point); a build without any has none to seed.
    if torch.accelerator.current_accelerator() is None:  # asks the build, starts nothing
        torch.random.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
