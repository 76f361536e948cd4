"""tracker.log beside the trackers users reach for: the cost of a logged step, and what a
SIGKILL leaves.

Each tool logs {step, loss, accuracy, tokens_per_s, learning_rate} a step with no compute, in a
process of its own, through its own API: this harness's tracker (made as harness.running.job makes
one: tracker_log.point, the default landings), TensorBoard's SummaryWriter.add_scalar (torch's),
MLflow's log_metrics (file store and SQLite), W&B's run.log offline, and Aim's run.track. The
tools not installed in the Python that runs them are named and left out.

- per logged step: LOOP steps (or those that fit in CAP_S) timed inside the process (set-up and
  the final flush left out), ROUNDS rounds in turns (every tool once per round), the median;
- after a SIGKILL: the process logs a step every STEP_S seconds; it is killed at a random
  moment KILL_S after its first step; then the steps it had logged (it counts them in a file)
  against those its tool's own reader finds. Each tool KILLS times.

The peers can run under another Python (--peers PYTHON: a virtual environment with mlflow,
wandb and aim, which this project does not depend on); the harness and TensorBoard (torch's
writer) run under this one.
Run: python tests/benchmarks/tracker_peers.py [--peers /path/to/python]
"""

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOP, ROUNDS, KILLS, STEP_S, KILL_S = 10_000, 5, 3, 0.01, (1.5, 3.0)
CAP_S = 20.0  # a round of a tool stops there, short of LOOP steps (MLflow on SQLite: ~23 ms a step)
TOOLS = ["harness", "tensorboard", "wandb", "mlflow-file", "aim", "mlflow-sqlite"]
OURS = ("harness", "tensorboard")  # under this Python; the rest under --peers


def step_row(step: int) -> dict:  # tracker_log.step_row's: that module needs the harness,
    # which the peers' Python need not have
    return {"step": step, "loss": 1 / step, "accuracy": 0.5, "tokens_per_s": 1.2e5 + step,
            "learning_rate": 3e-4}  # fmt: skip


# In the child: each tool's logger, as (log(row), end()), and its reader: the steps it finds.


def harness_logger(folder: Path):
    sys.path[:0] = [str(HERE), str(HERE.parents[1])]
    import tracker_log

    tracker = tracker_log.point(folder, False, every_rows=1000, every_s=1.0)
    return tracker.log, lambda: tracker.end([])


def harness_reader(folder: Path) -> int:
    sys.path[:0] = [str(HERE.parents[1])]
    from harness import store

    return len(store.read(folder / "results"))


def tensorboard_logger(folder: Path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))

    def log(row: dict) -> None:
        for key, value in row.items():
            if key != "step":
                writer.add_scalar(key, value, row["step"])

    return log, writer.close


def tensorboard_reader(folder: Path) -> int:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return len(events.Scalars("loss")) if "loss" in events.Tags()["scalars"] else 0


def mlflow_uri(tool: str, folder: Path) -> str:
    if tool == "mlflow-file":  # in maintenance since MLflow 3.x: allowed, as a user would
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        return f"file:{folder / 'mlruns'}"
    return f"sqlite:///{folder / 'mlflow.db'}"


