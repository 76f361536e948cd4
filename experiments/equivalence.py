"""exp014_equivalence: the whole model through a fast attention path against the naive reference.

Two copies of one OctLM (same weights, eval mode, no dropout), one with attention="naive" and one
with attention=path, see the same random tokens. The row says how far apart their logits are and
how far apart the parameter gradients of one next-token cross-entropy step are. A third copy, in
float64 with attention="naive", is the independent reference: each of the two paths' errors
against it (path_err64, naive_err64; path_grad_err64, naive_grad_err64) tells which one drifted.
A path without a backward on the device (flex on the CPU in torch 2.13) has its logits compared
and no gradient figures: grad_unsupported says why (octlm_experiments.paths.unsupported). A path
that
does not run on the device or in the dtype at all is an unsupported row saying so.
"""

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from octlm_experiments import checks, paths
from octlm_experiments.model import ModelConfig, OctLM


def check(
    *,
    kv_heads: int,
    heads: int,
    path: str,
    length: int,
    batch: int,
    width: int,
    layers: int,
    vocab_size: int,
    window: int,
    block: int,
    device: str,
) -> None:
    """Raise a one-line ValueError if the point is outside the experiment's domain; no work done."""
    paths.check_path(path)
    checks.positive(length=length, batch=batch, layers=layers, vocab_size=vocab_size, block=block)
    checks.heads(heads, kv_heads)
    checks.rotary_width(width, heads)
    checks.window(window, causal=True)
    checks.device(device)


def run(
    *,
    kv_heads: int = 8,
    heads: int = 8,
    path: str = "sdpa",
    length: int = 256,
    batch: int = 2,
    width: int = 256,
    layers: int = 4,
    vocab_size: int = 512,
    window: int = 0,
    block: int = 64,
    dtype: checks.Dtype = "float32",
    seed: int = 0,
    device: str = "cpu",
) -> list[dict]:
    """One row: logits and gradient differences between attention=path and attention="naive", and
    each one's largest errors against the float64 naive model."""
    checks.point(check, locals())
    floating = getattr(torch, dtype)
    refused = paths.unsupported(path, device, floating)
    if refused:
        return [{"status": "unsupported", "error": refused}]
    config = ModelConfig(vocab_size=vocab_size, width=width, n_layers=layers, n_heads=heads,
                         n_kv_heads=kv_heads, max_length=length, attention="naive",
                         window=window, tiled_block=block)  # fmt: skip
    models = _models(config, path, floating, seed, device)
    # Drawn on the CPU so that a point's tokens are the same on every device.
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab_size, (batch, length + 1), generator=generator).to(device)
    (expected, expected_grads), (exact, exact_grads) = (
        _training_step(model, tokens) for model in (models[0], models[2])
    )
    unsupported = paths.unsupported(path, device, floating, backward=True)
    if unsupported:  # no backward on this device: its logits alone are compared
        with torch.no_grad():
            actual, actual_grads = models[1](tokens[:, :-1]), None
    else:
        actual, actual_grads = _training_step(models[1], tokens)
    row = {
        "max_abs_diff": _largest([actual - expected]),
        "mean_abs_diff": (actual - expected).abs().mean().item(),
        "max_abs_logit": _largest([expected]),
        "max_abs_grad": _largest(expected_grads),
        "path_err64": _largest([actual.double() - exact]),
        "naive_err64": _largest([expected.double() - exact]),
        "naive_grad_err64": _largest(_differences(expected_grads, exact_grads)),
    }
    if unsupported:
        return [row | {"grad_unsupported": unsupported}]
    grads = {"max_grad_diff": _differences(actual_grads, expected_grads),
             "path_grad_err64": _differences(actual_grads, exact_grads)}  # fmt: skip
    return [row | {name: _largest(differences) for name, differences in grads.items()}]


def _models(config: ModelConfig, path: str, dtype: torch.dtype, seed: int, device: str) -> list:
    """The reference (naive), the candidate (path), both in dtype, and the float64 reference of
    both (naive): one set of weights, made from the seed."""
    torch.manual_seed(seed)
    weights = OctLM(config).state_dict()
    return [
        _model(replace(config, attention=attention), weights, precision, device)
        for attention, precision in (("naive", dtype), (path, dtype), ("naive", torch.float64))
    ]


def _model(config: ModelConfig, weights: dict, dtype: torch.dtype, device: str) -> OctLM:
    """An OctLM with the given weights, in dtype on device, in eval mode."""
    model = OctLM(config)
    model.load_state_dict(weights)
    return model.to(device=device, dtype=dtype).eval()


def _differences(tensors: list[Tensor], references: list[Tensor]) -> list[Tensor]:
    """Each tensor minus its reference, in the wider of the two dtypes."""
    return [t.to(r.dtype) - r for t, r in zip(tensors, references, strict=True)]


def _training_step(model: OctLM, tokens: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Logits (B, L, V) for tokens[:, :-1] and the gradients of their next-token loss."""
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return logits.detach(), [parameter.grad for parameter in model.parameters()]


def _largest(tensors: list[Tensor]) -> float:
    """The largest absolute value over all the tensors."""
    return max(tensor.abs().max().item() for tensor in tensors)
