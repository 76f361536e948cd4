"""The tiled backward: gradcheck, gradients against SDPA and naive, what it saves; exp016."""

import inspect
import math

import pytest
import torch
from shapes import SHAPES as ATTENTION_SHAPES
from torch.testing import assert_close

from harness import store
from octlm_experiments import checks, tiled_backward
from octlm_experiments.attention import (
    TiledAttention,
    Tiling,
    naive_attention,
    sdpa_attention,
    tiled_attention,
)
from octlm_experiments.model import ModelConfig, OctLM

# (B, H, H_kv, L, D, block, causal, window)
GRADCHECK_POINTS = {
    "causal": (1, 2, 2, 9, 4, 4, True, 0),
    "non-causal": (1, 2, 2, 9, 4, 4, False, 0),
    "odd length, odd width": (2, 1, 1, 7, 3, 3, True, 0),
    "block longer than the sequence": (1, 2, 2, 5, 4, 16, True, 0),
    "grouped 4/2": (1, 4, 2, 9, 4, 4, True, 0),
    "multi-query 4/1": (1, 4, 1, 9, 4, 4, True, 0),
    "multi-query 4/1 non-causal": (1, 4, 1, 6, 4, 4, False, 0),
    "window": (1, 4, 2, 11, 4, 4, True, 3),
    "window of one": (1, 2, 1, 6, 4, 2, True, 1),
}
SHAPES = [*ATTENTION_SHAPES, (1, 6, 3, 129, 32, 64)]  # a block of 64 past 129 positions too
MASKS = [(True, 0), (False, 0), (True, 5), (True, 1)]
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float64: dict(rtol=1e-10, atol=1e-12),
}


