"""What produced a row: the code's commit, the versions, the host, the device, SLURM's ids."""

import functools
import hashlib
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from harness.pinning.codestore import running_digest

SOURCE = Path(__file__).resolve().parents[2]  # the checkout the harness runs from, if any


@functools.cache
def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the harness's own checkout; (None, None) where it is not one: an
    installed harness (site-packages, perhaps in a venv inside some other repository) has no
    commit of its own, and its version is in the rows' package list.

    Dirty counts files git does not track yet (a new experiment module, say), but not the ones
    it ignores (outputs/, .venv/)."""
    if not (SOURCE / ".git").exists():  # a folder in a checkout, or a worktree's .git file
        return None, None
    try:
        commit = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain"))
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return commit, dirty


def _git(*args: str) -> str:
    # --no-optional-locks: git status would otherwise take .git/index.lock to refresh the index,
    # and a job killed meanwhile (SIGKILL, a SLURM time limit) would leave it behind, blocking
    # the user's next commit.
    result = subprocess.run(
        ["git", "--no-optional-locks", "-C", str(SOURCE), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return result.stdout.strip()


@functools.cache
def packages() -> tuple[str, ...]:
    """Every installed distribution as name==version, sorted."""
    found = dict(_name_and_version(d) for d in metadata.distributions())
    return tuple(f"{name}=={version}" for name, version in sorted(found.items()) if name)


def _name_and_version(distribution: metadata.Distribution) -> tuple[str, str | None]:
    """A distribution's Name and Version, read from its metadata's header lines: what
    distribution.metadata holds for them, without parsing the whole file as an email (20 ms
    for 40 packages, the better part of a short sweep's start)."""
    text = distribution.read_text("METADATA") or distribution.read_text("PKG-INFO") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line:  # the headers end here
            break
        key, _, value = line.partition(":")
        fields.setdefault(key, value.strip())
    return fields.get("Name", "").lower(), fields.get("Version")


def packages_digest(listing: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(listing).encode()).hexdigest()[:16]


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device ("auto" is CUDA when there is one), else the CPU's."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return _cpu_name()


@functools.cache
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(device: str) -> dict:
    """The provenance columns of a row measured on `device` in this process."""
    import torch

    commit, dirty = git_state()
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "code_digest": running_digest(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "packages_digest": packages_digest(packages()),
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "hostname": socket.gethostname(),
        **slurm(),
    }


def slurm() -> dict:
    """SLURM's ids for this task (None outside SLURM), how often SLURM requeued it, and the
    GPUs it was given (CUDA_VISIBLE_DEVICES)."""
    env = os.environ
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    return {
        "slurm_job_id": f"{array_job}_{task}" if array_job and task else env.get("SLURM_JOB_ID"),
        "slurm_array_task_id": int(task) if task else None,
        "slurm_node": env.get("SLURMD_NODENAME"),
        "slurm_restarts": int(env.get("SLURM_RESTART_COUNT", 0)) if "SLURM_JOB_ID" in env else None,
        "gpus": env.get("CUDA_VISIBLE_DEVICES"),
    }
