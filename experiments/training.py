"""The training loop that exp017_recall, exp019_precision and a training experiment of one's own
share: steps on a task's batches under a warm-up and cosine schedule, a row per step logged
through the harness's tracker (harness.tracking), checkpoints every `checkpoint_every` steps and
when SLURM asks the point to stop, the restore of the last one when the point runs again, and
training across a point's processes (DistributedDataParallel) where it runs as several.

An experiment builds its Training (the task's data, the model, its optimizer, the autocast and
scaler of its precision, the device) and calls train(training, Plan(...), tracker); what is its
own beside the loop (columns of a step's row, state of its own in the checkpoint) is an Observer
it passes. The task (octlm_experiments.tasks) gives batches as (tokens, targets), targets IGNORE
where
a position has none.

Across processes: every process draws the same batch of `batch` sequences and trains on its
share (batch / N); the loss and accuracy of a step are averaged over the processes, tokens_per_s
is the whole batch's, and rank 0 alone logs the rows.
"""

import copy
import dataclasses
import math
import time

import torch
import torch.nn.functional as F

from octlm_experiments.tasks import IGNORE

EVAL_SEED = 1_000_003  # the held-out set's generator: seed + this
EVAL_BATCHES = 8
WARMUP = 300  # steps of linear warm-up (warmup), then a cosine decay to a tenth of lr


