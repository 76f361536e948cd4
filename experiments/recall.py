"""exp017_recall: octlm trained on multi-query associative recall, or on the characters of a text.

Recall (task="recall"): each sequence holds `pairs` key-value pairs (distinct keys out of
`keys`, values out of `values`), then `gap` filler tokens, then `queries` of those keys (distinct),
each followed by its value. The loss and the accuracy count the answers only: at a query, the
next token is its value. Chance is 1 / values. With pair_tokens (the default) a pair is one
token that names both its key and its value, so one attention layer can answer (a query looks
up the pair with its key); without, a pair is a key token followed by a value token, which needs
an induction circuit (a previous-token head, then a matching one): it learns far more slowly.
Sequences are drawn on the fly from a generator seeded by `seed`; the held-out evaluation set is
drawn once from another. Through the layers a window of w keys reaches layers * (w - 1)
positions back: at most the gap, and every pair is out of the queries' sight.

Text (task="text"): next-character prediction on a UTF-8 file (`text_file`): windows of `length`
characters from its first 90% for training, the last 10% held out; accuracy over every position.

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

import copy
import functools
import math
import time
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from experiments import checks, paths
from experiments.model import AUTO, ModelConfig, OctLM, check_attention

IGNORE = -100  # a position without a target
EVAL_SEED = 1_000_003  # the held-out set's generator: seed + this
EVAL_BATCHES = 8
WARMUP = 300  # steps of linear warm-up (warmup), then a cosine decay to a tenth of lr


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
    warmup: int = WARMUP,
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
    rank, world = (tracker.rank, tracker.world_size) if tracker is not None else (0, 1)
    if world > 1 and not ddp:
        raise ValueError(f"{world} processes run this point: train across them with ddp=true")
    if ddp and world == 1:
        raise ValueError("ddp=true trains across a point's processes, and this one runs as one: "
                         "hydra/launcher=local hydra.launcher.tasks_per_node=2")  # fmt: skip
    if batch % world:
        raise ValueError(f"batch={batch} does not split evenly across {world} processes")
    if attention != AUTO:  # auto takes a path that trains here
        refused = paths.unsupported(attention, used, getattr(torch, dtype), backward=True)
        if refused:
            return [{"status": "unsupported", "error": refused}]
    if task == "recall":
        data = Recall(pairs, queries, gap, keys, values, pair_tokens)
    else:
        data = Text(Path(text_file).read_text(encoding="utf-8"), length)
    torch.manual_seed(seed)  # the initial weights: the same for every path from one seed
    model = OctLM(
        ModelConfig(
            vocab_size=data.vocab_size,
            width=width,
            n_layers=layers,
            n_heads=heads,
            n_kv_heads=kv_heads,
            max_length=data.length,
            attention=attention,
            window=window,
            tiled_block=block,
        )  # fmt: skip
    ).to(used)
    optimizer = adamw(model, lr)
    generator = torch.Generator().manual_seed(seed)
    # Rank 0 of a group also trains a copy alone, on the whole batch, for reference_steps steps.
    alone = Alone(model, lr) if world > 1 and rank == 0 and reference_steps else None
    start, rows = 0, []
    state = tracker.restore() if tracker is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["data"])
        start = state["step"]
        alone = alone.restored(state.get("alone")) if alone else None
    share = slice(rank * batch // world, (rank + 1) * batch // world)
    trained = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    record = tracker.log if tracker is not None else rows.append
    autocast = torch.autocast(used.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    model.train()
    for step in range(start + 1, steps + 1):
        rate = schedule(step, steps, lr, warmup)
        tokens, targets = (t.to(used) for t in data.batch(generator, batch))
        clock = time.perf_counter()
        logits, loss = train_step(trained, optimizer, rate, tokens[share], targets[share],
                                  autocast)  # fmt: skip
        # .item() waits for the step on CUDA too
        loss_value, correct = averaged(loss.item(), accuracy(logits, targets[share]), world)
        seconds = time.perf_counter() - clock
        row = {
            "phase": "train", "step": step, "loss": loss_value, "accuracy": correct,
            "tokens_per_s": tokens.numel() / seconds, "learning_rate": rate,
        }  # fmt: skip
        if alone is not None and step <= reference_steps:
            row["single_loss_diff"] = abs(alone.step(tokens, targets, rate, autocast) - loss_value)
        if rank == 0:
            record(row)
        if tracker is not None and (step % checkpoint_every == 0 or tracker.stopping):
            kept = {"alone": alone.state()} if alone and step < reference_steps else {}
            tracker.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "data": generator.get_state(), "step": step, **kept})  # fmt: skip
    loss_value, correct = evaluate(model, data, batch, seed, used, autocast)
    return [*rows, {"phase": "eval", "step": steps, "loss": loss_value, "accuracy": correct,
                    "chance": data.chance}]  # fmt: skip


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)


def train_step(model, optimizer, rate: float, tokens, targets, autocast):
    """One optimizer step at learning rate `rate` on (tokens, targets); the logits and the loss."""
    for group in optimizer.param_groups:
        group["lr"] = rate
    with autocast:
        logits = model(tokens)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return logits, loss


def averaged(loss: float, correct: float, world: int) -> tuple[float, float]:
    """A step's loss and accuracy over the group's processes (each had as many answers)."""
    if world == 1:
        return loss, correct
    both = torch.tensor([loss, correct], dtype=torch.float64)
    torch.distributed.all_reduce(both)
    return tuple((both / world).tolist())


class Alone:
    """A copy of the model, trained alone on the whole batch: what the group's steps are checked
    against (single_loss_diff)."""

    def __init__(self, model: torch.nn.Module, lr: float):
        self.model = copy.deepcopy(model)
        self.optimizer = adamw(self.model, lr)

    def step(self, tokens, targets, rate: float, autocast) -> float:
        return train_step(self.model, self.optimizer, rate, tokens, targets, autocast)[1].item()

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def restored(self, state: dict | None) -> "Alone | None":
        """This copy as the checkpoint left it; None where it had stopped (past its steps)."""
        if state is None:
            return None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return self


def schedule(step: int, steps: int, lr: float, warmup: int = WARMUP) -> float:
    """Linear warm-up over `warmup` steps, then a cosine decay from lr to lr / 10 at `steps`."""
    warm = min(1.0, step / warmup) if warmup else 1.0
    return lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The share of positions with a target whose most likely token is that target."""
    scored = targets != IGNORE
    return (logits.argmax(-1)[scored] == targets[scored]).float().mean().item()


