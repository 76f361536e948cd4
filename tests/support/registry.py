"""What the oracle tests run on: every registered attention path (octlm_experiments.paths'
registry, with any path that a plugin registers first: `pytest -p MODULE`), as its declared
capabilities allow, read when the tests are collected. A path registered in the registry is then
checked against the float64 reference forward and backward, with and without a window, in the
model and in training, without a line of the tests changing.

A path whose kernel torch.compile makes runs its eager implementation in float64 here, slow
itself (FlexAttention's takes seconds for a shape's first call), so that its checks are slow
tests (make test); in float32, where it compiles, it is checked at one shape each (compiling)."""

import pytest
import torch

from octlm_experiments.paths import CAPABILITIES

REFERENCE = "naive"  # the eager oracle itself: compared with the float64 reference, not with it


def names(*, backward_on: str | None = None, others: bool = False) -> list[str]:
    """The registered paths; backward_on: those with a backward pass on that device; others:
    all but the reference path."""
    return [
        name
        for name, can in CAPABILITIES.items()
        if (backward_on is None or backward_on in can.backward)
        and not (others and name == REFERENCE)
    ]


def paths(**which) -> list:
    """names(**which) as pytest's parameters, a path that compiles as a slow one."""
    return [pytest.param(name, marks=_marks(name), id=name) for name in names(**which)]


def without_backward_on(device: str) -> list:
    """The paths with no backward pass on the device, as pytest's parameters."""
    has = set(names(backward_on=device))
    return [param for param in paths() if param.values[0] not in has]


def path_dtypes(**which) -> list:
    """(path, dtype) for each of names(**which): float64, and float32 too for a path that does
    not compile."""
    return [
        pytest.param(
            name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}", marks=_marks(name)
        )  # fmt: skip
        for name in names(**which)
        for dtype in (torch.float64, torch.float32)
        if dtype == torch.float64 or not CAPABILITIES[name].compiles
    ]


def compiling() -> list[str]:
    """The paths whose kernel torch.compile makes, anew for each shape (seconds each)."""
    return [name for name, can in CAPABILITIES.items() if can.compiles]


def _marks(name: str) -> list:
    return [pytest.mark.slow] if CAPABILITIES[name].compiles else []
