"""exp019_precision: octlm trained in float32, bfloat16 and float16, what each costs and keeps.

Mixed precision is sold on two things: half the bytes per activation, and tensor cores that
multiply half-precision matrices many times faster than float32. Neither comes for free: float16
has five exponent bits, so small gradients underflow to zero unless the loss is scaled up first
(torch.amp.GradScaler), and a CPU without half-precision matrix units converts every operand and
runs slower, not faster. Day 2's note found bfloat16 slower than float32 on its CPU; this
experiment measures it as the subject: the same model, task and seed trained in each precision.

A point trains octlm (octlm_experiments.model, SDPA attention) for `steps` steps on exp017_recall's
task
(octlm_experiments.tasks.Recall: 8 key-value pairs, 4 queries, the gap of filler making up
`length`), from
`seed`, in `precision`:

- float32: no autocast;
- bfloat16: torch.autocast in bfloat16 (float32's exponent range: no scaler);
- float16: autocast in float16, the loss scaled by a GradScaler, which skips a step whose gradients
  overflowed and halves its scale;
- float16_unscaled: autocast in float16 without the scaler, to show what the scaler prevents.

Weights, AdamW's state and the gradients stay float32 throughout (autocast casts copies).

One row per step (phase "train": loss, accuracy on the answers, tokens_per_s, learning_rate,
zero_grad_fraction: the share of parameter-gradient elements that are exactly zero, and for the
scaler the scale it used and whether it skipped the step), logged through the harness's tracker
and checkpointed every `checkpoint_every` steps, so a killed run continues. Then one row (phase
"final"): throughput (the median and IQR of tokens_per_s over the steps after `warmup_steps`),
the gradients' zero share averaged over all steps, the scaler's final scale and skipped steps
(None where there is no scaler), the held-out loss and accuracy, and what a fresh child process
measured of one training step (measure_step): its peak memory (rss_delta_mib on the CPU,
cuda_peak_mib on CUDA, never one for the other), the SDPA backend the profiler saw run forward and
backward, and the step's time in matrix multiplies. A precision the device cannot run is one row
with status "unsupported" and the reason.
"""

import copy
import statistics
import time
import warnings
from typing import Literal

import torch

from harness.measuring.memory import measure_memory, run_isolated
from octlm_experiments import checks
from octlm_experiments.backends import default_backend
from octlm_experiments.model import ModelConfig, OctLM
from octlm_experiments.tasks import Recall
from octlm_experiments.training import (
    WARMUP,
    Observer,
    Plan,
    Training,
    Unsupported,
    evaluate,
    train,
    train_step,
)

Precision = Literal["float32", "bfloat16", "float16", "float16_unscaled"]
PRECISIONS = {  # the autocast dtype (None: no autocast) and whether a GradScaler scales the loss
    "float32": (None, False),
    "bfloat16": (torch.bfloat16, False),
    "float16": (torch.float16, True),
    "float16_unscaled": (torch.float16, False),
}
PAIRS, QUERIES, KEYS, VALUES = 8, 4, 16, 16  # exp017_recall's task; the gap makes up the length
FUSED = ("flash", "efficient", "cudnn")  # SDPA backends with kernels of their own
MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
MEASURE_TIMEOUT_S = 600.0
# What torch says when a kernel has no version for a dtype on a device.
UNSUPPORTED = ("not implemented for", "not supported", "unsupported")


def check(
    width: int, heads: int, kv_heads: int, layers: int, length: int, steps: int, batch: int,
    lr: float, warmup_steps: int, checkpoint_every: int, num_threads: int, device: str,
) -> None:  # fmt: skip
    checks.heads(heads, kv_heads)
    checks.rotary_width(width, heads)
    checks.positive(layers=layers, length=length, steps=steps, batch=batch, lr=lr,
                    checkpoint_every=checkpoint_every)  # fmt: skip
    checks.not_negative(warmup_steps=warmup_steps, num_threads=num_threads)
    checks.device(device, auto=True)
    if length < PAIRS + 2 * QUERIES:
        raise ValueError(
            f"length={length} must hold the {PAIRS} pairs and {QUERIES} queries with their "
            f"answers: at least {PAIRS + 2 * QUERIES}"
        )
    if warmup_steps >= steps:
        raise ValueError(f"warmup_steps={warmup_steps} must leave steps to time (steps={steps})")


