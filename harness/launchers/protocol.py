"""Launchers: what runs a sweep's jobs. The harness asks a launcher only what it can do (the
protocol of Launcher below), never for its class, so a new one (Ray, Kubernetes, a cloud batch
service) is one file: a class with these methods, named by a hydra/launcher/NAME.yaml's
`_target_` (tests/support/pool_launcher.py is one, a few dozen lines).

- Launcher.preflight(settings), a class method: one ValueError line for settings that cannot
  work here, before anything is planned, written or instantiated.
- detached: whether its jobs run on without this process (then wait=false may leave them, and
  status asks the launcher where they are).
- start(jobs) hands the jobs over (each a harness.planning.plan.Job, a frozen record: its
  number, overrides, parameters and config_hash, shipped as it is) and returns their
  placement: JSON that the manifest records (`launches`: launcher, placement) where there is
  any, for status, resume and compact.
- follow(jobs, placement) yields (job number, summary) as each job ends: what the job returned
  (harness.running.job's summary), or why it returned nothing ({"status": "killed", "error": why}).
  A job whose rows the store could not take is the StoreUnwritable (harness.errors) that its
  process sent back in place of a summary (unwritable); the sweep raises it (raise_if_unwritable).
- states(placement), a class method: job -> (state, detail) of the jobs that it still queues or
  runs ("pending", "running") or that it lost without a row ("killed").
- point_process(): what each of its points' processes runs with (PointProcess: its
  environment and torch's threads), where this process can tell before any starts: then the
  points answered before are copied here and never handed to it (harness.reuse); where
  it cannot tell (environ None, the default), each point's process decides; None for a
  launcher whose points are groups of processes, which are never reused.

A launcher's jobs run the harness's own job (run_point; harness.running.job.Task, the task
function that calls it, where Hydra runs a job) wherever they run, through
harness.launchers.in_process (but a Hydra plugin's): in this process one after another
(run_here), or in a process of their own (work; pack and work_packed carry them there as
bytes), which takes this process's Hydra state with it. Hydra's plugin launchers
(basic, joblib, ray, ...) keep Hydra's API: harness.launchers.dispatch runs Hydra's basic
launcher's jobs here as a loop (in_process) and hands any other plugin its jobs in batches
(hydra_plugin).
"""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from harness.errors import StoreUnwritable, one_line, with_type
from harness.planning.plan import Job


@dataclass(frozen=True)
class PointProcess:
    """What a launcher's points run with: the environment of a point's process and torch's
    threads in it (None: this process's); environ None where this process cannot tell. `here`:
    the points run in this very process (a GPU's name is then this process's to tell)."""

    environ: Mapping[str, str] | None = None
    threads: int | None = None
    here: bool = False


class Launcher:
    """The protocol (see the module's docstring), with what most launchers do by default. A
    launcher is built from its config (hydra.launcher's keys as keyword arguments) and set up
    as Hydra sets up its launchers (setup)."""

    detached = False

    def point_process(self) -> PointProcess | None:
        return PointProcess()

    @classmethod
    def preflight(cls, settings: dict) -> None:
        """ValueError (one line) for settings that cannot work on this machine."""

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def start(self, jobs: list[Job]) -> dict:
        return {}

    def follow(self, jobs: list[Job], placement: dict) -> Iterator[tuple[int, dict]]:
        raise NotImplementedError

    @classmethod
    def states(cls, placement: dict) -> dict[int, tuple[str, str]]:
        return {}


def unwritable(error: OSError) -> StoreUnwritable:
    """What a job's own process sends back in place of the summary of a job whose rows the
    store could not take (`error`, the store's), and of each job after it: one line saying so,
    which the sweep's process raises (raise_if_unwritable)."""
    kind = StoreUnwritable.of(error).kind  # the store's error's type, kept across the pickle
    said = f"harness error: the store cannot be written ({kind}: {one_line(error)})"
    sent = StoreUnwritable(said)
    sent.kind = kind
    return sent


def raise_if_unwritable(summary: dict | StoreUnwritable) -> dict:
    """A job's summary as its launcher hands it to the sweep; the StoreUnwritable that a job's
    process sent in its place (unwritable) is raised here, in the sweep's process."""
    if isinstance(summary, StoreUnwritable):
        raise summary
    return summary


def summary_of(result) -> dict:
    """A Hydra JobReturn as a job's summary; an exception in it is the harness's."""
    try:
        return result.return_value
    except Exception as error:
        return {"status": "failed", "error": f"harness error: {with_type(error)}"}


def trusted(target: str, config_dirs: Iterable[Path] = ()) -> type | None:
    """The launcher class a manifest's launch names, if one of the launcher configs here
    (conf/hydra/launcher/, or a config dir's) names it: a class is never imported because a
    file in the store names it."""
    from harness.names import CONF

    folders = [CONF, *config_dirs]
    named = {
        OmegaConf.load(path).get("_target_")
        for folder in folders
        for path in sorted((Path(folder) / "hydra" / "launcher").glob("*.yaml"))
    }
    return get_class(target) if target in named else None


def check_kinds(settings: dict, kinds: dict[str, str]) -> None:
    """One ValueError line for a setting that is not of its kind: "positive" (a whole number of
    1 or more), "count" (0 or more), "number" (above 0); "?" after it: null allowed too."""
    for key, kind in kinds.items():
        value = settings.get(key)
        if key not in settings or (value is None and kind.endswith("?")):
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        number = whole or isinstance(value, float)
        if kind.startswith("positive") and not (whole and value >= 1):
            raise ValueError(f"{key} must be a whole number of 1 or more, got {value!r}")
        if kind.startswith("count") and not (whole and value >= 0):
            raise ValueError(f"{key} must be a whole number of 0 or more, got {value!r}")
        if kind.startswith("number") and not (number and value > 0):
            raise ValueError(f"{key} must be a number above 0, got {value!r}")
