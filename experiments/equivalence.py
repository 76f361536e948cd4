"""exp014_equivalence: the whole model through a fast attention path against the naive reference.

Two copies of one OctLM (same weights, eval mode, no dropout), one with attention="naive" and one
with attention=path, see the same random tokens. The row says how far apart their logits are and
how far apart the parameter gradients of one next-token cross-entropy step are.
"""

from dataclasses import replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from experiments import checks
from experiments.model import ModelConfig, OctLM


def check(
    *,
    kv_heads: int,
    heads: int,
    length: int,
    batch: int,
    width: int,
    layers: int,
    vocab_size: int,
    window: int,
    block: int,
    device: str,
    **_,
) -> None:
    """Raise a one-line ValueError if the point is outside the experiment's domain; no work done."""
    checks.positive(kv_heads=kv_heads, heads=heads, length=length, batch=batch, width=width,
                    layers=layers, vocab_size=vocab_size, block=block)  # fmt: skip
    checks.heads(heads, kv_heads)
    if width % heads or (width // heads) % 2:
        raise ValueError(f"width={width} must be an even multiple of heads={heads} (rotary)")
    checks.window(window, causal=True)
    checks.device(device)


def run(
    *,
    kv_heads: int = 8,
    heads: int = 8,
    path: Literal["sdpa", "tiled"] = "sdpa",
    length: int = 64,
    batch: int = 2,
    width: int = 64,
    layers: int = 2,
    vocab_size: int = 256,
    window: int = 0,
    block: int = 16,
    dtype: Literal["float32", "float64"] = "float32",
    seed: int = 0,
    device: str = "cpu",
) -> list[dict]:
    """One row: logits and gradient differences between attention=path and attention="naive"."""
    check(**locals())  # locals() is exactly the keyword arguments here
    config = ModelConfig(
        vocab_size=vocab_size,
        width=width,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=kv_heads,
        max_length=length,
        attention="naive",
        window=window,
        tiled_block=block,
    )
    floating = getattr(torch, dtype)
    torch.manual_seed(seed)
    reference = OctLM(config).to(device=device, dtype=floating).eval()
    candidate = OctLM(replace(config, attention=path)).to(device=device, dtype=floating).eval()
    candidate.load_state_dict(reference.state_dict())
    # Drawn on the CPU so that a point's tokens are the same on every device.
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab_size, (batch, length + 1), generator=generator).to(device)
    expected, expected_grads = _training_step(reference, tokens)
    actual, actual_grads = _training_step(candidate, tokens)
    grad_diffs = [a - e for a, e in zip(actual_grads, expected_grads, strict=True)]
    return [
        {
            "max_abs_diff": _largest([actual - expected]),
            "mean_abs_diff": (actual - expected).abs().mean().item(),
            "max_grad_diff": _largest(grad_diffs),
            "max_abs_logit": _largest([expected]),
            "max_abs_grad": _largest(expected_grads),
        }
    ]


def _training_step(model: OctLM, tokens: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Logits (B, L, V) for tokens[:, :-1] and the gradients of their next-token loss."""
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return logits.detach(), [parameter.grad for parameter in model.parameters()]


def _largest(tensors: list[Tensor]) -> float:
    """The largest absolute value over all the tensors."""
    return max(tensor.abs().max().item() for tensor in tensors)
