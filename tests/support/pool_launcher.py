"""A launcher of a user's own, through the harness's launcher protocol (harness.launchers.protocol)
and nothing else: each job in a process of a pool (multiprocessing's, spawned), at most `workers`
at once. tests/support/conf/hydra/launcher/pool.yaml names it:
    python -m harness --config-dir tests/support/conf +experiment=NAME hydra/launcher=pool
"""

import multiprocessing
import signal
from collections.abc import Iterator

from harness.launchers.in_process import pack, work_packed
from harness.launchers.protocol import Job, Launcher, check_kinds


class PoolLauncher(Launcher):
    def __init__(self, workers: int = 2):
        self.workers = workers

    @classmethod
    def preflight(cls, settings: dict) -> None:
        check_kinds(settings, {"workers": "positive"})

    def follow(self, jobs: list[Job], placement: dict) -> Iterator[tuple[int, dict]]:
        # Leaving the block, at the end or on Ctrl-C, terminates the workers: no point outlives
        # the sweep (the launchers' contract). Ctrl-C reaches them too: this process answers it.
        spawn = multiprocessing.get_context("spawn")
        with spawn.Pool(self.workers, initializer=signal.signal, initargs=_CTRL_C_IGNORED) as pool:
            shipments = [(spec.job, pack(self, [spec])) for spec in jobs]
            yield from pool.imap_unordered(_work, shipments)


_CTRL_C_IGNORED = (signal.SIGINT, signal.SIG_IGN)


def _work(shipment: tuple[int, bytes]) -> tuple[int, dict]:
    job, payload = shipment
    return job, work_packed(payload)[0]
