"""What the oracle tests run on: every registered attention path (experiments.attention's
registry, with any path that a plugin registers first: `pytest -p MODULE`), as its declared
capabilities allow, read when the tests are collected. A path registered in the registry is then
checked against the float64 reference forward and backward, with and without a window, in the
model and in training, without a line of the tests changing."""

import pytest
import torch

from experiments.attention import CAPABILITIES

REFERENCE = "naive"  # the eager oracle itself: compared with the float64 reference, not with it


def paths(*, backward_on: str | None = None, others: bool = False) -> list[str]:
    """The registered paths; backward_on: those with a backward pass on that device; others:
    all but the reference path."""
    return [
        name
        for name, can in CAPABILITIES.items()
        if (backward_on is None or backward_on in can.backward)
        and not (others and name == REFERENCE)
    ]


def compiling() -> list[str]:
    """The paths whose kernel torch.compile makes, anew for each shape (seconds each): checked in
    float32, where it runs, at one shape each (slow tests); elsewhere in float64, where it does
    not compile."""
    return [name for name, can in CAPABILITIES.items() if can.compiles]


def path_dtypes(paths_: list[str]) -> list:
    """(path, dtype) for each path: float64, and float32 too for a path that does not compile."""
    return [
        pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")
        for name in paths_
        for dtype in (torch.float64, torch.float32)
        if dtype == torch.float64 or not CAPABILITIES[name].compiles
    ]