@torch.no_grad()
def evaluate(model, data, batch: int, seed: int, device, autocast) -> tuple[float, float]:
    """Loss and accuracy on EVAL_BATCHES held-out batches (a generator of their own)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed + EVAL_SEED)
    losses, correct = [], []
    for _ in range(EVAL_BATCHES):
        tokens, targets = (t.to(device) for t in data.batch(generator, batch, held_out=True))
        with autocast:
            logits = model(tokens)
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                      ignore_index=IGNORE).item())  # fmt: skip
        correct.append(accuracy(logits, targets))
    model.train()
    return sum(losses) / len(losses), sum(correct) / len(correct)


class Recall:
    """Multi-query associative recall sequences (see the module's docstring).

    Tokens with pair_tokens: pair (k, v) is k * V + v; a query of key k is K * V + k; an answer
    v is K * V + K + v; the filler is the last token. Without: key k is k, value v is K + v
    (a query repeats its key token, an answer its value token), the filler is K + V."""

    def __init__(self, pairs: int, queries: int, gap: int, keys: int, values: int, pair_tokens):
        self.pairs, self.queries, self.gap = pairs, queries, gap
        self.keys, self.values, self.pair_tokens = keys, values, pair_tokens
        self.chance = 1 / values
        pair_length = pairs if pair_tokens else 2 * pairs
        self.start = pair_length + gap  # where the queries begin
        self.length = self.start + 2 * queries
        if pair_tokens:
            self.query0, self.answer0 = keys * values, keys * values + keys
        else:
            self.query0, self.answer0 = 0, keys
        self.filler = self.answer0 + values
        self.vocab_size = self.filler + 1

    def batch(self, generator: torch.Generator, size: int, held_out: bool = False):
        """(tokens, targets), each (size, length); targets IGNORE except at the queries."""
        keys = torch.rand(size, self.keys, generator=generator).argsort(-1)[:, : self.pairs]
        values = torch.randint(self.values, (size, self.pairs), generator=generator)
        asked = torch.rand(size, self.pairs, generator=generator).argsort(-1)[:, : self.queries]
        asked_keys, answers = keys.gather(1, asked), values.gather(1, asked)
        if self.pair_tokens:
            context = keys * self.values + values
        else:
            context = torch.stack([keys, self.keys + values], -1).flatten(1)
        filler = torch.full((size, self.gap), self.filler)
        questions = torch.stack([self.query0 + asked_keys, self.answer0 + answers], -1).flatten(1)
        tokens = torch.cat([context, filler, questions], 1)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, self.start :: 2] = self.answer0 + answers  # at each query, its answer
        return tokens, targets


class Text:
    """Next-character prediction on a text: random windows of `length` characters, from its
    first 90% for training and from the rest for held-out evaluation."""

    def __init__(self, text: str, length: int):  # at least 10 * (length + 1) characters: check
        alphabet = sorted(set(text))
        self.vocab_size, self.length, self.chance = len(alphabet), length, 1 / len(alphabet)
        index = {char: i for i, char in enumerate(alphabet)}
        encoded = torch.tensor([index[char] for char in text])
        split = len(encoded) * 9 // 10
        self.train, self.held_out = encoded[:split], encoded[split:]

    def batch(self, generator: torch.Generator, size: int, held_out: bool = False):
        source = self.held_out if held_out else self.train
        starts = torch.randint(len(source) - self.length, (size, 1), generator=generator)
        windows = source[starts + torch.arange(self.length + 1)]
        return windows[:, :-1], windows[:, 1:]
