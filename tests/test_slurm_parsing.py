"""The SLURM logic without a cluster: sinfo's and squeue's output as the harness reads them, and
the wait's state machine for a task that SLURM would never start (fake commands on PATH)."""

import stat
from types import SimpleNamespace

import pytest

from harness import launchers


def fake_command(folder, name: str, output: str) -> None:
    """An executable `name` in folder that prints output and records its arguments."""
    path = folder / name
    path.write_text(f"#!/bin/sh\necho \"$@\" >> {folder}/{name}.calls\nprintf '%b' '{output}'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize(
    "gres, count",
    [("gpu:2", 2), ("gpu:a100:4(S:0-1)", 4), ("gpu:a100:2,gpu:v100:1,mps:100", 3), ("(null)", 0)],
)
def test_gpus_are_counted_from_sinfo_gres(gres, count):
    assert launchers.gpu_count(gres) == count


def test_a_partitions_nodes_and_what_fits_them(tmp_path, monkeypatch):
    listing = "gpu*|64|512000|gpu:a100:8(S:0-1)\\ngpu*|32|256000|gpu:4\\ncpu|128+|1024000|(null)\\n"
    fake_command(tmp_path, "sinfo", listing)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert launchers.partition_nodes(None) == [
        {"CPUs": 64, "MB of memory": 512000, "GPUs": 8},
        {"CPUs": 32, "MB of memory": 256000, "GPUs": 4},
    ]
    assert launchers.partition_nodes("cpu")[0]["CPUs"] == 128
    launchers.check_fits(
        {"partition": None, "cpus_per_task": 64, "mem_gb": 500, "gpus_per_node": 8}
    )
    with pytest.raises(
        ValueError, match="gpus_per_node=1 asks for 1 GPUs a task, and no node of cpu"
    ):
        launchers.check_fits({"partition": "cpu", "gpus_per_node": 1})
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    launchers.check_fits({"partition": None, "cpus_per_task": 10**6})  # no sinfo: cannot tell


def test_the_wait_gives_up_a_task_slurm_would_never_start(tmp_path, monkeypatch):
    fake_command(tmp_path, "squeue", "12_0|PENDING|PartitionConfig\\n12_1|RUNNING|None\\n")
    fake_command(tmp_path, "scancel", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(launchers, "NEVER_GRACE_S", 0.0)
    monkeypatch.setattr(launchers, "POLL_S", 0.01)
    paths = SimpleNamespace(result_pickle=tmp_path / "none.pkl", stderr=tmp_path / "none.err")
    handles = {0: SimpleNamespace(job_id="12_0", paths=paths)}
    ((job, _, lost),) = list(launchers.wait(handles))
    assert job == 0 and lost == "SLURM would never start it: pending (PartitionConfig)"
    assert (tmp_path / "scancel.calls").read_text() == "12_0\n"


def test_an_installed_slurm_without_a_cluster_is_refused_with_sinfos_reason(tmp_path, monkeypatch):
    script = tmp_path / "sinfo"
    script.write_text(
        "#!/bin/sh\necho 'sinfo: error: Could not establish a configuration' >&2\nexit 1\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        ValueError, match=r"SLURM does not answer here \(sinfo: sinfo: error: Could"
    ):
        launchers.check_fits({"partition": None, "cpus_per_task": 1})
