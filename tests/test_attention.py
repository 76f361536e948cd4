"""Tiled, SDPA and FlexAttention against the naive reference, and tiled against SDPA as exp014
does; the registry of paths, that a path registered there is every experiment's to take, and
the one visibility rule."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from shapes import SHAPES
from torch.testing import assert_close

from experiments import equivalence
from experiments.attention import (
    PATHS,
    TiledAttention,
    Tiling,
    attend,
    attention_mask,
    flex_attention,
    flex_block_mask,
    naive_attention,
    reference_attention,
    register,
    repeat_kv,
    sdpa_attention,
    tiled_attention,
    visible,
)
from experiments.model import ModelConfig, OctLM
from harness.errors import BadInput
from harness.signature import Experiment

CONF = Path(__file__).resolve().parent.parent / "conf" / "experiment"


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


# Rounding a float32 result to the dtype costs at most its unit roundoff, relative: 2^-8 for
# bfloat16, 2^-11 for float16. Naive attention computed in the half dtype is off by some 1,000
# times that on these inputs.
UNIT_ROUNDOFF = {torch.bfloat16: 2**-8, torch.float16: 2**-11}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_keeps_half_precision_dtypes_and_accumulates_in_float32(dtype):
    query, key, value = qkv(2, 4, 2, 70, 16, dtype=dtype)
    tiled = tiled_attention(query, key, value, 16)
    assert tiled.dtype == dtype
    expected = naive_attention(*(t.double() for t in (query, key, value)))
    assert_close(tiled.double(), expected, rtol=UNIT_ROUNDOFF[dtype], atol=1e-6)


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
    with pytest.raises(ValueError, match="must divide"):
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


@pytest.mark.parametrize("path", ["naive", "sdpa", "tiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_row_that_sees_no_key_is_zero_with_finite_gradients(path, dtype):
    # 64 queries, 16 keys, window 8: query rows 23 to 63 see no key (top-left causal).
    query, key, value = (t.requires_grad_() for t in qkv(1, 4, 2, 64, 8, dtype=dtype))
    key, value = (t.detach()[..., :16, :].requires_grad_() for t in (key, value))
    blind = ~attention_mask(64, 16, causal=True, window=8).any(dim=-1)
    assert blind.nonzero().flatten().tolist() == list(range(23, 64))
    output = attend(path, query, key, value, causal=True, window=8, block=8)
    assert torch.equal(output[..., blind, :], torch.zeros_like(output[..., blind, :]))
    # A loss over the rows that see keys only: every gradient finite, the blind rows' dq zero.
    grads = torch.autograd.grad(output[..., ~blind, :].sum(), (query, key, value))
    assert all(torch.isfinite(grad).all() for grad in grads)
    assert not grads[0][..., blind, :].any()
    (expected, *expected_grads) = reference_attention(
        query, key, value, torch.ones_like(output) * ~blind[:, None], causal=True, window=8
    )
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    assert_close(output.double(), expected, **tolerance)
    for grad, want in zip(grads, expected_grads, strict=True):
        assert_close(grad.double(), want, **tolerance)


@pytest.mark.parametrize("causal, window", [(True, 0), (False, 0), (True, 5)])
def test_the_float64_reference_is_naive_attention_in_float64_head_by_head(causal, window):
    query, key, value = (t.requires_grad_() for t in qkv(2, 4, 2, 33, 8, dtype=torch.float32))
    grad_output = torch.randn(2, 4, 33, 8, generator=torch.Generator().manual_seed(5))
    wide = [t.detach().double().requires_grad_() for t in (query, key, value)]
    want = naive_attention(*wide, causal=causal, window=window)
    want_grads = torch.autograd.grad(want, wide, grad_output.double())
    got = reference_attention(query, key, value, grad_output, causal=causal, window=window)
    assert all(t.dtype == torch.float64 for t in got)
    for result, expected in zip(got, (want, *want_grads), strict=True):
        assert_close(result, expected, rtol=1e-12, atol=1e-12)
    (alone,) = reference_attention(query, key, value, causal=causal, window=window)
    assert torch.equal(alone, got[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tiling_saves_a_float32_log_sum_exp(dtype):
    query, key, value = (t.requires_grad_() for t in qkv(1, 2, 2, 40, 8, dtype=dtype))
    output = TiledAttention.apply(query, key, value, Tiling(16, True, 0))
    lse = output.grad_fn.saved_tensors[-1]
    assert output.dtype == dtype and lse.dtype == torch.float32


@pytest.mark.parametrize("causal, window", [(True, 0), (False, 0), (True, 1), (True, 5)])
@pytest.mark.parametrize("shape", SHAPES)
def test_flex_matches_naive_in_float64(shape, causal, window):
    """Its block mask and grouped heads, through FlexAttention's eager implementation (the CPU
    kernel has no float64); the compiled kernel is checked in float32 below."""
    query, key, value = qkv(*shape[:-1])
    expected = naive_attention(query, key, value, causal=causal, window=window)
    flex = flex_attention(query, key, value, causal=causal, window=window)
    assert_close(flex, expected, rtol=1e-12, atol=1e-12)


def test_flex_takes_leading_dims_and_unequal_lengths_and_zeroes_blind_rows():
    query = torch.randn(2, 3, 4, 64, 8, dtype=torch.float64)  # (.., H, L_q, D)
    key, value = (torch.randn(2, 3, 2, 16, 8, dtype=torch.float64) for _ in range(2))
    flex = flex_attention(query, key, value, window=8)
    assert_close(flex, naive_attention(query, key, value, window=8), rtol=1e-12, atol=1e-12)
    assert not flex[..., 23:, :].any(), "query rows 23 on see no key"


@pytest.mark.slow
@pytest.mark.parametrize("heads, kv_heads, length, window", [(8, 2, 300, 64), (4, 4, 130, 0)])
def test_compiled_flex_is_as_accurate_as_sdpa_in_float32(heads, kv_heads, length, window):
    query, key, value = qkv(1, heads, kv_heads, length, 32, dtype=torch.float32, seed=length)
    (exact,) = reference_attention(query, key, value, window=window)
    flex = flex_attention(query, key, value, window=window, compiled=True)
    sdpa = sdpa_attention(query, key, value, window=window)
    flex_error, sdpa_error = ((t.double() - exact).abs().max().item() for t in (flex, sdpa))
    assert 1e-10 < flex_error <= 2 * sdpa_error + 1e-6


def test_the_block_mask_skips_the_blocks_outside_the_window():
    # 1,024 positions in blocks of 128, 8 x 8 blocks: causal keeps the 36 on and below the
    # diagonal; a window of 128 keeps the 8 on it and the 7 just below.
    assert flex_block_mask(1024, 1024, True, 0, "cpu").sparsity() == pytest.approx(100 * 28 / 64)
    assert flex_block_mask(1024, 1024, True, 128, "cpu").sparsity() == pytest.approx(100 * 49 / 64)
    assert flex_block_mask(1024, 1024, False, 0, "cpu") is None


def test_flex_has_no_backward_on_the_cpu():
    query, key, value = (t.requires_grad_() for t in qkv(1, 2, 2, 16, 8, dtype=torch.float32))
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(query, key, value, window=4)


def test_the_visibility_rule_is_every_paths_mask():
    """attention_mask, the tiled path's hide and the flex block mask's rule are one rule."""
    rows, columns = torch.arange(9).unsqueeze(1), torch.arange(7).unsqueeze(0)
    for window in (0, 1, 3):
        rule = visible(rows, columns, causal=True, window=window)
        assert torch.equal(attention_mask(9, 7, causal=True, window=window), rule)
        hidden = Tiling(16, True, window).hide(torch.zeros(9, 7), 0, 0) == float("-inf")
        assert torch.equal(~hidden, rule)
        flex_rule = flex_block_mask(9, 7, True, window, "cpu").mask_mod(0, 0, rows, columns)
        assert torch.equal(flex_rule, rule)
    assert visible(rows, columns, causal=False, window=0).all()


@pytest.fixture
def naive_copy():
    """A new path, "naive_copy" (naive attention that counts its calls), registered for the
    test and removed after it."""
    calls = []

    def copy(query, key, value, *, causal=True, window=0, dropout=0.0):
        calls.append(query.shape)
        return naive_attention(query, key, value, causal=causal, window=window, dropout=dropout)

    register("naive_copy", copy)
    yield calls
    del PATHS["naive_copy"]


def test_a_registered_path_is_the_models_and_exp014s_to_take(naive_copy):
    config = ModelConfig(vocab_size=32, width=16, n_layers=2, n_heads=2, n_kv_heads=1,
                         max_length=8, attention="naive_copy", window=3)  # fmt: skip
    torch.manual_seed(0)
    model = OctLM(config).eval()
    naive = OctLM(replace(config, attention="naive")).eval()
    naive.load_state_dict(model.state_dict())
    tokens = torch.arange(8).unsqueeze(0)
    assert torch.equal(model(tokens), naive(tokens)) and len(naive_copy) == 2  # one a layer
    point = dict(kv_heads=2, heads=4, width=32, layers=1, vocab_size=64, length=9, block=8)
    [row] = equivalence.run(path="naive_copy", dtype="float64", **point)
    assert row["max_abs_diff"] == 0 and row["max_grad_diff"] == 0, "the same computation"


def experiment(name: str) -> tuple[Experiment, dict]:
    """An experiment as the harness loads it from its config, and its config's own values."""
    config = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    values = {k: v for k, v in config.items() if k not in ("experiment", "hydra")}
    return Experiment.load(config["experiment"]), values


