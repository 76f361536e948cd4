"""A training experiment of a user's own, as docs/training.md has one write it: a small
network fitting a fixed teacher, a row per step through the tracker (phase train), a
checkpoint every `save_every` steps, and a held-out evaluation row (phase eval) at the end."""

import torch


def student(*, lr: float, width: int, steps: int = 30, save_every: int = 10, seed: int = 0,
            tracker=None) -> list[dict]:  # fmt: skip
    torch.manual_seed(1234)
    teacher, held_out = torch.nn.Linear(4, 1), torch.randn(64, 4)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, 1))  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    state = tracker.restore() if tracker is not None else None
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    rows = []
    for step in range(state["step"] + 1 if state else 0, steps):
        batch = torch.randn(32, 4, generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.mse_loss(model(batch), teacher(batch).detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        row = {"phase": "train", "step": step, "loss": loss.item()}
        tracker.log(row) if tracker is not None else rows.append(row)
        if tracker is not None and (step + 1) % save_every == 0:
            tracker.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "step": step})  # fmt: skip
    with torch.no_grad():
        held = torch.nn.functional.mse_loss(model(held_out), teacher(held_out)).item()
    return [*rows, {"phase": "eval", "step": steps, "loss": held}]
