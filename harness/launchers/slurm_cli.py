"""SLURM's command line as the harness reads it: squeue (tasks' states), sinfo (what a partition's
nodes have), scontrol (MaxArraySize), scancel, and a task's log (why it ended).

Without accounting, sacct fails (and submitit warns that it bypasses it), so a task's state
comes from squeue, which lists an ended task (COMPLETED, CANCELLED, TIMEOUT, ...) for MinJobAge
seconds and then forgets it. A Queue asks squeue about every array it follows in one call, and
backs off while nothing changes, as submitit's own watcher does: a sweep of many arrays costs
SLURM one call every few seconds, not one per array every half second.
"""

import re
import socket
import subprocess
import time
from pathlib import Path

DEFAULT_MAX_ARRAY_SIZE = 1001
ALIVE = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
    "STAGE_OUT", "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
}  # fmt: skip
# Pending reasons that no time will clear: the task asks for what its partition cannot give.
NEVER = {"PartitionConfig", "BadConstraints", "PartitionNodeLimit", "PartitionTimeLimit",
         "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied"}  # fmt: skip
TIMEOUT_S = 60  # for one call of a SLURM command


def states(tasks: set[str]) -> dict[str, tuple[str, str]] | None:
    """{"12_3": ("RUNNING", "None"), ...} for every task of these tasks' arrays that squeue
    still knows, from one squeue call; None if squeue failed. An id squeue no longer knows
    (long ended) is left out."""
    arrays = sorted({task.split("_")[0] for task in tasks})
    if not arrays:
        return {}
    command = ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(arrays), "-o", "%i|%T|%r"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0 and "Invalid job id" not in result.stderr:
        return None
    return parse_squeue(result.stdout)


def parse_squeue(text: str) -> dict[str, tuple[str, str]]:
    """squeue -o "%i|%T|%r"'s lines as {task: (state, reason)}."""
    found = {}
    for line in text.splitlines():
        fields = line.strip().split("|", 2)
        if len(fields) == 3:
            found[fields[0]] = (fields[1], fields[2])
    return found


class Queue:
    """squeue's answer for the tasks a wait follows, asked again only once `interval` has
    passed: 1 s at first, growing by half (to MOST_S) each time the answer is as before, back to
    1 s when it changes."""

    FIRST_S, MOST_S = 1.0, 15.0

    def __init__(self):
        self.interval, self.asked, self.answer = self.FIRST_S, -float("inf"), None

    def states(self, tasks: set[str]) -> dict[str, tuple[str, str]] | None:
        if time.monotonic() - self.asked < self.interval and self.answer is not None:
            return self.answer
        answer, self.asked = states(tasks), time.monotonic()
        steady = answer == self.answer
        self.interval = min(self.MOST_S, self.interval * 1.5) if steady else self.FIRST_S
        self.answer = answer
        return answer


def cancel(task: str) -> None:
    subprocess.run(["scancel", task], capture_output=True, timeout=TIMEOUT_S)


def lost_reason(state: tuple[str, str] | None, stderr_log: Path) -> str:
    """Why a task ended without a result: SLURM's state and its log's slurmstepd line."""
    said = f"SLURM {state[0].lower()} ({state[1]})" if state else "gone from SLURM's queue"
    try:
        lines = Path(stderr_log).read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    notes = [line.strip() for line in lines if "***" in line or "slurmstepd" in line]
    return said + (f": {notes[-1]}" if notes else "")


def partition_nodes(partition: str | None) -> list[dict]:
    """The CPUs, memory (MB) and GPUs of each node of the partition (or of the default one),
    from sinfo; [] if sinfo cannot run; ValueError if it runs but no cluster answers."""
    command = ["sinfo", "-h", "-N", "-o", "%P|%c|%m|%G"]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listed.returncode != 0:  # installed, but no cluster answers: sbatch would fail too
        said = [line for line in listed.stderr.splitlines() if line.strip()] or ["no reason"]
        raise ValueError(f"SLURM does not answer here (sinfo: {said[-1].strip()})")
    nodes = []
    for line in listed.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or not all(f.rstrip("+").isdigit() for f in fields[1:3]):
            continue  # not a node line
        name, cpus, memory, gres = fields
        if (partition is None and name.endswith("*")) or name.rstrip("*") == partition:
            nodes.append({"CPUs": int(cpus.rstrip("+")), "MB of memory": int(memory.rstrip("+")),
                          "GPUs": gpu_count(gres)})  # fmt: skip
    return nodes


def only_this_machine(partition: str | None) -> bool:
    """Whether the partition (or the default one) has nodes, and every one is this machine (its
    NodeHostname, as sinfo's %n gives it, is this host's short name); False where sinfo cannot
    tell."""
    command = ["sinfo", "-h", "-N", "-o", "%P|%n"]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    hosts = []
    for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
        name, _, host = line.strip().partition("|")
        if (partition is None and name.endswith("*")) or name.rstrip("*") == partition:
            hosts.append(host)
    here = socket.gethostname().partition(".")[0]
    return bool(hosts) and all(host.partition(".")[0] == here for host in hosts)


def gpu_count(gres: str) -> int:
    """The GPUs in sinfo's %G: gpu:2, gpu:a100:4(S:0-1), several comma-separated, or (null)."""
    total = 0
    for item in gres.split(","):
        fields = re.sub(r"\(.*?\)", "", item).split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def check_fits(settings: dict) -> None:
    """ValueError of one line naming every setting that asks for more than any node of the
    partition has (CPUs, memory, GPUs, as sinfo reports them), with the value that would fit.
    Silent when sinfo cannot tell."""
    nodes = partition_nodes(settings.get("partition"))
    if not nodes:
        return
    tasks = settings.get("tasks_per_node") or 1
    asks = {  # setting: (what a task asks for, in the unit sinfo counts, the unit's name, per)
        "cpus_per_task": ((settings.get("cpus_per_task") or 1) * tasks, "CPUs", tasks),
        "mem_gb": ((settings.get("mem_gb") or 0) * 1024, "MB of memory", 1024),
        "gpus_per_node": (settings.get("gpus_per_node") or 0, "GPUs", 1),
    }
    beyond, fixes = [], []
    for key, (wanted, what, per) in asks.items():
        most = max(node[what] for node in nodes)
        if wanted > most:
            beyond.append(f"{key}={settings[key]} asks for {wanted:,.0f} {what} a task, no node "
                          f"more than {most:,}")  # fmt: skip
            fixes.append(f"hydra.launcher.{key}={most // per}")
    if beyond:
        name = settings.get("partition") or "the default partition"
        raise ValueError(f"no node of {name} can run a task: {'; '.join(beyond)}; lower them "
                         f"({' '.join(fixes)} fits)")  # fmt: skip


def max_array_size() -> int:
    """The cluster's MaxArraySize: how many tasks one array may have (its indices start at 0)."""
    try:
        config = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=TIMEOUT_S
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_MAX_ARRAY_SIZE
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", config, re.MULTILINE)
    return int(found.group(1)) if found else DEFAULT_MAX_ARRAY_SIZE