def inputs(batch, heads, kv_heads, length, head_dim, dtype=torch.float64, seed=0):
    """query, key, value requiring grad and an upstream gradient, standard normal."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, h, length, head_dim) for h in (heads, kv_heads, kv_heads, heads)]
    tensors = [torch.randn(shape, generator=generator, dtype=dtype) for shape in shapes]
    return [t.requires_grad_(i < 3) for i, t in enumerate(tensors)]


def gradients(attend, query, key, value, grad_output, **kwargs):
    """The output and (dq, dk, dv) of sum(output * grad_output)."""
    output = attend(query, key, value, **kwargs)
    return output, torch.autograd.grad(output, (query, key, value), grad_output)


@pytest.mark.parametrize("point", GRADCHECK_POINTS.values(), ids=GRADCHECK_POINTS.keys())
def test_gradcheck_in_float64(point):
    *dims, block, causal, window = point
    query, key, value, _ = inputs(*dims)

    def attend(query, key, value):
        return tiled_attention(query, key, value, block, causal=causal, window=window)

    assert torch.autograd.gradcheck(attend, (query, key, value))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal, window", MASKS)
@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_match_sdpa_and_naive(shape, causal, window, dtype):
    *dims, block = shape
    tensors = inputs(*dims, dtype=dtype, seed=sum(shape))
    mask = {"causal": causal, "window": window}
    output, grads = gradients(tiled_attention, *tensors, block=block, **mask)
    for reference in (sdpa_attention, naive_attention):
        expected_output, expected_grads = gradients(reference, *tensors, **mask)
        assert_close(output, expected_output, **TOLERANCES[dtype])
        for grad, expected in zip(grads, expected_grads, strict=True):
            assert grad.shape == expected.shape and grad.dtype == dtype
            assert_close(grad, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_gradients_keep_the_dtype_and_accumulate_in_float32(dtype):
    tensors = inputs(2, 4, 2, 70, 16, dtype=dtype)
    _, grads = gradients(tiled_attention, *tensors, block=16)
    wide = [t.detach().double().requires_grad_(t.requires_grad) for t in tensors]
    _, expected = gradients(naive_attention, *wide)
    for grad, want in zip(grads, expected, strict=True):
        assert grad.dtype == dtype
        assert_close(grad.double(), want, rtol=0, atol=3e-2)


@pytest.mark.parametrize("causal", [True, False])
def test_unequal_query_and_key_lengths_and_extra_leading_dims(causal):
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(2, 1, 4, 5, 3, generator=generator, dtype=torch.float64)
    key, value = (
        torch.randn(2, 1, 2, 7, 3, generator=generator, dtype=torch.float64) for _ in range(2)
    )

    def attend(query, key, value):
        return tiled_attention(query, key, value, 3, causal=causal)

    leaves = [t.requires_grad_() for t in (query, key, value)]
    assert torch.autograd.gradcheck(attend, leaves)


def saved_tensors(attend, *tensors, **kwargs) -> list[torch.Tensor]:
    """Every tensor that autograd keeps for backward while attend runs."""
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        attend(*tensors, **kwargs)
    return saved


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_backward_keeps_only_inputs_output_and_one_lse_per_row(kv_heads):
    length, heads = 512, 4  # L x L = 262,144 elements; query is 32,768
    query, key, value, _ = inputs(1, heads, kv_heads, length, 16, dtype=torch.float32)
    saved = saved_tensors(tiled_attention, query, key, value, block=64)
    assert max(tensor.numel() for tensor in saved) < length * length
    assert [tensor.data_ptr() for tensor in saved[:3]] == [
        t.data_ptr() for t in (query, key, value)
    ]
    output, lse = saved[3:]
    assert output.shape == query.shape
    assert lse.numel() == heads * length  # one log-sum-exp per query row
    # The check is live: the naive reference keeps (L, L) scores for its backward.
    naive = saved_tensors(naive_attention, query, key, value)
    assert max(tensor.numel() for tensor in naive) >= length * length


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal, window", [(True, 0), (True, 3), (True, 40), (False, 0)])
def test_skipping_hidden_blocks_changes_nothing(causal, window, dtype):
    tensors = inputs(2, 4, 2, 100, 8, dtype=dtype, seed=window)
    results = []
    for skip in (True, False):
        tiling = Tiling(16, causal, window, skip=skip)
        results.append(gradients(TiledAttention.apply, *tensors[:3], tensors[3], tiling=tiling))
    (skipped, skipped_grads), (full, full_grads) = results
    assert torch.equal(skipped, full)
    for skipped_grad, full_grad in zip(skipped_grads, full_grads, strict=True):
        assert torch.equal(skipped_grad, full_grad)


def test_skipping_computes_only_the_visible_blocks():
    def blocks(tiling, length):
        starts = range(0, length, tiling.block)
        return sum(len(tiling.key_starts(q, q + tiling.block, length)) for q in starts)

    assert blocks(Tiling(64, True, 0), 512) == 8 * 9 // 2  # the lower triangle of 8 x 8 blocks
    assert blocks(Tiling(64, True, 64), 512) == 1 + 2 * 7  # the diagonal and the one before
    assert blocks(Tiling(64, False, 0), 512) == blocks(Tiling(64, True, 0, skip=False), 512) == 64


def test_rows_whose_visible_scores_are_all_very_negative_stay_finite():
    # A row that sees nothing in the first block it visits must not take 0 as its maximum.
    query = torch.full((1, 1, 8, 1), 100.0, dtype=torch.float64, requires_grad=True)
    key = torch.full((1, 1, 8, 1), -10.0, dtype=torch.float64, requires_grad=True)
    value = torch.randn(1, 1, 8, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    value.requires_grad_()
    grad_output = torch.ones_like(query)
    output, grads = gradients(tiled_attention, query, key, value, grad_output, block=4, window=2)
    expected, expected_grads = gradients(naive_attention, query, key, value, grad_output, window=2)
    assert_close(output, expected)
    for grad, want in zip(grads, expected_grads, strict=True):
        assert_close(grad, want)


def test_the_model_trains_through_the_tiled_function():
    config = ModelConfig(
        vocab_size=32, width=32, n_layers=1, n_heads=4, n_kv_heads=2, attention="tiled",
        tiled_block=4,
    )  # fmt: skip
    model = OctLM(config)
    logits = model(torch.randint(32, (2, 11)))
    assert logits.grad_fn is not None
    logits.sum().backward()
    attention = model.blocks[0].attention
    assert attention.query.weight.grad.abs().sum() > 0
    assert attention.key.weight.grad.abs().sum() > 0


# exp016 as plain functions

SMALL = dict(length=70, block=16, heads=4, kv_heads=4, head_dim=8, batch=2)


@pytest.mark.parametrize("kv_heads, window", [(4, 0), (2, 0), (1, 9)])
@pytest.mark.parametrize("dtype, limit", [("float32", 1e-5), ("float64", 1e-12)])
def test_run_is_one_row_within_the_claim(kv_heads, window, dtype, limit):
    point = {**SMALL, "kv_heads": kv_heads, "window": window}
    [row] = tiled_backward.run(**point, dtype=dtype)
    grad_diffs = [row[f"max_grad_diff_{name}"] for name in "qkv"]
    assert max(grad_diffs) == row["max_grad_diff"] <= limit
    assert 0 <= row["max_abs_diff"] <= limit
    assert row["max_abs_grad"] > 0.1  # differences of gradients of a sensible size
    assert all(isinstance(value, float) and math.isfinite(value) for value in row.values())


def test_run_detects_a_wrong_backward(monkeypatch):
    """The measurement is live: a backward that drops dv's contribution must show up."""
    real = TiledAttention.backward

    def wrong(ctx, grad_output):
        grad_query, grad_key, grad_value, none = real(ctx, grad_output)
        return grad_query, grad_key, grad_value * 0.5, none

    monkeypatch.setattr(TiledAttention, "backward", staticmethod(wrong))
    [row] = tiled_backward.run(**SMALL)
    assert row["max_grad_diff_v"] > 1e-2
    assert row["max_grad_diff_q"] < 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_without_a_gpu_fails_the_point():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        tiled_backward.run(**SMALL, device="cuda")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        tiled_backward.memory(**SMALL, method="tiled", device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_run_on_cuda():
    [row] = tiled_backward.run(**{**SMALL, "kv_heads": 2}, device="cuda")
    assert row["max_grad_diff"] <= 1e-4  # TF32 may be on for matmuls


@pytest.mark.slow
def test_memory_rows_per_method():
    rows = {
        method: tiled_backward.memory(method=method, length=1024, block=128)[0]
        for method in ("naive", "tiled", "sdpa_math", "sdpa_flash")
    }
    scores_mib = 8 * 1024 * 1024 * 4 / 2**20  # one (H, L, L) float32 tensor: 32 MiB
    for row in rows.values():
        assert row.get("status", "ok") == "ok", row
        assert row["inputs_mib"] == 4 * 8 * 1024 * 32 * 4 / 2**20
        assert "cuda_peak_mib" not in row
    assert rows["naive"]["rss_delta_mib"] > 2 * scores_mib > rows["tiled"]["rss_delta_mib"]
    assert rows["sdpa_math"]["rss_delta_mib"] > 2 * scores_mib > rows["sdpa_flash"]["rss_delta_mib"]


@pytest.mark.process
def test_memory_out_of_memory_is_a_row():
    [row] = tiled_backward.memory(method="naive", length=2048, memory_cap_mib=64)
    assert row["status"] == "oom" and row["device_used"] == "cpu", "as exp015's and exp018's"
    assert "allocate" in row["error"] or row["error"].startswith("MemoryError")


def test_memory_a_refused_backend_is_unsupported_with_the_reason(monkeypatch):
    # The CPU refuses no input of sdpa_flash's, so refuse it a backend the CPU lacks; in this
    # process, since a measuring child would import the module afresh.
    efficient = torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION
    monkeypatch.setitem(tiled_backward.SDPA_BACKENDS, "sdpa_flash", efficient)
    point = {"method": "sdpa_flash", "block": 16, "causal": True, "window": 0}
    shape = {"batch": 1, "heads": 2, "kv_heads": 2, "length": 16, "head_dim": 8}
    inputs = {**shape, "dtype": "float32", "seed": 0, "device": "cpu"}
    row = tiled_backward._measure_memory(point=point, inputs=inputs, warmup_length=4)
    assert row["status"] == "unsupported" and row["device_used"] == "cpu"
    assert "No viable backend" in row["error"]


RUN_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(tiled_backward.run).parameters.items()
}
MEMORY_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(tiled_backward.memory).parameters.items()
}


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"length": 0}, "length must be positive, got 0"),
        ({"block": -4}, "block must be positive"),
        ({"kv_heads": 3}, "kv_heads=3 must divide heads=8"),
        ({"window": -1}, "window must be 0 or more"),
        ({"window": 4, "causal": False}, "sliding window .* needs causal attention"),
        ({"device": "gpu"}, "device must be cpu, cuda or cuda:N"),
    ],
)
def test_check_rejects_bad_values_in_one_line(bad, message):
    params = {**RUN_DEFAULTS, "length": 64, "block": 16, **bad}
    with pytest.raises(ValueError, match=message) as error:
        checks.point(tiled_backward.check, params)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=message):
        tiled_backward.run(**params)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"memory_cap_mib": -1}, "memory_cap_mib must be 0 or more"),
        ({"warmup_length": -1}, "warmup_length must be 0 or more"),
        ({"timeout_s": 0}, "timeout_s must be positive"),
    ],
)
def test_check_rejects_bad_memory_values(bad, message):
    params = {**MEMORY_DEFAULTS, "method": "tiled", "length": 64, **bad}
    with pytest.raises(ValueError, match=message):
        checks.point(tiled_backward.check_memory, params)
    with pytest.raises(ValueError, match=message):
        tiled_backward.memory(**params)


