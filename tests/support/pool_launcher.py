"""A launcher of a user's own, through the harness's launcher protocol (harness.launchers) and
nothing else: each job in a process of a pool (concurrent.futures, spawned), at most `workers`
at once. tests/support/conf/hydra/launcher/pool.yaml names it:
    python -m harness --config-dir tests/support/conf +experiment=NAME hydra/launcher=pool
"""

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed

from harness.launchers import JobSpec, Launcher, check_kinds, shipped, work_shipped


class PoolLauncher(Launcher):
    def __init__(self, workers: int = 2):
        self.workers = workers

    @classmethod
    def preflight(cls, settings: dict) -> None:
        check_kinds(settings, {"workers": "positive"})

    def follow(self, jobs: list[JobSpec], placement: dict) -> Iterator[tuple[int, dict]]:
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(self.workers, mp_context=spawn) as pool:
            running = {pool.submit(work_shipped, shipped(self, [spec])): spec for spec in jobs}
            for done in as_completed(running):
                yield running[done].job, done.result()[0]
