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

from harness import provenance, store, tracking
from harness.experiment import Experiment, config_hash, config_values
from harness.tracking import Tracker

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
    path = store.job_file(root, experiment.name, sweep, job)
    started, clock = datetime.now(UTC), time.perf_counter()
    digest = config_hash(experiment.name, params)
    shared: dict = {}  # the harness's columns, taken once the experiment has started

    def prepare(row: dict, logged: bool = True) -> dict:
        if logged:  # a row a training experiment hands over as it runs
            _check_rows([row], _reserved(params))
        if not shared:
            shared.update(
                job=job,
                config_hash=digest,
                started_at=started,
                command=command,
                run_dir=run_dir,
                **provenance.provenance(str(params.get("device", "cpu"))),
            )
        return _row(row, params, {**shared, "duration_s": time.perf_counter() - clock})

    tracker = None
    if experiment.tracked:
        tracker = Tracker(
            path,
            tracking.checkpoint_dir(values["out"], experiment.name, sweep, job),
            prepare,
            config_hash=digest,
            every_rows=values.get("stream_rows", 1000),
            every_s=values.get("stream_s", 10.0),
            say=lambda text: print(f"  job {job}: {text}", flush=True),
            shown=lambda row: describe(row, params),
        )
    returned = measure(experiment, params, values["seed"], tracker)
    rows = [prepare(row, logged=False) for row in returned]
    if tracker is not None:
        rows = tracker.close() + rows
    store.write_rows(path, rows)
    _keep_package_list(store.sweep_dir(root, experiment.name, sweep))
    return summary(rows, params, last=tracker is not None)


def measure(
    experiment: Experiment, params: dict, seed: int, tracker: Tracker | None = None
) -> list[dict]:
    """The experiment's rows for one point; a point that raises is one failed row. A training
    experiment gets the tracker, and may return no rows beyond those it logged."""
    _seed_everything(seed)
    try:
        if tracker is None:
            rows = [dict(row) for row in experiment.run(**params)]
        else:
            with tracker.slurm_signals():
                rows = [dict(row) for row in experiment.run(**params, tracker=tracker) or []]
        _check_rows(rows, _reserved(params), logged=tracker.rows if tracker else [])
        return rows
    except Exception as error:
        log.error("%s failed:\n%s", experiment.name, traceback.format_exc())
        return [{"status": "failed", "error": f"{type(error).__name__}: {error}"}]


def summary(rows: list[dict], params: dict, last: bool = False) -> dict:
    """The status of the point's rows (the worst one) and their first row's numbers (`last`:
    the last row's, a training run's final ones)."""
    statuses = [row["status"] for row in rows]
    status = next((s for s in statuses if s != "ok"), "ok")
    shown = rows[-1] if last else rows[0]
    error = next((row.get("error") for row in rows if row.get("error")), None)
    return {
        "status": status,
        "error": error,
        "metrics": metrics(shown, params),
        "seconds": rows[-1]["duration_s"],  # this run's, not a restored row's first run
    }


def metrics(row: dict, params: dict) -> dict:
    """A row's numbers: its columns that are neither parameters nor the harness's."""
    return {
        k: v
        for k, v in row.items()
        if k not in params and k not in store.HARNESS_COLUMNS and isinstance(v, int | float)
    }


def describe(row: dict, params: dict, shown: int = 4) -> str:
    """A row's first few numbers, for a progress line: "step=1.2e+03 loss=0.41 ..."."""
    return " ".join(f"{k}={v:.4g}" for k, v in list(metrics(row, params).items())[:shown])


def _reserved(params: dict) -> set[str]:
    """The columns an experiment's rows may not set: its parameters, the harness's own."""
    return set(params) | set(store.HARNESS_COLUMNS) - {"status", "error"}


def _check_rows(rows: list[dict], reserved: set[str], logged: list[dict] = ()) -> None:
    if not rows and not logged:
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
