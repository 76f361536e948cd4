"""The domain of every parameter: one rule, one function, one message (a one-line ValueError).

Types (int, float, bool, a Literal's choices) are the harness's to check, from the experiment
function's signature, for every point before anything runs; these say what a type cannot. The
experiments' `check` functions and the library (attention.py, model.py) call the same rules, so
a value is refused with the same words wherever it enters.
"""

import inspect
from collections.abc import Callable
from typing import Literal

import torch

Dtype = Literal["float32", "float64", "bfloat16", "float16"]  # the dtypes the experiments take


def point(check: Callable[..., None], values: dict) -> None:
    """check(...) with the values it names, from a run function's locals(): a check names only
    the parameters it looks at, as the harness calls it."""
    check(**{name: values[name] for name in inspect.signature(check).parameters})


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
    """Grouped-query attention: each key/value head serves heads / kv_heads query heads."""
    positive(heads=heads, kv_heads=kv_heads)
    if heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} must divide heads={heads}")


def window(window: int, causal: bool) -> None:
    """0 (off), or how many keys a query sees, itself included: only with causal attention."""
    not_negative(window=window)
    if window > 0 and not causal:
        raise ValueError("a sliding window (window > 0) needs causal attention")


def rotary_width(width: int, heads: int) -> None:
    """Rotary positions turn pairs of a head's channels: the head width width / heads is even."""
    positive(width=width, heads=heads)
    if width % heads or (width // heads) % 2:
        raise ValueError(f"width={width} must be an even multiple of heads={heads} (rotary)")


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
    rather than answers. Asking torch whether CUDA is there initializes the CUDA driver (not a
    context) in this process: call it where a later fork does not matter, as the measuring
    children do."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{device}: CUDA is not available on this machine")
        return torch.device("cuda", resolved.index or 0)
    return resolved
