"""exp014_tiled: the tiled (FlashAttention-style) forward against PyTorch's fused attention.

Both are also measured against an independent float64 reference (naive attention in float64 on
float64 copies of the same inputs), so that an error both share, or SDPA's own, shows too.
"""

import torch

from octlm_experiments import checks
from octlm_experiments.attention import reference_attention, sdpa_attention, tiled_attention


def check(*, length: int, block: int, batch: int, heads: int, head_dim: int, device: str) -> None:
    """Reject out-of-domain values before anything runs."""
    checks.positive(length=length, block=block, batch=batch, heads=heads, head_dim=head_dim)
    checks.device(device)


def run(
    *,
    length: int,
    block: int,
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 32,
    dtype: checks.Dtype = "float32",
    causal: bool = True,
    seed: int = 0,
    device: str = "cpu",
) -> list[dict]:
    """One (B, H, L, D) attention through tiled_attention and SDPA: their largest and mean absolute
    differences, and each one's largest error against the float64 reference (tiled_err64,
    sdpa_err64)."""
    check(length=length, block=block, batch=batch, heads=heads, head_dim=head_dim, device=device)
    generator = torch.Generator(device).manual_seed(seed)
    shape = (batch, heads, length, head_dim)  # (B, H, L, D)
    query, key, value = (
        torch.randn(shape, generator=generator, dtype=getattr(torch, dtype), device=device)
        for _ in range(3)
    )
    sdpa = sdpa_attention(query, key, value, causal=causal)
    tiled = tiled_attention(query, key, value, block, causal=causal)
    (reference,) = reference_attention(query, key, value, causal=causal)
    difference = (tiled - sdpa).abs()
    return [
        {
            "max_abs_diff": difference.max().item(),
            "mean_abs_diff": difference.float().mean().item(),
            "tiled_err64": (tiled.double() - reference).abs().max().item(),
            "sdpa_err64": (sdpa.double() - reference).abs().max().item(),
        }
    ]
