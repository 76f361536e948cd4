"""The SLURM logic without a cluster: sinfo's and squeue's output as the harness reads them, the
wait's state machine for a task that SLURM would never start, and squeue asked once for every
array and backed off (fake commands on PATH)."""

import stat
from types import SimpleNamespace

import pytest

from harness.command import status
from harness.launchers import slurm, slurm_cli


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
    assert slurm_cli.gpu_count(gres) == count


@pytest.mark.process
def test_a_partitions_nodes_and_what_fits_them(tmp_path, monkeypatch):
    listing = "gpu*|64|512000|gpu:a100:8(S:0-1)\\ngpu*|32|256000|gpu:4\\ncpu|128+|1024000|(null)\\n"
    fake_command(tmp_path, "sinfo", listing)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm_cli.partition_nodes(None) == [
        {"CPUs": 64, "MB of memory": 512000, "GPUs": 8},
        {"CPUs": 32, "MB of memory": 256000, "GPUs": 4},
    ]
    assert slurm_cli.partition_nodes("cpu")[0]["CPUs"] == 128
    slurm_cli.check_fits(
        {"partition": None, "cpus_per_task": 64, "mem_gb": 500, "gpus_per_node": 8}
    )
    with pytest.raises(ValueError) as refused:
        slurm_cli.check_fits({"partition": "cpu", "gpus_per_node": 1})
    assert str(refused.value) == (
        "no node of cpu can run a task: gpus_per_node=1 asks for 1 GPUs a task, no node more "
        "than 0; lower them (hydra.launcher.gpus_per_node=0 fits)"
    )
    with pytest.raises(ValueError) as refused:  # every setting beyond the nodes, in one line
        slurm_cli.check_fits({"partition": None, "cpus_per_task": 40, "tasks_per_node": 2,
                              "mem_gb": 600, "gpus_per_node": 9})  # fmt: skip
    assert str(refused.value) == (
        "no node of the default partition can run a task: cpus_per_task=40 asks for 80 CPUs a "
        "task, no node more than 64; mem_gb=600 asks for 614,400 MB of memory a task, no node "
        "more than 512,000; gpus_per_node=9 asks for 9 GPUs a task, no node more than 8; lower "
        "them (hydra.launcher.cpus_per_task=32 hydra.launcher.mem_gb=500 "
        "hydra.launcher.gpus_per_node=8 fits)"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    slurm_cli.check_fits({"partition": None, "cpus_per_task": 10**6})  # no sinfo: cannot tell


@pytest.mark.process
def test_the_wait_gives_up_a_task_slurm_would_never_start(tmp_path, monkeypatch):
    fake_command(tmp_path, "squeue", "12_0|PENDING|PartitionConfig\\n12_1|RUNNING|None\\n")
    fake_command(tmp_path, "scancel", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(slurm, "NEVER_GRACE_S", 0.0)
    monkeypatch.setattr(slurm, "POLL_S", 0.01)
    paths = SimpleNamespace(result_pickle=tmp_path / "none.pkl", stderr=tmp_path / "none.err")
    launcher = slurm.SlurmLauncher(submitit_folder=str(tmp_path))
    launcher.submitted = {"12_0": SimpleNamespace(job_id="12_0", paths=paths)}
    placement = {"tasks": {"12_0": [0]}, "submitit_folder": str(tmp_path)}
    ((job, summary),) = list(launcher.follow([], placement))
    assert job == 0 and summary == {
        "status": "killed", "error": "SLURM would never start it: pending (PartitionConfig)"
    }  # fmt: skip
    assert (tmp_path / "scancel.calls").read_text() == "12_0\n"


@pytest.mark.process
def test_squeue_is_asked_once_for_every_array_and_less_often_while_nothing_changes(
    tmp_path, monkeypatch
):
    fake_command(tmp_path, "squeue", "12_0|RUNNING|None\n13_4|PENDING|Priority\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm_cli.states({"12_0", "12_1", "13_4"}) == {
        "12_0": ("RUNNING", "None"), "13_4": ("PENDING", "Priority")
    }  # fmt: skip
    assert (tmp_path / "squeue.calls").read_text().split()[5] == "12,13", "one call, both arrays"
    queue, clock = slurm_cli.Queue(), [0.0]
    monkeypatch.setattr(slurm_cli.time, "monotonic", lambda: clock[0])
    asked = []
    for second in range(60):
        clock[0] = float(second)
        before = (tmp_path / "squeue.calls").read_text().count("\n")
        queue.states({"12_0"})
        asked += [second] if (tmp_path / "squeue.calls").read_text().count("\n") > before else []
    gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] >= 10 and len(asked) < 15, asked


@pytest.mark.process
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
        slurm_cli.check_fits({"partition": None, "cpus_per_task": 1})


def test_a_launch_edited_out_of_its_kind_reads_as_unknown():
    """A manifest is anyone's to edit: a launch without its launcher, jobs that are not job
    numbers, a placement that is no mapping, or no launch at all: what is left is unknown, and
    status goes on."""
    edited = [{"jobs": [0, "1", None], "placement": "x"}, "a line", {"launcher": 3, "jobs": 5}]
    assert status.scheduled({"launches": edited}) == {
        0: ("unknown", "its launcher None is no launcher config here")
    }


def test_a_launch_of_a_launcher_no_config_here_names_is_not_imported(tmp_path):
    planted = {"at": "2026-12-01T10:00:00+00:00", "launcher": "os.system", "detached": True,
               "jobs": [0, 1], "placement": {"rm -rf /": 1}}  # fmt: skip
    states = status.scheduled({"launches": [planted]})
    assert states == dict.fromkeys([0, 1], ("unknown", "its launcher os.system is no launcher "
                                             "config here"))  # fmt: skip
