"""Checks of an experiment's parameters: one line (a ValueError) for a value out of its domain.

Types (int, float, bool, a Literal's choices) are the harness's to check, from the experiment
function's signature, for every point before anything runs; these say what a type cannot.
"""

import torch


def positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")


def not_negative(**values: float | None) -> None:
    """Each value is 0 or more (None passes: it means a default)."""
    for name, value in values.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} must be 0 or more, got {value}")


def heads(heads: int, kv_heads: int) -> None:
    if heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} must divide heads={heads}")


def window(window: int, causal: bool) -> None:
    not_negative(window=window)
    if window > 0 and not causal:
        raise ValueError("a sliding window (window > 0) needs causal attention")


def device(device: str, *, auto: bool = False) -> None:
    """cpu, cuda or cuda:N (and auto, where auto picks cuda when there is one)."""
    kind, _, index = device.partition(":")
    named = device in ("cpu", "cuda") or (kind in ("cpu", "cuda") and index.isdigit())
    if not (named or (auto and device == "auto")):
        names = "auto, cpu, cuda or cuda:N" if auto else "cpu, cuda or cuda:N"
        raise ValueError(f"device must be {names}, got {device!r}")


def usable_device(device: str) -> torch.device:
    """The torch device a point runs on ("auto": cuda when there is one, a bare "cuda" is
    cuda:0); RuntimeError when it asks for CUDA on a machine without it, so the point fails
    rather than answers. Asks torch whether CUDA is there without initializing it here."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{device}: CUDA is not available on this machine")
        return torch.device("cuda", resolved.index or 0)
    return resolved