# Each experiment that takes a path: the parameter, and the names it takes beside the paths.
TAKING_A_PATH = [
    ("exp014_equivalence", "path", ""),
    ("exp016_backward_memory", "method", "sdpa_math, sdpa_flash, "),
    ("exp017_recall", "attention", "auto, "),
    ("exp018_window", "method", ""),
]


@pytest.mark.parametrize("name, parameter, beside", TAKING_A_PATH)
def test_a_registered_path_is_every_experiments_to_take(naive_copy, name, parameter, beside):
    """Taken as the harness checks a point; a name never registered refused in one line that
    lists the registered ones, as a Literal's bad value is."""
    loaded, values = experiment(name)
    assert loaded.params({**values, parameter: "naive_copy"})[parameter] == "naive_copy"
    with pytest.raises(BadInput) as refused:
        loaded.params({**values, parameter: "flash"})
    paths = "naive, sdpa, tiled, flex, naive_copy"
    assert str(refused.value) == f"{parameter} must be one of {beside}{paths}, got 'flash'"


def test_an_unknown_path_is_refused_in_one_line_that_lists_the_paths():
    with pytest.raises(ValueError) as refused:
        ModelConfig(attention="flash")
    assert str(refused.value) == (
        "attention must be one of auto, naive, sdpa, tiled, flex, got 'flash'"
    )
    with pytest.raises(ValueError, match="^path must be one of naive, sdpa, tiled, flex, got 'x'$"):
        equivalence.run(path="x", length=4)
    with pytest.raises(ValueError, match="path must be one of"):
        attend("x", *qkv(1, 2, 2, 4, 4))


def test_a_name_is_registered_once_and_a_path_takes_the_one_signature():
    with pytest.raises(ValueError, match="'tiled' is registered already"):
        register("tiled", naive_attention)
    with pytest.raises(ValueError, match="cannot be called as"):
        register("no_window", lambda query, key, value, causal: query)
    assert "no_window" not in PATHS


def test_attend_passes_block_and_dropout_only_to_a_path_that_names_them():
    query, key, value = qkv(1, 2, 2, 12, 4)
    assert_close(attend("tiled", query, key, value, block=5), naive_attention(query, key, value))
    assert_close(attend("sdpa", query, key, value, block=5), naive_attention(query, key, value))
    with pytest.raises(NotImplementedError, match="'flex' has no attention dropout"):
        attend("flex", query, key, value, dropout=0.1)
