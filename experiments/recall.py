"""exp017_recall: octlm trained on multi-query associative recall, or on the characters of a text
(octlm_experiments.tasks: Recall, Text), through the shared training loop
(octlm_experiments.training).

One row per training step (phase "train": step, loss, accuracy, tokens_per_s, lr), then one row
for the held-out evaluation (phase "eval"). Under the harness they land as the run goes, and the
state (weights, optimizer, data generator, step) is checkpointed every `checkpoint_every` steps.

Across processes (ddp=true, a point of several: hydra.launcher.tasks_per_node=N): the model is
wrapped in DistributedDataParallel, every process draws the same batch of `batch` sequences and
trains on its share (batch / N), and rank 0 logs the rows, their loss and accuracy averaged over
the processes, tokens_per_s the whole batch's. For the first `reference_steps` steps rank 0 also
trains a copy of the model alone on the whole batch, from the same weights, and logs how far its
loss is from the group's (single_loss_diff): N processes train as one from the same seed.
"""

import functools
from pathlib import Path
from typing import Literal

import torch

from octlm_experiments import checks, paths, training
from octlm_experiments.model import AUTO, ModelConfig, OctLM, check_attention
from octlm_experiments.tasks import Recall, Text


def check(
    task: str, attention: str, window: int, kv_heads: int, heads: int, width: int, layers: int,
    block: int, steps: int, batch: int, lr: float, pairs: int, queries: int, gap: int, keys: int,
    values: int, length: int, text_file: str | None, checkpoint_every: int, device: str,
    reference_steps: int, warmup: int,
) -> None:  # fmt: skip
    check_attention(attention)
    checks.window(window, causal=True)
    checks.heads(heads, kv_heads)
    checks.rotary_width(width, heads)
    checks.positive(layers=layers, block=block, steps=steps, batch=batch, lr=lr, pairs=pairs,
                    queries=queries, keys=keys, values=values, length=length,
                    checkpoint_every=checkpoint_every)  # fmt: skip
    checks.not_negative(gap=gap, reference_steps=reference_steps, warmup=warmup)
    checks.device(device, auto=True)
    if pairs > keys:
        raise ValueError(f"pairs={pairs} needs at least as many distinct keys, got keys={keys}")
    if queries > pairs:
        raise ValueError(f"queries={queries} must not exceed pairs={pairs} (distinct keys)")
    if task == "text":
        if not text_file:
            raise ValueError("task=text needs text_file: the path of a UTF-8 file")
        if not Path(text_file).is_file():
            raise ValueError(f"text_file {text_file} is not a file")
        characters = _characters(text_file, Path(text_file).stat().st_mtime_ns)
        if characters < 10 * (length + 1):
            raise ValueError(
                f"text_file {text_file} has {characters:,} characters: at least "
                f"{10 * (length + 1):,} are needed for length={length} (90% to train on, 10% "
                "held out)"
            )


@functools.lru_cache(maxsize=8)
def _characters(path: str, modified: int) -> int:
    """How many characters a UTF-8 file holds (ValueError if it is not UTF-8); once per version."""
    try:
        return len(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        said = f"{error.reason} at byte {error.start}"
        raise ValueError(f"text_file {path} is not UTF-8 ({said})") from None


def run(
    *,
    task: Literal["recall", "text"] = "recall",
    attention: str = "sdpa",
    window: int = 0,
    kv_heads: int = 4,
    heads: int = 4,
    width: int = 64,
    layers: int = 2,
    block: int = 16,
    dtype: Literal["float32", "bfloat16"] = "float32",
    steps: int = 800,
    batch: int = 128,
    lr: float = 5e-3,
    warmup: int = training.WARMUP,
    pairs: int = 8,
    queries: int = 4,
    gap: int = 8,
    keys: int = 16,
    values: int = 16,
    pair_tokens: bool = True,
    text_file: str | None = None,
    length: int = 64,
    checkpoint_every: int = 100,
    device: str = "auto",
    ddp: bool = False,
    reference_steps: int = 100,
    seed: int = 0,
    tracker=None,
) -> list[dict]:
    """Train, logging a row per step (through `tracker` when the harness gives one), then
    evaluate on held-out sequences; the rows not logged through a tracker."""
    checks.point(check, locals())
    used = checks.usable_device(device)
    rank, world = training.group(tracker, ddp, batch)
    if attention != AUTO:  # auto takes a path that trains here
        refused = paths.unsupported(attention, used, getattr(torch, dtype), backward=True)
        if refused:
            return [{"status": "unsupported", "error": refused}]
    if task == "recall":
        data = Recall(pairs, queries, gap, keys, values, pair_tokens)
    else:
        data = Text(Path(text_file).read_text(encoding="utf-8"), length)
    torch.manual_seed(seed)  # the initial weights: the same for every path from one seed
    config = ModelConfig(vocab_size=data.vocab_size, width=width, n_layers=layers, n_heads=heads,
                         n_kv_heads=kv_heads, max_length=data.length, attention=attention,
                         window=window, tiled_block=block)  # fmt: skip
    autocast = torch.autocast(used.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    prepared = training.Training.of(data, OctLM(config), lr, used, autocast)
    # Rank 0 of a group also trains a copy alone, on the whole batch, for reference_steps steps.
    alone = training.Alone(prepared, lr, reference_steps) if world > 1 and rank == 0 else None
    plan = training.Plan(steps, batch, lr, warmup, seed, checkpoint_every, ddp=ddp)
    try:
        rows = training.train(prepared, plan, tracker, observer=alone if reference_steps else None)
    except training.Unsupported as error:
        return [{"status": "unsupported", "error": str(error)}]
    loss, correct = training.evaluate(prepared, batch, seed)
    return [*rows, {"phase": "eval", "step": steps, "loss": loss, "accuracy": correct,
                    "chance": data.chance}]  # fmt: skip