def mlflow_logger(folder: Path, uri: str):
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.start_run()

    def log(row: dict) -> None:
        mlflow.log_metrics({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    return log, mlflow.end_run


def mlflow_reader(folder: Path, uri: str) -> int:
    import mlflow

    client = mlflow.tracking.MlflowClient(uri)
    (run,) = client.search_runs(experiment_ids=["0"])
    return len(client.get_metric_history(run.info.run_id, "loss"))


def wandb_logger(folder: Path):
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    import wandb

    run = wandb.init(dir=str(folder), project="bench")
    return lambda row: run.log(row, step=row["step"]), run.finish


def wandb_reader(folder: Path) -> int:
    """The history records of the offline run's .wandb file, through W&B's own reader."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore  # gone from wandb 0.2x on: ImportError

    (path,) = folder.rglob("*.wandb")
    records = datastore.DataStore()
    records.open_for_scan(str(path))
    found = 0
    while (data := records.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        found += record.WhichOneof("record_type") == "history"
    return found


def aim_logger(folder: Path):
    from aim import Run

    run = Run(repo=str(folder))
    (folder / "aim-run").write_text(run.hash)  # a killed run is not in the repo's index

    def log(row: dict) -> None:
        for key, value in row.items():
            if key != "step":
                run.track(value, name=key, step=row["step"])

    return log, run.close


def aim_reader(folder: Path) -> int:
    from aim import Repo
    from aim.storage.context import Context

    run = Repo(str(folder)).get_run((folder / "aim-run").read_text())
    metric = run.get_metric("loss", Context({})) if run is not None else None
    if metric is None:  # Aim's reader did not find it: no count, rather than a wrong 0
        raise LookupError("Aim's Repo finds no loss metric of the killed run")
    return len(metric.values.values_list())


def tool_functions(tool: str, folder: Path):
    """The tool's (logger, reader), each without arguments."""
    if tool.startswith("mlflow"):
        uri = mlflow_uri(tool, folder)
        return lambda: mlflow_logger(folder, uri), lambda: mlflow_reader(folder, uri)
    logger, reader = globals()[f"{tool}_logger"], globals()[f"{tool}_reader"]
    return lambda: logger(folder), lambda: reader(folder)


def child(tool: str, folder: Path, mode: str, counter: Path | None) -> None:
    """--time: LOOP steps timed, the cost a step printed; --kill: a step every STEP_S until
    killed, the count of steps logged written to `counter` at each; --read: the steps found."""
    make, read = tool_functions(tool, folder)
    try:
        if mode == "read":
            print(json.dumps({"found": read()}))
            return
        log, end = make()
    except ImportError as error:
        print(json.dumps({"missing": str(error)}))
        return
    if mode == "time":
        rows = [step_row(step) for step in range(1, LOOP + 1)]
        started = time.perf_counter()
        for row in rows:
            log(row)
            if row["step"] % 100 == 0 and time.perf_counter() - started > CAP_S:
                break
        spent = time.perf_counter() - started
        end()
        print(json.dumps({"us": spent / row["step"] * 1e6, "steps": row["step"]}))
        return
    fd = os.open(counter, os.O_WRONLY | os.O_CREAT)
    for step in range(1, 10**9):
        log(step_row(step))
        os.pwrite(fd, f"{step:>12}".encode(), 0)
        time.sleep(STEP_S)


# In the parent.


def python_for(tool: str, peers: str) -> str:
    return sys.executable if tool in OURS else peers


def run_child(tool: str, peers: str, *args: str) -> dict:
    result = subprocess.run([python_for(tool, peers), __file__, "--child", tool, *args],
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        return {"failed": (result.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def killed(tool: str, peers: str) -> tuple[int, int] | str:
    """(steps logged, steps found) after a SIGKILL at a random moment; or why not measured."""
    with tempfile.TemporaryDirectory() as scratch:
        folder, counter = Path(scratch), Path(scratch) / "counter"
        command = [python_for(tool, peers), __file__, "--child", tool, "--kill", str(folder)]
        process = subprocess.Popen([*command, str(counter)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not (counter.exists() and counter.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                return "did not start"
            time.sleep(0.01)
        time.sleep(random.uniform(*KILL_S))
        process.send_signal(signal.SIGKILL)
        process.wait()
        logged = int(counter.read_text())
        found = run_child(tool, peers, "--read", str(folder))
        if "found" not in found:
            return f"not measured ({found.get('missing') or found.get('failed')})"
        return logged, found["found"]


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        tool, mode, folder = argv[1], argv[2].lstrip("-"), argv[3]
        child(tool, Path(folder), mode, Path(argv[4]) if len(argv) > 4 else None)
        return
    peers = argv[argv.index("--peers") + 1] if "--peers" in argv else sys.executable
    costs: dict[str, list[float]] = {tool: [] for tool in TOOLS}
    missing: dict[str, str] = {}
    steps: dict[str, int] = {}
    for _ in range(ROUNDS):
        for tool in [t for t in TOOLS if t not in missing]:
            with tempfile.TemporaryDirectory() as scratch:
                found = run_child(tool, peers, "--time", scratch)
            if "us" in found:
                costs[tool].append(found["us"])
                steps[tool] = min(steps.get(tool, LOOP), found["steps"])
            else:
                missing[tool] = found.get("missing") or found.get("failed")
    ours = statistics.median(costs["harness"])
    print(f"per logged step, median of {ROUNDS} rounds of up to {LOOP:,} steps (in turns):")
    for tool in TOOLS:
        if tool in missing:
            print(f"  {tool}: not measured ({missing[tool]})")
            continue
        median = statistics.median(costs[tool])
        print(f"  {tool}: {median:,.1f} us ({median / ours:.2f}x the harness's); rounds "
              f"{', '.join(f'{c:,.1f}' for c in costs[tool])}; {steps[tool]:,} steps a round "
              "at least")  # fmt: skip
    print(f"after a SIGKILL {KILL_S[0]}-{KILL_S[1]} s into a run logging every {STEP_S} s "
          "(steps found / steps logged):")  # fmt: skip
    for tool in [t for t in TOOLS if t not in missing]:
        outcomes = [killed(tool, peers) for _ in range(KILLS)]
        said = [f"{o[1]} of {o[0]}" if isinstance(o, tuple) else o for o in outcomes]
        print(f"  {tool}: {'; '.join(said)}")


if __name__ == "__main__":
    main(sys.argv[1:])