@dataclasses.dataclass
class Training:
    """What a run trains with: the task, the model, its optimizer, the precision's autocast and
    scaler (disabled where the precision has none), and the device."""

    data: object  # a task (octlm_experiments.tasks): batch(generator, size, held_out), length
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    autocast: torch.autocast
    scaler: torch.amp.GradScaler
    device: torch.device

    @classmethod
    def of(cls, data, model, lr: float, device: torch.device, autocast=None, scaler=None):
        """The model on the device with AdamW at lr (adamw); float32 without a scaler unless
        autocast and scaler say otherwise."""
        model = model.to(device)
        autocast = autocast or torch.autocast(device.type, enabled=False)
        scaler = scaler or torch.amp.GradScaler(device.type, enabled=False)
        return cls(data, model, adamw(model, lr), autocast, scaler, device)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long and how a run trains: steps of `batch` sequences, the peak learning rate and its
    warm-up, the data's seed, how often a checkpoint is taken, and whether across the point's
    processes (ddp; None: the experiment trains in one process only, see group)."""

    steps: int
    batch: int
    lr: float
    warmup: int = WARMUP
    seed: int = 0
    checkpoint_every: int = 100
    ddp: bool | None = False


class Observer:
    """What an experiment adds to the loop, each a no-op here: before(training), just before a
    step; columns(training, step, tokens, targets, rate, row), the columns it adds to the step's
    row (which holds loss, accuracy and tokens_per_s); state(step), what it keeps in the
    checkpoint (top-level keys beside the loop's); restore(saved), its state from one."""

    def before(self, training: Training) -> None:
        pass

    def columns(self, training: Training, step: int, tokens, targets, rate: float, row) -> dict:
        return {}

    def state(self, step: int) -> dict:
        return {}

    def restore(self, saved: dict) -> None:
        pass


class Unsupported(Exception):
    """The first step says the device cannot train so (refused: the experiment's own test of an
    error, e.g. a kernel missing for a dtype): the run's answer is an unsupported row."""


def group(tracker, ddp: bool | None, batch: int) -> tuple[int, int]:
    """(rank, processes) of the point: ddp says whether it trains across its processes (None:
    the experiment trains in one process only); a ValueError of one line where the processes
    that run it and the setting disagree, or the batch does not split across them."""
    rank, world = (tracker.rank, tracker.world_size) if tracker is not None else (0, 1)
    if world > 1 and ddp is None:
        raise ValueError(f"{world} processes run this point, and it trains in one: run it alone")
    if world > 1 and not ddp:
        raise ValueError(f"{world} processes run this point: train across them with ddp=true")
    if ddp and world == 1:
        raise ValueError("ddp=true trains across a point's processes, and this one runs as one: "
                         "hydra/launcher=local hydra.launcher.tasks_per_node=2")  # fmt: skip
    if batch % world:
        raise ValueError(f"batch={batch} does not split evenly across {world} processes")
    return rank, world


def train(
    training: Training,
    plan: Plan,
    tracker=None,
    *,
    observer: Observer | None = None,
    refused=None,
) -> list[dict]:
    """Train from the tracker's last checkpoint, if there is one, to plan.steps: a row per step
    (phase train: step, loss, accuracy, tokens_per_s, learning_rate and the observer's
    columns), logged through the tracker where the harness gives one; the rows not logged so.
    refused(error) -> the reason, or None (default: not_implemented): an error of the first
    step that it names raises Unsupported. The point's processes are checked against plan.ddp
    first (group)."""
    observer, refused = observer or Observer(), refused or not_implemented
    rank, world = group(tracker, plan.ddp, plan.batch)
    generator = torch.Generator().manual_seed(plan.seed)
    start = _restore(training, generator, tracker, observer)
    share = slice(rank * plan.batch // world, (rank + 1) * plan.batch // world)
    model = training.model
    trained = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    run = dataclasses.replace(training, model=trained)
    rows = []
    record = tracker.log if tracker is not None else rows.append
    model.train()
    for step in range(start + 1, plan.steps + 1):
        rate = schedule(step, plan.steps, plan.lr, plan.warmup)
        drawn = training.data.batch(generator, plan.batch)
        tokens, targets = (t.to(training.device) for t in drawn)
        observer.before(training)
        clock = time.perf_counter()
        try:
            logits, loss = train_step(run, rate, tokens[share], targets[share])
        except (RuntimeError, NotImplementedError) as error:
            reason = refused(error) if step == start + 1 else None
            if reason is None:
                raise
            raise Unsupported(reason) from error
        loss_value = loss.item()  # waits for the step on CUDA too
        seconds = time.perf_counter() - clock  # the step's: not its accuracy, nor the average
        loss_value, correct = averaged(loss_value, accuracy(logits, targets[share]), world)
        row = {"phase": "train", "step": step, "loss": loss_value, "accuracy": correct,
               "tokens_per_s": tokens.numel() / seconds}  # fmt: skip
        row |= observer.columns(training, step, tokens, targets, rate, row)
        row["learning_rate"] = rate
        if rank == 0:
            record(row)
        if tracker is not None and (step % plan.checkpoint_every == 0 or tracker.stopping):
            tracker.save(_state(training, generator, step) | observer.state(step))
    return rows


def not_implemented(error: Exception) -> str | None:
    """A first step's NotImplementedError (a kernel or path the device lacks, not declared in
    its capabilities) as the reason the run cannot train here; None for any other error."""
    return f"{type(error).__name__}: {error}" if isinstance(error, NotImplementedError) else None


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)


def train_step(training: Training, rate: float, tokens, targets) -> tuple:
    """One optimizer step at learning rate `rate`: the forward under autocast, the loss in
    float32 (the positions with a target only), the backward of the scaled loss and the step
    through the scaler (a plain backward and step where it is disabled); (logits, loss)."""
    for parameters in training.optimizer.param_groups:
        parameters["lr"] = rate
    with training.autocast:
        logits = training.model(tokens)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    training.optimizer.zero_grad(set_to_none=True)
    training.scaler.scale(loss).backward()
    training.scaler.step(training.optimizer)
    training.scaler.update()
    return logits, loss


def averaged(loss: float, correct: float, world: int) -> tuple[float, float]:
    """A step's loss and accuracy over the group's processes (each had as many answers)."""
    if world == 1:
        return loss, correct
    both = torch.tensor([loss, correct], dtype=torch.float64)
    torch.distributed.all_reduce(both)
    return tuple((both / world).tolist())


class Alone(Observer):
    """For the first `steps` steps, a copy of the model trained alone on the whole batch by rank
    0 of a group, from the same weights: how far its loss is from the group's
    (single_loss_diff) says that N processes train as one."""

    def __init__(self, training: Training, lr: float, steps: int):
        model = copy.deepcopy(training.model)
        self.copy = dataclasses.replace(training, model=model, optimizer=adamw(model, lr),
                                        scaler=copy.deepcopy(training.scaler))  # fmt: skip
        self.steps = steps

    def columns(self, training, step, tokens, targets, rate, row) -> dict:
        if self.copy is None or step > self.steps:
            return {}
        loss = train_step(self.copy, rate, tokens, targets)[1].item()
        return {"single_loss_diff": abs(loss - row["loss"])}

    def state(self, step: int) -> dict:
        if self.copy is None or step >= self.steps:
            return {}
        model, optimizer = self.copy.model, self.copy.optimizer
        return {"alone": {"model": model.state_dict(), "optimizer": optimizer.state_dict()}}

    def restore(self, saved: dict) -> None:
        """The copy as the checkpoint left it; none where it had stopped (past its steps)."""
        if saved.get("alone") is None:
            self.copy = None
            return
        self.copy.model.load_state_dict(saved["alone"]["model"])
        self.copy.optimizer.load_state_dict(saved["alone"]["optimizer"])


def schedule(step: int, steps: int, lr: float, warmup: int = WARMUP) -> float:
    """Linear warm-up over `warmup` steps, then a cosine decay from lr to lr / 10 at `steps`."""
    warm = min(1.0, step / warmup) if warmup else 1.0
    return lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The share of positions with a target whose most likely token is that target."""
    scored = targets != IGNORE
    return (logits.argmax(-1)[scored] == targets[scored]).float().mean().item()


@torch.no_grad()
def evaluate(training: Training, batch: int, seed: int) -> tuple[float, float]:
    """Loss and accuracy on EVAL_BATCHES held-out batches (a generator of their own)."""
    model, data = training.model, training.data
    model.eval()
    generator = torch.Generator().manual_seed(seed + EVAL_SEED)
    losses, correct = [], []
    for _ in range(EVAL_BATCHES):
        batches = data.batch(generator, batch, held_out=True)
        tokens, targets = (t.to(training.device) for t in batches)
        with training.autocast:
            logits = model(tokens)
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                      ignore_index=IGNORE).item())  # fmt: skip
        correct.append(accuracy(logits, targets))
    model.train()
    return sum(losses) / len(losses), sum(correct) / len(correct)


def _state(training: Training, generator: torch.Generator, step: int) -> dict:
    """What a checkpoint holds of the loop's: weights, optimizer, scaler, data generator, step."""
    return {"model": training.model.state_dict(), "optimizer": training.optimizer.state_dict(),
            "scaler": training.scaler.state_dict(), "data": generator.get_state(),
            "step": step}  # fmt: skip


def _restore(training: Training, generator: torch.Generator, tracker, observer: Observer) -> int:
    """Load the tracker's last checkpoint, if any, into the training, generator and observer:
    the step it was taken at (0 without one). A checkpoint without a scaler's state (one taken
    in float32 by an older run) leaves the scaler as it is."""
    saved = tracker.restore() if tracker is not None else None
    if saved is None:
        return 0
    training.model.load_state_dict(saved["model"])
    training.optimizer.load_state_dict(saved["optimizer"])
    if "scaler" in saved:
        training.scaler.load_state_dict(saved["scaler"])
    generator.set_state(saved["data"])
    observer.restore(saved)
    return saved["step"]