def run(
    *,
    precision: Precision = "float32",
    width: int = 64,
    length: int = 64,
    heads: int = 4,
    kv_heads: int = 4,
    layers: int = 2,
    steps: int = 200,
    batch: int = 8,
    lr: float = 5e-3,
    warmup_steps: int = 20,
    checkpoint_every: int = 100,
    num_threads: int = 1,
    device: str = "auto",
    seed: int = 0,
    tracker=None,
) -> list[dict]:
    """Train in `precision`, a row per step (through `tracker` when the harness gives one), then
    the point's final row; the rows not logged through a tracker. num_threads 0 keeps torch's
    thread count, n > 0 sets it for the point."""
    checks.point(check, locals())
    used = checks.usable_device(device)
    shape = dict(precision=precision, width=width, length=length, heads=heads,
                 kv_heads=kv_heads, layers=layers, lr=lr, seed=seed)  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads or threads)
    try:
        training = build(**shape, device=used)
        if isinstance(training, str):
            return [unsupported(training, used)]
        history, plan = History(), Plan(steps, batch, lr, WARMUP, seed, checkpoint_every, ddp=None)
        try:
            rows = train(training, plan, tracker, observer=history, refused=_refused)
        except Unsupported as error:
            return [unsupported(str(error), used)]
        measured = measure_step(**shape, batch=batch, num_threads=num_threads, device=used)
        return [*rows, summary(training, history.kept, measured, steps, batch, warmup_steps,
                               seed)]  # fmt: skip
    finally:
        torch.set_num_threads(threads)


def build(*, precision, width, length, heads, kv_heads, layers, lr, seed, device) -> Training | str:
    """The model from the seed (the same initial weights in every precision), AdamW as
    exp017's, and the precision's autocast and scaler; or why the device cannot run it."""
    data = Recall(PAIRS, QUERIES, length - PAIRS - 2 * QUERIES, KEYS, VALUES, pair_tokens=True)
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=data.vocab_size, width=width, n_layers=layers, n_heads=heads,
                         n_kv_heads=kv_heads, max_length=length, attention="sdpa")  # fmt: skip
    model = OctLM(config)
    dtype, scaled = PRECISIONS[precision]
    autocast = autocast_for(device, dtype)
    if isinstance(autocast, str):
        return autocast
    scaler = torch.amp.GradScaler(device.type, enabled=scaled)
    return Training.of(data, model, lr, device, autocast, scaler)


def autocast_for(device: torch.device, dtype: torch.dtype | None) -> torch.autocast | str:
    """Autocast to dtype on the device (disabled for None), or why the device refuses it: a
    dtype autocast lacks on a device it warns about and disables itself (the run would be
    float32's under another name), or raises about (CUDA's bfloat16 where torch finds none)."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            autocast = torch.autocast(device.type, dtype=dtype or torch.bfloat16,
                                      enabled=dtype is not None)  # fmt: skip
        except RuntimeError as error:
            return f"{type(error).__name__}: {error}"
    refusals = [str(w.message) for w in warned if "autocast" in str(w.message).lower()]
    return " ".join(refusals) if dtype is not None and refusals else autocast


class History(Observer):
    """exp019's own beside the loop: each step's scale (the one the scaler used) and whether it
    skipped the step (None without a scaler), the gradients' zero share; and over the steps,
    what the final row summarizes (kept, in the checkpoint too)."""

    def __init__(self):
        self.kept = {"tokens_per_s": [], "zero_grad_fraction": [], "skipped_steps": 0}
        self.scale = None

    def before(self, training: Training) -> None:
        self.scale = training.scaler.get_scale() if training.scaler.is_enabled() else None

    def columns(self, training, step, tokens, targets, rate, row) -> dict:
        scaled = training.scaler.is_enabled()
        skipped = training.scaler.get_scale() < self.scale if scaled else None  # halved: overflow
        zeros = zero_fraction(training.model)
        self.kept["tokens_per_s"].append(row["tokens_per_s"])
        self.kept["zero_grad_fraction"].append(zeros)
        self.kept["skipped_steps"] += int(bool(skipped))
        return {"zero_grad_fraction": zeros, "loss_scale": self.scale, "step_skipped": skipped}

    def state(self, step: int) -> dict:
        return {"history": copy.deepcopy(self.kept)}

    def restore(self, saved: dict) -> None:
        self.kept.update(saved["history"])


def _refused(error: Exception) -> str | None:
    """The reason, where the first step's error says the device has no kernel for the dtype."""
    said = f"{type(error).__name__}: {error}"
    return said if any(words in str(error) for words in UNSUPPORTED) else None


def _step(training: Training, tokens: torch.Tensor, targets: torch.Tensor) -> tuple:
    """One training step at the optimizer's own learning rate (a measuring child's)."""
    return train_step(training, training.optimizer.defaults["lr"], tokens, targets)


@torch.no_grad()
def zero_fraction(model: OctLM) -> float:
    """The share of the parameters' gradient elements that are exactly zero, the embedding's
    left out: its rows for the tokens a batch lacks are zero in any precision."""
    grads = [p.grad for name, p in model.named_parameters()
             if p.grad is not None and not name.startswith("embedding.")]  # fmt: skip
    zeros = sum((g == 0).sum() for g in grads)
    return (zeros / sum(g.numel() for g in grads)).item()


def unsupported(reason: str, device: torch.device) -> dict:
    return {"phase": "final", "status": "unsupported", "error": reason, "device_used": str(device)}


