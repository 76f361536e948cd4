"""Tiled and SDPA attention against the naive reference, and tiled against SDPA as exp014 does."""

import pytest
import torch
from torch.testing import assert_close

from experiments.attention import (
    attention_mask,
    naive_attention,
    repeat_kv,
    sdpa_attention,
    tiled_attention,
)

# (B, H, H_kv, L, D, block): odd lengths, a block longer than the sequence, blocks of one.
SHAPES = [
    (1, 8, 8, 128, 32, 64),
    (2, 4, 4, 37, 16, 8),
    (3, 2, 2, 100, 8, 128),
    (1, 1, 1, 1, 4, 16),
    (2, 3, 3, 17, 8, 1),
    (1, 8, 2, 65, 16, 16),
    (2, 4, 1, 50, 8, 7),
]


def qkv(batch, heads, kv_heads, length, head_dim, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, h, length, head_dim, generator=generator, dtype=dtype)
        for h in (heads, kv_heads, kv_heads)
    )


@pytest.mark.parametrize("causal, window", [(True, 0), (False, 0), (True, 1), (True, 5)])
@pytest.mark.parametrize("shape", SHAPES)
def test_tiled_and_sdpa_match_naive_in_float64(shape, causal, window):
    *dims, block = shape
    query, key, value = qkv(*dims)
    expected = naive_attention(query, key, value, causal=causal, window=window)
    tiled = tiled_attention(query, key, value, block, causal=causal, window=window)
    sdpa = sdpa_attention(query, key, value, causal=causal, window=window)
    assert_close(tiled, expected, rtol=1e-12, atol=1e-12)
    assert_close(sdpa, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("length", [128, 512, 1024, 333])
@pytest.mark.parametrize("block", [64, 128, 256, 2000])
def test_tiled_matches_sdpa_in_float32_at_the_seeds_tolerance(length, block):
    query, key, value = qkv(1, 8, 8, length, 32, dtype=torch.float32, seed=length + block)
    difference = tiled_attention(query, key, value, block) - sdpa_attention(query, key, value)
    assert difference.abs().max().item() <= 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_keeps_half_precision_dtypes_and_accumulates_in_float32(dtype):
    query, key, value = qkv(2, 4, 2, 70, 16, dtype=dtype)
    tiled = tiled_attention(query, key, value, 16)
    assert tiled.dtype == dtype
    expected = naive_attention(*(t.double() for t in (query, key, value)))
    assert_close(tiled.double(), expected, rtol=0, atol=1e-2)


def test_tiled_takes_any_leading_dims_and_unequal_query_and_key_lengths():
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 3, 4, 9, 8, generator=generator, dtype=torch.float64)
    key, value = (
        torch.randn(2, 3, 4, 13, 8, generator=generator, dtype=torch.float64) for _ in range(2)
    )
    for causal in (True, False):
        assert_close(
            tiled_attention(query, key, value, 4, causal=causal),
            naive_attention(query, key, value, causal=causal),
        )


def test_the_mask_and_window_semantics():
    mask = attention_mask(5, 5, causal=True, window=2)
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    ).bool()
    assert torch.equal(mask, expected)
    assert attention_mask(5, 5, causal=False, window=0) is None


def test_repeat_kv_gives_each_query_head_its_group():
    key = torch.arange(2.0).view(1, 2, 1, 1).expand(1, 2, 3, 4)
    repeated, _ = repeat_kv(key, key, heads=6)
    assert repeated[0, :, 0, 0].tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="do not divide"):
        repeat_kv(key, key, heads=5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block": 0}, "block must be positive"),
        ({"window": -1}, "window must be"),
        ({"window": 4, "causal": False}, "needs causal"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, message):
    query, key, value = qkv(1, 2, 2, 8, 4)
    with pytest.raises(ValueError, match=message):
        tiled_attention(query, key, value, **kwargs)
