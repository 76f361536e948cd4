"""The registry of attention paths: name -> function, with what each can do (Capabilities),
declared once where it registers and read by the model, the experiments and the tests instead
of its name.

A path's function is called as function(query, key, value, causal=..., window=...), with block=
(the tile size) and dropout= (attention dropout's probability) too where its signature names
them: a path that names no dropout has none, and one that names no block does not tile.

A new path is one register(name, function, ...) call: the model (ModelConfig.attention),
exp014's path, exp016's memory methods, exp017's attention and exp018's method then take its
name, and refuse a name never registered with one line that lists the registered ones
(check_path). Make the call in a module that the experiment imports; the measuring children of
exp016 and exp018 import the modules of every path registered in their parent first
(registering_modules). The built-in paths (octlm_experiments.attention's) register at the end of
this
module.
"""

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import Tensor

from octlm_experiments import attention

PATHS: dict[str, Callable[..., Tensor]] = {}
CAPABILITIES: dict[str, "Capabilities"] = {}
_REGISTERED_IN: dict[str, str] = {}  # path -> the module its function comes from
EVERY_DEVICE = frozenset({"cpu", "cuda"})
EVERY_DTYPE = frozenset({"float16", "bfloat16", "float32", "float64"})


@dataclass(frozen=True)
class Capabilities:
    """What an attention path can do.

    devices, dtypes: where its forward runs (device types, dtype names); backward: the devices
    where it has a backward pass (flex: CUDA only, in torch 2.13); compiles: its kernel is
    torch.compile's, compiled anew for each shape on first use (seconds each), so that its
    first call is its compilation, timed apart, and checks of many shapes run it where it does
    not compile (float64); prepare: what it builds once per shape before its first call and
    keeps (flex's block mask), as prepare(length_q, length_k, causal, window, device), timed
    apart too; windowed_from: per device type, the length from which it beats SDPA with a mask
    for a sliding window, as measured (ModelConfig's attention="auto" takes it from there on);
    tiles and dropout: read from its signature (block=, dropout=). Every path takes a window
    and grouped KV heads."""

    devices: frozenset[str] = EVERY_DEVICE
    dtypes: frozenset[str] = EVERY_DTYPE
    backward: frozenset[str] = EVERY_DEVICE
    compiles: bool = False
    prepare: Callable | None = None
    windowed_from: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    tiles: bool = False
    dropout: bool = False


def register(
    name: str,
    function: Callable[..., Tensor],
    *,
    devices: frozenset[str] | set[str] = EVERY_DEVICE,
    dtypes: frozenset[str] | set[str] = EVERY_DTYPE,
    backward: frozenset[str] | set[str] = EVERY_DEVICE,
    compiles: bool = False,
    prepare: Callable | None = None,
    windowed_from: Mapping[str, int] | None = None,
) -> None:
    """Make `function` the attention path `name`, for the model and every experiment that takes
    a path, with what it can do (Capabilities). A ValueError (one line) for a name already
    registered, or a function that cannot be called as PATHS says."""
    if name in PATHS:
        raise ValueError(f"the attention path {name!r} is registered already")
    try:
        inspect.signature(function).bind(None, None, None, causal=True, window=0)
    except TypeError as error:
        raise ValueError(
            f"attention path {name!r}: {function.__name__} cannot be called as "
            f"(query, key, value, *, causal, window): {error}"
        ) from None
    named = inspect.signature(function).parameters
    CAPABILITIES[name] = Capabilities(
        devices=frozenset(devices),
        dtypes=frozenset(dtypes),
        backward=frozenset(backward) & frozenset(devices),
        compiles=compiles,
        prepare=prepare,
        windowed_from=MappingProxyType(dict(windowed_from or {})),
        tiles="block" in named,
        dropout="dropout" in named,
    )
    PATHS[name] = function
    _REGISTERED_IN[name] = function.__module__


def unregister(name: str) -> None:
    """Take the path `name` out of the registry (a path registered for a while: a test's)."""
    del PATHS[name], CAPABILITIES[name], _REGISTERED_IN[name]


def registering_modules() -> list[str]:
    """The modules beside these whose functions are registered paths: what a measuring child
    imports first, so that it knows every path this process knows (octlm_experiments.measuring)."""
    here = {__name__, attention.__name__, "__main__"}
    return sorted({module for module in _REGISTERED_IN.values() if module not in here})


def unsupported(
    path: str, device: torch.device | str, dtype: torch.dtype | str, *, backward: bool = False
) -> str | None:
    """Why the path cannot run on the device in the dtype (with its backward pass too, where
    `backward`), in one line; None where it can."""
    can, kind = CAPABILITIES[path], torch.device(device).type
    named = str(dtype).removeprefix("torch.")
    if kind not in can.devices:
        return f"the attention path {path!r} does not run on {kind} (only {_listed(can.devices)})"
    if named not in can.dtypes:
        return f"the attention path {path!r} does not take {named} (only {_listed(can.dtypes)})"
    if backward and kind not in can.backward:
        where = f"it has one on {_listed(can.backward)}" if can.backward else "it has none"
        return f"the attention path {path!r} has no backward pass on {kind} ({where})"
    return None


def check_path(value: str, name: str = "path", *, also: tuple[str, ...] = ()) -> None:
    """A one-line ValueError unless `value` names a registered path, or one of `also` (what a
    caller takes beside them: the model's "auto"); it lists them all, as the harness lists a
    Literal's choices."""
    choices = (*also, *PATHS)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def attend(
    path: str,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    causal: bool = True,
    window: int = 0,
    block: int | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """Attention through the registered `path`: the one dispatch on a path's name. block is the
    tile size of a path that tiles (None: its default); a device, dtype or dropout > 0 that the
    path does not take is a NotImplementedError of one line."""
    check_path(path)
    can = CAPABILITIES[path]
    reason = unsupported(path, query.device, query.dtype)
    if reason is None and dropout > 0 and not can.dropout:
        reason = f"the attention path {path!r} has no attention dropout: use dropout=0 or another"
    if reason:
        raise NotImplementedError(reason)
    options = {"block": block} if can.tiles and block is not None else {}
    if can.dropout:
        options["dropout"] = dropout
    return PATHS[path](query, key, value, causal=causal, window=window, **options)


def _listed(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) or "none"


# windowed_from, as measured. From 2,048 on, a sliding window on the CPU runs faster tiled than
# through SDPA's (L, L) mask: exp018_window, one forward, 8 heads of width 32, float32, 2 CPU
# cores, windows 64 to 1,024: at 2,048 tiled is 1.3x to 3x faster, at 16,384 10x to 24x, in
# 20 MiB where the mask path takes 2.5 GiB; at 1,024 the two take about the same time; below,
# the mask path is 1.4x to 3x faster. From 4,096 on CUDA, flex: exp018_window on an H200
# (torch 2.11, the same shapes): at 4,096 flex is 4.8x to 13x faster (windows 1,024 to 64), at
# 16,384 17x to 65x, in 17 MiB where the mask path takes 2,560 MiB; flex's backward there
# passes exp014_equivalence's gradient claims. It compiles for about 6 s per new shape. Shorter
# lengths were not measured there.
register("naive", attention.naive_attention)
register("sdpa", attention.sdpa_attention)
register("tiled", attention.tiled_attention, windowed_from={"cpu": 2048})
register("flex", attention.flex_attention, backward={"cuda"}, compiles=True,
         prepare=attention.flex_block_mask, windowed_from={"cuda": 4096})  # fmt: skip