@pytest.mark.slow
def test_the_gradient_sweep_end_to_end(harness, analysis):
    grid = ("length=33,64", "block=16", "heads=4", "kv_heads=4,1")
    result = harness("+experiment=exp016_tiled_backward", *grid)
    assert result.returncode == 0, result.stderr
    rows = store.read(harness.results, "exp016_tiled_backward")
    assert set(rows["status"]) == {"ok"}
    assert sorted(zip(rows["length"], rows["kv_heads"], strict=True)) == [
        (33, 1),
        (33, 4),
        (64, 1),
        (64, 4),
    ]
    assert rows["max_grad_diff"].max() <= 1e-5
    assert result.stdout.count("claim PASS") == 6  # every claim, none N/A or INCOMPLETE
    assert analysis().returncode == 0
    report = (harness.cwd / "outputs" / "report" / "REPORT.md").read_text()
    assert "## exp016_tiled_backward" in report and "max_grad_diff, length (rows)" in report


@pytest.mark.slow
def test_the_memory_sweep_end_to_end(harness):
    grid = ("method=tiled,sdpa_flash,naive", "length=256", "memory_cap_mib=1024")
    result = harness("+experiment=exp016_backward_memory", *grid)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = store.read(harness.results, "exp016_backward_memory").set_index("method")
    assert set(rows["status"]) == {"ok"}
    assert (rows["rss_delta_mib"] > 0).all() and (rows["inputs_mib"] == 1.0).all()
    assert result.stdout.count("claim N/A") == 2  # the growth claims look at 2,048 and beyond
