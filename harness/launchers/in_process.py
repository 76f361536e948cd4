"""Hydra's basic launcher (hydra/launcher=basic, the default), as the harness runs it: the
sweep's jobs one after another in this process, at the cost of a loop (harness.inprocess), each
summary as its job ends."""

from collections.abc import Iterator

from omegaconf import DictConfig

from harness.launchers import JobSpec, Launcher, run_here


class InProcessLauncher(Launcher):
    def __init__(self, config: DictConfig, task_function):
        self.config, self.task_function = config, task_function

    def follow(self, jobs: list[JobSpec], placement: dict) -> Iterator[tuple[int, dict]]:
        yield from run_here(self.config, self.task_function, jobs)
