"""Facts about the single-node SLURM test cluster that the harness relies on.

Each test pins down a behaviour of SLURM 22.05 (Debian 12) or of submitit 1.5 on the cluster
that tests/slurm/cluster.sh starts: fake GPUs, MaxArraySize, requeue, no accounting.
"""

from __future__ import annotations

import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import slurm_jobs
from slurm_testing import SlurmCluster, skip_module_unless_available, wait_for

pytestmark = pytest.mark.slurm
skip_module_unless_available()

# exact texts (stderr, exit status 1) that the harness will have to recognize
ARRAY_TOO_LARGE = "sbatch: error: Batch job submission failed: Invalid job array specification"
NO_ACCOUNTING = "Slurm accounting storage is disabled"
TOO_MANY_GPUS = (
    "sbatch: error: Batch job submission failed: Requested node configuration is not available"
)


def _state(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.job_info(job_id).get("JobState", "")


def _wait_state(cluster: SlurmCluster, job_id: str, states: set[str], timeout: float = 30):
    return wait_for(
        lambda: (s := _state(cluster, job_id)) in states and s,
        timeout,
        f"job {job_id} to reach {sorted(states)}",
        describe=lambda: str(cluster.job_info(job_id)),
    )


def test_node_is_idle_with_two_fake_gpus(cluster):
    out = cluster.run("sinfo", "-h", "-N", "-o", "%N|%T|%G|%P").stdout.split()
    assert len(out) == 1
    node, state, gres, partition = out[0].split("|")
    assert state == "idle"
    assert gres == "gpu:2"
    assert partition == f"{cluster.partition}*"  # the default partition


def test_sbatch_job_runs_and_writes_a_file(cluster, tmp_path):
    target = tmp_path / "hello.txt"
    job = cluster.sbatch(
        f"--output={tmp_path}/%j.log",
        f"--chdir={tmp_path}",
        "--wrap",
        f'echo "hello $SLURM_JOB_ID $PWD" > {shlex.quote(str(target))}',
    )
    assert _wait_state(cluster, job, {"COMPLETED", "FAILED"}) == "COMPLETED"
    assert target.read_text() == f"hello {job} {tmp_path}\n"


def test_concurrent_gpu_jobs_get_different_cuda_visible_devices(cluster, tmp_path):
    # each job records its CUDA_VISIBLE_DEVICES, then waits until the other one has done the
    # same, so exit 0 proves both held a GPU at the same time
    script = f"""
cd {shlex.quote(str(tmp_path))}
echo "$CUDA_VISIBLE_DEVICES $SLURM_JOB_GPUS" > cvd.$SLURM_JOB_ID.tmp
mv cvd.$SLURM_JOB_ID.tmp cvd.$SLURM_JOB_ID
for i in $(seq 300); do
    [ "$(ls cvd.* | grep -vc tmp)" -ge 2 ] && exit 0
    sleep 0.1
done
exit 1
"""
    jobs = [
        cluster.sbatch("--gres=gpu:1", f"--output={tmp_path}/%j.log", "--wrap", script)
        for _ in range(2)
    ]
    for job in jobs:
        assert _wait_state(cluster, job, {"COMPLETED", "FAILED"}, timeout=45) == "COMPLETED"
    seen = {job: (tmp_path / f"cvd.{job}").read_text().split() for job in jobs}
    # CUDA_VISIBLE_DEVICES is the index of the fake device in gres.conf, SLURM_JOB_GPUS the same
    assert sorted(cvd for cvd, _ in seen.values()) == ["0", "1"], seen
    assert all(cvd == job_gpus for cvd, job_gpus in seen.values()), seen


def test_more_gpus_than_the_node_has_is_refused(cluster):
    proc = cluster.run("sbatch", "--gres=gpu:3", "--wrap", "true", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == TOO_MANY_GPUS


def test_job_array_larger_than_max_array_size_is_refused(cluster):
    n = cluster.max_array_size
    # n tasks (indices 0..n-1) are fine
    ok = cluster.sbatch(f"--array=0-{n - 1}", "--hold", "--wrap", "true")
    assert cluster.job_info(f"{ok}_0").get("ArrayTaskId") is not None
    # n+1 tasks are refused, and so is any index >= MaxArraySize: a grid larger than
    # MaxArraySize must be split into arrays that each start again at index 0
    for spec in (f"0-{n}", f"{n}", f"{n}-{n + 1}"):
        proc = cluster.run("sbatch", f"--array={spec}", "--wrap", "true", check=False)
        assert proc.returncode == 1, spec
        assert proc.stderr.strip() == ARRAY_TOO_LARGE, spec


def test_sacct_fails_without_accounting(cluster):
    proc = cluster.run("sacct", "-j", "1", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == NO_ACCOUNTING


def test_requeue_reruns_the_same_job_id_with_restart_count(cluster, tmp_path):
    runs = tmp_path / "runs.txt"
    job = cluster.sbatch(
        f"--output={tmp_path}/%j.log",
        "--open-mode=append",
        "--wrap",
        f'echo "$SLURM_JOB_ID ${{SLURM_RESTART_COUNT:-unset}}" >> {shlex.quote(str(runs))}\n'
        "sleep 60",
    )

    def lines():
        return runs.read_text().splitlines() if runs.exists() else []

    wait_for(lambda: len(lines()) == 1, 30, "the first run")
    assert _state(cluster, job) == "RUNNING"
    requeued_at = time.time()
    cluster.run("scontrol", "requeue", job)

    info = wait_for(
        lambda: cluster.squeue_state(job) == ("PENDING", "BeginTime") and cluster.job_info(job),
        30,
        "the requeued job to wait for its BeginTime",
    )
    # same job id, Restarts counts up, and SLURM holds the job back ~2 minutes (BeginTime)
    assert info["JobId"] == job
    assert info["Restarts"] == "1"
    eligible = datetime.fromisoformat(info["EligibleTime"]).timestamp()
    delay = cluster.requeue_delay_s  # 121 s: cred_expire (120 s by default) + 1
    assert delay - 5 <= eligible - requeued_at <= delay + 5

    # make it eligible now rather than waiting the two minutes
    cluster.release_requeued(job, lambda: len(lines()) == 2)
    assert lines() == [f"{job} unset", f"{job} 1"]
    log = (tmp_path / f"{job}.log").read_text()
    assert f"JOB {job} ON" in log and "DUE TO JOB REQUEUE" in log


# ------------------------------------------------------------------ submitit end to end


def _executor(cluster: SlurmCluster, folder: Path, parallelism: int):
    import submitit

    pythonpath = shlex.quote(slurm_jobs.job_pythonpath())
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    assert executor.cluster == "slurm"
    executor.update_parameters(
        slurm_partition=cluster.partition,
        gpus_per_node=1,
        cpus_per_task=1,
        timeout_min=5,
        slurm_array_parallelism=parallelism,
        # the job's python must import slurm_jobs (functions are pickled by reference)
        slurm_setup=[f"export PYTHONPATH={pythonpath}${{PYTHONPATH:+:$PYTHONPATH}}"],
    )
    return executor


def _results(jobs, timeout: float) -> list[dict]:
    # without accounting submitit cannot learn a job's state (sacct fails, it logs
    # "Bypassing sacct error ...") and relies on the result pickles: poll them with a deadline
    # instead of job.result(), which would wait forever for a job that died without one
    wait_for(lambda: all(job.done() for job in jobs), timeout, "the submitit array", interval=0.25)
    return [job.result() for job in jobs]


def _max_concurrency(results: list[dict]) -> int:
    events = sorted([(r["start"], 1) for r in results] + [(r["end"], -1) for r in results])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_submitit_map_array_runs_a_throttled_gpu_array(cluster, tmp_path):
    started = time.monotonic()
    executor = _executor(cluster, tmp_path / "submitit", parallelism=1)
    inputs = [0, 1, 2]
    jobs = executor.map_array(slurm_jobs.report, inputs, [1.0] * len(inputs))
    array_id = jobs[0].job_id.split("_")[0]
    assert [job.job_id for job in jobs] == [f"{array_id}_{i}" for i in range(len(inputs))]

    sbatch_text = jobs[0].paths.submission_file.read_text()
    assert f"#SBATCH --array=0-{len(inputs) - 1}%1" in sbatch_text
    assert "#SBATCH --gpus-per-node=1" in sbatch_text
    assert f"#SBATCH --partition={cluster.partition}" in sbatch_text

    results = _results(jobs, timeout=60)
    assert [r["y"] for r in results] == [2 * x for x in inputs]
    for i, r in enumerate(results):
        assert r["env"]["SLURM_ARRAY_JOB_ID"] == array_id
        assert r["env"]["SLURM_ARRAY_TASK_ID"] == str(i)
        assert r["env"]["SLURM_JOB_PARTITION"] == cluster.partition
        assert r["env"]["CUDA_VISIBLE_DEVICES"] in {"0", "1"}
        assert r["python"] == sys.executable
    # slurm_array_parallelism=1: the tasks ran one after another although two GPUs were free
    assert _max_concurrency(results) == 1
    # without accounting submitit never learns a state: done()/result() work off the result
    # pickles, job.state stays "UNKNOWN" even after the job finished
    assert {job.state for job in jobs} == {"UNKNOWN"}
    print(
        f"\nsubmitit array of {len(inputs)} (parallelism 1) in {time.monotonic() - started:.1f}s; "
        f"CUDA_VISIBLE_DEVICES per task: {[r['env']['CUDA_VISIBLE_DEVICES'] for r in results]}"
    )


def test_submitit_parallel_array_tasks_get_distinct_gpus(cluster, tmp_path):
    started = time.monotonic()
    executor = _executor(cluster, tmp_path / "submitit", parallelism=2)
    inputs = [0, 1, 2, 3]
    (tmp_path / "meeting").mkdir()
    # Tasks 0 and 1, then 2 and 3, can only return once their partner has arrived: each pair
    # ran at once, under array_parallelism=2.
    jobs = executor.map_array(slurm_jobs.meet, inputs, [str(tmp_path / "meeting")] * 4)
    results = _results(jobs, timeout=180)
    assert [r["y"] for r in results] == [2 * x for x in inputs]
    assert _max_concurrency(results) <= 2
    for a, b in (results[0:2], results[2:4]):  # tasks that ran at once held different GPUs
        assert a["env"]["CUDA_VISIBLE_DEVICES"] != b["env"]["CUDA_VISIBLE_DEVICES"]
    print(
        f"\nsubmitit array of {len(inputs)} (parallelism 2) in {time.monotonic() - started:.1f}s; "
        f"CUDA_VISIBLE_DEVICES per task: {[r['env']['CUDA_VISIBLE_DEVICES'] for r in results]}"
    )


def test_submitit_array_larger_than_max_array_size_fails_at_submission(cluster, tmp_path):
    import submitit

    executor = _executor(cluster, tmp_path / "submitit", parallelism=cluster.max_array_size)
    inputs = list(range(cluster.max_array_size + 1))
    with pytest.raises(submitit.core.utils.FailedJobError) as excinfo:
        executor.map_array(slurm_jobs.report, inputs)
    assert "Invalid job array specification" in str(excinfo.value)
    assert cluster.queue() == []
