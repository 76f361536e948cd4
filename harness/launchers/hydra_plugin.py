"""Any other of Hydra's launcher plugins (joblib, ray, rq, or the basic launcher where the loop
cannot reproduce its jobs: hydra.callbacks, env_set, chdir) through Hydra's own API, in batches:
each batch of consecutive job numbers (at most BATCH jobs) is one launch(), which the plugin may
run in parallel, and ends before the next starts, as Hydra's sweepers hand it over. The records
of a batch's jobs travel in the task function (harness.running.job.Task) the plugin is set up
with for that batch, which it hands each job."""

from collections.abc import Iterator
from dataclasses import replace

from omegaconf import DictConfig

from harness.launchers.protocol import Job, Launcher, summary_of

BATCH = 64


class HydraPluginLauncher(Launcher):
    def __init__(self, plugin, config: DictConfig, task_function, context):
        self.plugin, self.config, self.task_function = plugin, config, task_function
        self.context = context  # Hydra's, the plugin's setup takes it

    def follow(self, jobs: list[Job], placement: dict) -> Iterator[tuple[int, dict]]:
        for batch in batches(jobs):
            task = replace(self.task_function, jobs=tuple(batch))
            self.plugin.setup(hydra_context=self.context, task_function=task, config=self.config)
            results = self.plugin.launch([list(spec.overrides) for spec in batch], batch[0].job)
            for spec, result in zip(batch, results, strict=True):
                yield spec.job, summary_of(result)


def batches(jobs: list[Job]) -> list[list[Job]]:
    """The jobs in runs of consecutive job numbers (Hydra numbers a launch's jobs from its
    first), at most BATCH each."""
    runs: list[list[Job]] = []
    for spec in jobs:
        if runs and spec.job == runs[-1][-1].job + 1 and len(runs[-1]) < BATCH:
            runs[-1].append(spec)
        else:
            runs.append([spec])
    return runs
