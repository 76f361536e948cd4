"""Helpers for the SLURM test cluster: the object the ``slurm_cluster`` fixture yields,
polling, and the calls to cluster.sh.  (A module of its own, not conftest.py, so that test
modules can import it: pytest may hold several modules named "conftest".)
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from probes import wait_for  # noqa: F401  (the slurm tests import it from here too)

CLUSTER_SH = Path(__file__).with_name("cluster.sh")
REQUIRED_PROGRAMS = ("slurmctld", "slurmd", "munged", "sbatch")
INSTALL_HINT = (
    "apt-get install slurmctld slurmd slurm-client munge, "
    "or set HARNESS_REQUIRE_SLURM=1 to make this a failure"
)
# the daemons live in /usr/sbin, which a non-login PATH may lack
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def slurm_required() -> bool:
    return os.environ.get("HARNESS_REQUIRE_SLURM", "") == "1"


def search_path() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(parts + [d for d in SBIN_DIRS if d not in parts])


def unavailable(reason: str, module_level: bool = False) -> None:
    """Skip, or fail when HARNESS_REQUIRE_SLURM=1."""
    message = f"SLURM test cluster not available: {reason}"
    if slurm_required():
        pytest.fail(message + " (HARNESS_REQUIRE_SLURM=1)", pytrace=False)
    pytest.skip(message, allow_module_level=module_level)


def availability_problem() -> str | None:
    """Why this machine cannot run the test cluster, or None."""
    search = search_path()
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p, path=search) is None]
    if missing:
        return f"{', '.join(missing)} not found; {INSTALL_HINT}"
    if os.geteuid() != 0:
        return f"the test cluster runs slurmd as root, run the tests as root; {INSTALL_HINT}"
    return None


def skip_module_unless_available() -> None:
    """Call at the top of a test module: ONE skip line for the whole module (not one per test)
    when SLURM is not installed; a collection error instead with HARNESS_REQUIRE_SLURM=1."""
    problem = availability_problem()
    if problem:
        unavailable(problem, module_level=True)


@dataclass(frozen=True)
class SlurmCluster:
    """What the tests get from the ``slurm_cluster`` fixture."""

    directory: Path  # everything of the cluster lives here (slurm.conf, logs, state, ...)
    partition: str  # the default partition
    max_array_size: int  # MaxArraySize: array indices must be < this
    requeue_delay_s: int  # a requeued job waits this long (BeginTime) before it runs again
    env: dict[str, str] = field(default_factory=dict)  # {"SLURM_CONF": directory/slurm.conf}

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    def run(
        self, *args: str, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster (text output captured)."""
        proc = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **self.env},
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} failed with {proc.returncode}:\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def sbatch(self, *args: str) -> str:
        """Submit with sbatch --parsable; return the job id (of an array: the array's job id)."""
        out = self.run("sbatch", "--parsable", *args).stdout.strip()
        return out.split(";")[0]

    def job_info(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict ({} once the record is purged, MinJobAge)."""
        proc = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if proc.returncode != 0:
            return {}
        info: dict[str, str] = {}
        for token in proc.stdout.split("\n")[0].split():
            key, sep, value = token.partition("=")
            if sep and key not in info:
                info[key] = value
        return info

    def queue(self) -> list[str]:
        """Ids of the jobs that still hold or wait for resources (PD, R, CG, ...)."""
        out = self.run("squeue", "-h", "-o", "%i %T").stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def squeue_state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) as squeue shows them, ("", "") once the job left the queue."""
        out = self.run("squeue", "-h", "-j", job_id, "-o", "%T|%r", check=False).stdout.strip()
        state, _, reason = out.partition("|")
        return state, reason

    def release_requeued(self, job_id: str, done: Callable[[], object], timeout: float = 30):
        """Start a requeued job now instead of after SLURM's delay, and wait until ``done()``.

        After ``scontrol requeue`` SLURM holds the job back (BeginTime) for cred_expire + 1
        seconds (121 by default, ``requeue_delay_s``): slurmd revoked the old launch
        credential and refuses a new one issued in the same second ("Killing non-startable
        batch JobId=N: Job credential revoked", and the job then ends for good).  So wait until
        the job is back in PENDING/BeginTime (the old run is gone) plus just over a second,
        then set StartTime=now, repeating it while the job still waits for its BeginTime."""
        pending = wait_for(
            lambda: self.squeue_state(job_id) == ("PENDING", "BeginTime") and time.time(),
            timeout,
            f"requeued job {job_id} to wait for its BeginTime",
            describe=lambda: str(self.job_info(job_id)),
        )
        time.sleep(max(0.0, pending + 1.1 - time.time()))

        def released():
            if done():
                return True
            if self.squeue_state(job_id) == ("PENDING", "BeginTime"):
                self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)
            return False

        wait_for(
            released,
            timeout,
            f"requeued job {job_id} to run again",
            interval=0.3,
            describe=lambda: f"{self.job_info(job_id)}\n{self.log_tails()}",
        )

    def cancel_all(self, timeout: float = 20) -> None:
        """scancel every job and wait until the queue is empty."""
        self.run("scancel", "--user", _user(), check=False)
        wait_for(lambda: not self.queue(), timeout, "the queue to drain after scancel")

    def log_tails(self, lines: int = 20) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.directory / "log" / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"----- {path}\n" + "\n".join(tail))
        return "\n".join(out)


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def run_script(action: str, directory: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PATH"] = search_path()
    return subprocess.run(
        ["bash", str(CLUSTER_SH), action, str(directory)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def make_directory(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    """A temporary directory short enough for the munge socket path (< 108 bytes)."""
    directory = tmp_path_factory.mktemp("slurm")
    if len(str(directory)) <= 70:
        return directory, False
    return Path(tempfile.mkdtemp(prefix="harness-slurm-")), True
