"""One point across several processes: hydra.launcher.tasks_per_node=N (and nodes=M on SLURM)
runs each point as N x M processes, a group, with torch.distributed initialised from submitit's
job environment (its ranks, its first host and a port drawn from the job's id) before the point
starts: gloo on the CPU, and NCCL for CUDA tensors where there is CUDA (each process then sees
one GPU, the one of its local rank, as cuda:0).

Every process runs the experiment. A training experiment learns its place from its tracker
(`tracker.rank`, `tracker.world_size`) or from torch.distributed itself; each process lands the
rows it logs as segments of its own, with columns `rank` and `world_size`; rank 0 writes the
checkpoints, which every rank restores from, and the job's file when the point ends (with the
rows its function returns: the point's). An experiment without a tracker writes rank 0's rows.
A point that raises in one process is taken as a broken group: no process waits on the others
any more, and the point counts as failed (resume reruns it, from its last checkpoint).
"""

import os
from dataclasses import dataclass

LOCAL_HOST = "127.0.0.1"  # the local launcher's processes meet here, whatever the host's name
TIMEOUT_S = 60  # how long a group's process waits for the others (launchers: group_timeout_s)
# The local launcher's groups meet at a port the launcher found free on this machine (the
# kernel's choice of port 0) rather than one drawn at random from the job's id: such a port may
# be any other process's, and a rank that cannot reach rank 0 there waits out the whole timeout.
PORT_ENV = "HARNESS_GROUP_PORT"


@dataclass(frozen=True)
class Group:
    """This process's place in its point's group."""

    rank: int
    world_size: int
    local_rank: int

    def gather(self, value) -> list:
        """Each rank's `value` (picklable), by rank; on every rank."""
        import torch.distributed as dist

        values = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def first(self, value):
        """Rank 0's `value`, on every rank."""
        import torch.distributed as dist

        sent = [value]
        dist.broadcast_object_list(sent, src=0)
        return sent[0]

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank (every rank must ask, as often as the others)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([int(flag)])
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return bool(tensor.item())

    def all(self, flag: bool) -> bool:
        return not self.any(not flag)

    def barrier(self) -> None:
        self.any(False)  # on the CPU's backend, as every collective here is


_group: Group | None = None


def current() -> Group | None:
    """This process's group; None for a point of one process."""
    return _group


def start(local: bool, timeout_s: float = TIMEOUT_S) -> Group | None:
    """In a submitit task: when its job has several tasks, initialise torch.distributed from
    submitit's job environment and return this process's place; None for one task. `local`:
    the tasks run on this machine (the local launcher), and meet on its loopback address.
    `timeout_s`: how long a process waits for the others, to meet or at a collective."""
    global _group
    import submitit

    environment = submitit.JobEnvironment()
    if environment.num_tasks <= 1:
        return None
    os.environ.pop("MASTER_PORT", None)  # an inherited one: each job draws its own from its id
    if local and os.environ.get(PORT_ENV):
        os.environ["MASTER_PORT"] = os.environ[PORT_ENV]  # the launcher's free port
    exported = submitit.helpers.TorchDistributedEnvironment()
    exported.export(set_cuda_visible_devices=False, overwrite=True)
    if local:
        os.environ["MASTER_ADDR"] = LOCAL_HOST
    _own_gpu(exported.local_rank)
    join(timeout_s)
    _group = Group(exported.rank, exported.world_size, exported.local_rank)
    return _group


def join(timeout_s: float) -> None:
    """init_process_group from the environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE):
    gloo, and NCCL for CUDA tensors where there is CUDA. A rank that never comes (it died
    before it got here) or a collective a rank never joins fails after `timeout_s`, not after
    torch's default of 30 minutes."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    if cuda:
        torch.cuda.set_device(0)


def free_port() -> str:
    """A TCP port no process listens on now, on this machine's loopback (the kernel's pick)."""
    import socket

    with socket.socket() as probe:
        probe.bind((LOCAL_HOST, 0))
        return str(probe.getsockname()[1])


def end() -> None:
    """Leave the group, if this process is in one."""
    global _group
    if _group is None:
        return
    _group = None
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _own_gpu(local_rank: int) -> None:
    """Narrow CUDA_VISIBLE_DEVICES to the entry of this process's local rank, where there is one
    for each (indices or UUIDs, as the launcher or SLURM listed them), before CUDA starts."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [entry.strip() for entry in (listed or "").split(",") if entry.strip()]
    if local_rank < len(entries):
        os.environ["CUDA_VISIBLE_DEVICES"] = entries[local_rank]