def summary(training, history, measured, steps, batch, warmup_steps, seed) -> dict:
    """The final row: throughput over the steps after warmup_steps (median and IQR), the
    gradients' zero share over all steps, the scaler's state, the held-out evaluation and
    measure_step's columns."""
    timed = history["tokens_per_s"][warmup_steps:]
    quartiles = statistics.quantiles(timed, n=4, method="inclusive") if len(timed) > 1 else []
    median = statistics.median(timed)
    scaled = training.scaler.is_enabled()
    loss, correct = evaluate(training, batch, seed)
    step_ms = 1000 * batch * training.data.length / median
    return {
        "phase": "final", "step": steps, "device_used": str(training.device),
        "tokens_per_s": median,
        "tokens_per_s_iqr": quartiles[2] - quartiles[0] if quartiles else 0.0,
        "timed_steps": len(timed), "step_ms": step_ms,
        "zero_grad_fraction": statistics.fmean(history["zero_grad_fraction"]),
        "loss_scaling": "GradScaler" if scaled else "none",
        "final_scale": training.scaler.get_scale() if scaled else None,
        "skipped_steps": history["skipped_steps"] if scaled else None,
        "eval_loss": loss, "eval_accuracy": correct, "chance": training.data.chance,
        **measured,
    }  # fmt: skip


def measure_step(*, device: torch.device, **shape) -> dict:
    """measured_step in a fresh child process (harness.measuring.memory.run_isolated): resident
    memory means something only in a process that did nothing else. RuntimeError if it fails."""
    cap = 0 if device.type == "cuda" else None  # CUDA reserves address space it never uses
    outcome = run_isolated(measured_step, kwargs={**shape, "device": str(device)},
                           memory_cap_mib=cap, timeout_s=MEASURE_TIMEOUT_S)  # fmt: skip
    if outcome.status != "ok":
        raise RuntimeError(f"measuring a step: {outcome.status}: {outcome.error}")
    return outcome.value


def measured_step(*, batch: int, num_threads: int, device: str, **shape) -> dict:
    """In a measuring child: the point's model (from its seed) in its precision, and one full
    step's peak memory (measure_memory) over the model and batch already made: activations,
    gradients, autocast's copies and AdamW's state, which a first step allocates. First-use
    costs (the libraries' own set-up: 15 MiB of resident memory here) are paid before, by a
    step of a tiny model in the same precision, whose few KiB leave nothing for the measured
    step to reuse. Then a profiled step (profiled_step); the GPU's capability on CUDA."""
    device = torch.device(device)
    if num_threads:
        torch.set_num_threads(num_threads)
    tiny = build(**{**shape, "width": 2 * shape["heads"], "length": PAIRS + 2 * QUERIES},
                 device=device)  # fmt: skip
    _step(tiny, *(t.to(device) for t in tiny.data.batch(torch.Generator(), 1)))
    training = build(**shape, device=device)
    generator = torch.Generator().manual_seed(shape["seed"])
    tokens, targets = (t.to(device) for t in training.data.batch(generator, batch))
    row = measure_memory(lambda: _step(training, tokens, targets), device=device)
    if device.type == "cuda":  # 8.0 for sm80: which fused kernels exist is told by it
        major, minor = torch.cuda.get_device_capability(device)
        row["capability"] = major + minor / 10
    return row | profiled_step(training, tokens, targets)


def profiled_step(training: Training, tokens: torch.Tensor, targets: torch.Tensor) -> dict:
    """One training step under the profiler: sdpa_forward and sdpa_backward (the backend each
    direction ran, from the profiler's op names, by octlm_experiments.backends' default_backend; a
    backward op's name says so), sdpa_fused_ops (how many of the step's SDPA ops ran a fused
    kernel: 2 * layers when both directions did), matmul_ms (time in matrix multiplies: the
    CPU's on the CPU, the GPU's on CUDA) and matmul_share, that over the step's time (the
    profiler's overhead on each op included, so a little low)."""
    cuda = training.device.type == "cuda"
    with _profiled(cuda) as profile:
        clock = time.perf_counter()
        _step(training, tokens, targets)
        if cuda:
            torch.cuda.synchronize(training.device)
        seconds = time.perf_counter() - clock
    events = profile.events()
    names = {e.name for e in events}
    backward = {name for name in names if "backward" in name.lower()}
    kernels = {e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA}
    micros = sum(e.self_device_time_total if cuda else e.self_cpu_time_total for e in events
                 if e.name in MATMULS)  # fmt: skip
    return {
        "sdpa_forward": default_backend(names - backward, kernels if cuda else None),
        "sdpa_backward": backward_backend(backward),
        "sdpa_fused_ops": sum(sdpa_backend(e.name) in FUSED for e in events),
        "matmul_ms": micros / 1000,
        "matmul_share": micros / 1e6 / seconds,
    }


def sdpa_backend(op: str) -> str | None:
    """The backend of one of SDPA's own ops (aten::_scaled_dot_product_..., one per call and
    direction), else None."""
    return default_backend({op}, None) if op.startswith("aten::_scaled_dot_product_") else None


def backward_backend(ops: set[str]) -> str:
    """The backend whose backward ran: a fused one's own op, or math's, which has none (autograd
    runs the backward of its matmuls and its softmax, aten::_softmax_backward_data)."""
    backend = default_backend(ops, None)
    if backend == "unknown" and "aten::_softmax_backward_data" in ops:
        return "math"
    return backend


def _profiled(cuda: bool) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)
