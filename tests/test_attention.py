"""Tiled, SDPA and FlexAttention against the naive reference, and tiled against SDPA as exp014
does; the registry of paths, that a path registered there is every experiment's to take, and
the one visibility rule."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree

import pytest
import registry
import torch
import yaml
from shapes import SHAPES
from torch.testing import assert_close

from harness.errors import BadInput
from harness.planning.experiment import Experiment
from octlm_experiments import equivalence, recall, tiled_backward
from octlm_experiments import window as sliding
from octlm_experiments.attention import (
    TiledAttention,
    Tiling,
    attention_mask,
    flex_block_mask,
    naive_attention,
    reference_attention,
    repeat_kv,
    sdpa_attention,
    tiled_attention,
    visible,
)
from octlm_experiments.model import ModelConfig, OctLM, auto_path
from octlm_experiments.paths import PATHS, attend, register, unregister, unsupported

CONF = Path(__file__).resolve().parent.parent / "conf" / "experiment"


def qkv(batch, heads, kv_heads, length, head_dim, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, h, length, head_dim, generator=generator, dtype=dtype)
        for h in (heads, kv_heads, kv_heads)
    )


MASKS = [(True, 0), (False, 0), (True, 1), (True, 5)]  # (causal, window)


@pytest.mark.parametrize("causal, window", MASKS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("path", registry.paths())
def test_every_path_matches_the_float64_reference(path, shape, causal, window):
    """Each registered path (a path that tiles, in the shape's blocks) in float64 against the
    float64 reference; a path that compiles runs its eager implementation here."""
    *dims, block = shape
    query, key, value = qkv(*dims)
    (expected,) = reference_attention(query, key, value, causal=causal, window=window)
    output = attend(path, query, key, value, causal=causal, window=window, block=block)
    assert output.dtype == torch.float64
    assert_close(output, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal, window", MASKS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("path", registry.paths(backward_on="cpu"))
def test_every_path_with_a_backward_has_the_float64_references_gradients(
    path, shape, causal, window
):
    *dims, block = shape
    query, key, value = (t.requires_grad_() for t in qkv(*dims))
    grad_output = torch.randn(query.shape, generator=torch.Generator().manual_seed(9),
                              dtype=torch.float64)  # fmt: skip
    _, *expected = reference_attention(query, key, value, grad_output, causal=causal,
                                       window=window)  # fmt: skip
    output = attend(path, query, key, value, causal=causal, window=window, block=block)
    grads = torch.autograd.grad(output, (query, key, value), grad_output)
    assert expected[2].abs().max() > 0, "every output row weighs some value"
    for grad, want in zip(grads, expected, strict=True):
        assert_close(grad, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("path", registry.paths())
def test_every_path_takes_leading_dims_and_unequal_query_and_key_lengths(path, causal):
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 3, 4, 9, 8, generator=generator, dtype=torch.float64)
    key, value = (
        torch.randn(2, 3, 2, 13, 8, generator=generator, dtype=torch.float64) for _ in range(2)
    )
    (expected,) = reference_attention(query, key, value, causal=causal)
    output = attend(path, query, key, value, causal=causal, block=4)
    assert output.shape == query.shape
    assert_close(output, expected, rtol=1e-12, atol=1e-12)


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


def blind_rows(dtype, requires_grad: bool):
    """64 queries, 16 keys, window 8: query rows 23 to 63 see no key (top-left causal)."""
    query, key, value = (t.requires_grad_(requires_grad) for t in qkv(1, 4, 2, 64, 8, dtype=dtype))
    key, value = (t.detach()[..., :16, :].requires_grad_(requires_grad) for t in (key, value))
    blind = ~attention_mask(64, 16, causal=True, window=8).any(dim=-1)
    assert blind.nonzero().flatten().tolist() == list(range(23, 64))
    return query, key, value, blind


@pytest.mark.parametrize("path, dtype", registry.path_dtypes())
def test_a_row_that_sees_no_key_is_zero_in_every_path(path, dtype):
    query, key, value, blind = blind_rows(dtype, requires_grad=False)
    output = attend(path, query, key, value, causal=True, window=8, block=8)
    assert torch.equal(output[..., blind, :], torch.zeros_like(output[..., blind, :]))
    assert output[..., ~blind, :].abs().amax(dim=-1).min() > 0


@pytest.mark.parametrize("path, dtype", registry.path_dtypes(backward_on="cpu"))
def test_a_row_that_sees_no_key_has_zero_and_finite_gradients(path, dtype):
    query, key, value, blind = blind_rows(dtype, requires_grad=True)
    output = attend(path, query, key, value, causal=True, window=8, block=8)
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


@pytest.mark.slow
@pytest.mark.parametrize("heads, kv_heads, length, window", [(8, 2, 300, 64), (4, 4, 130, 0)])
@pytest.mark.parametrize("path", registry.compiling())
def test_a_compiled_path_is_as_accurate_as_sdpa_in_float32(path, heads, kv_heads, length, window):
    """FlashAttention's rule, on the kernel torch.compile makes (flex: the CPU's C++ one)."""
    query, key, value = qkv(1, heads, kv_heads, length, 32, dtype=torch.float32, seed=length)
    (exact,) = reference_attention(query, key, value, window=window)
    output = attend(path, query, key, value, window=window)
    sdpa = sdpa_attention(query, key, value, window=window)
    error, sdpa_error = ((t.double() - exact).abs().max().item() for t in (output, sdpa))
    assert 1e-10 < error <= 2 * sdpa_error + 1e-6


def test_the_block_mask_skips_the_blocks_outside_the_window():
    # 1,024 positions in blocks of 128, 8 x 8 blocks: causal keeps the 36 on and below the
    # diagonal; a window of 128 keeps the 8 on it and the 7 just below.
    assert flex_block_mask(1024, 1024, True, 0, "cpu").sparsity() == pytest.approx(100 * 28 / 64)
    assert flex_block_mask(1024, 1024, True, 128, "cpu").sparsity() == pytest.approx(100 * 49 / 64)
    assert flex_block_mask(1024, 1024, False, 0, "cpu") is None


@pytest.mark.parametrize("path", registry.without_backward_on("cpu"))
def test_a_path_declared_without_a_cpu_backward_has_none(path):
    """What the registry declares is what the path does (flex: FlexAttention refuses inputs that
    need gradients on the CPU in torch 2.13); the paths declared with one pass the gradient
    checks above."""
    query, key, value = (t.requires_grad_() for t in qkv(1, 2, 2, 16, 8, dtype=torch.float64))
    with pytest.raises(NotImplementedError):
        attend(path, query, key, value, window=4).sum().backward()
    assert "no backward pass on cpu" in unsupported(path, "cpu", torch.float64, backward=True)


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
    unregister("naive_copy")


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
    paths = ", ".join(PATHS)
    assert str(refused.value) == f"{parameter} must be one of {beside}{paths}, got 'flash'"


def test_an_unknown_path_is_refused_in_one_line_that_lists_the_paths():
    with pytest.raises(ValueError) as refused:
        ModelConfig(attention="flash")
    paths = ", ".join(PATHS)
    assert str(refused.value) == f"attention must be one of auto, {paths}, got 'flash'"
    with pytest.raises(ValueError, match=f"^path must be one of {paths}, got 'x'$"):
        equivalence.run(path="x", length=4)
    with pytest.raises(ValueError, match="path must be one of"):
        attend("x", *qkv(1, 2, 2, 4, 4))


def _naive(query, key, value, *, causal=True, window=0):
    return naive_attention(query, key, value, causal=causal, window=window)


@pytest.fixture
def narrow():
    """Two paths registered for the test: one that runs on CUDA alone, one in float32 alone."""
    register("cuda_only", _naive, devices={"cuda"})
    register("float32_only", _naive, dtypes={"float32"})
    yield
    unregister("cuda_only")
    unregister("float32_only")


def test_what_a_path_cannot_do_is_declared_once_and_an_unsupported_row_says_it(narrow):
    """attend refuses a device or dtype a path does not take in one line, and every experiment
    that takes a path makes such a point an unsupported row saying why, before it runs."""
    with pytest.raises(NotImplementedError) as refused:
        attend("cuda_only", *qkv(1, 2, 2, 4, 4))
    assert str(refused.value) == "the attention path 'cuda_only' does not run on cpu (only cuda)"
    with pytest.raises(NotImplementedError, match="'float32_only' does not take float64"):
        attend("float32_only", *qkv(1, 2, 2, 4, 4))
    said = "the attention path 'float32_only' does not take float64 (only float32)"
    point = dict(kv_heads=2, heads=4, width=32, layers=1, vocab_size=64, length=9, block=8)
    assert equivalence.run(path="float32_only", dtype="float64", **point) == [
        {"status": "unsupported", "error": said}
    ]
    for rows in (
        sliding.run(method="cuda_only", length=64, window=4, device="cpu"),
        tiled_backward.memory(method="cuda_only", length=64, device="cpu"),
        recall.run(attention="cuda_only", steps=2, batch=2, device="cpu"),
    ):
        [row] = rows
        assert row["status"] == "unsupported", row
        assert row["error"] == "the attention path 'cuda_only' does not run on cpu (only cuda)"
    [row] = recall.run(attention="flex", steps=2, batch=2, device="cpu")
    assert (
        row["error"] == "the attention path 'flex' has no backward pass on cpu (it has one on cuda)"
    )


def test_a_path_that_raises_not_implemented_at_the_first_step_trains_to_an_unsupported_row():
    """What a path does not declare, the first step finds: its NotImplementedError is the
    unsupported row's reason (octlm_experiments.training.not_implemented), not a failed point."""

    def lacking(query, key, value, *, causal=True, window=0):
        raise NotImplementedError("no kernel for this here")

    register("lacking", lacking)
    try:
        [row] = recall.run(attention="lacking", steps=2, batch=2, device="cpu")
    finally:
        unregister("lacking")
    assert row == {"status": "unsupported", "error": "NotImplementedError: no kernel for this here"}


def test_auto_takes_the_path_declared_faster_from_the_longest_length_reached():
    """attention="auto" reads each path's windowed_from: of the paths declared faster for a
    window on this device from a length the sequence reaches, the one declared from the longest,
    if it trains here in the dtype; SDPA otherwise."""
    register("short_windows", _naive, windowed_from={"cpu": 512})
    register("inference_only", _naive, backward=set(), windowed_from={"cpu": 256})
    register("float64_only", _naive, dtypes={"float64"}, windowed_from={"cpu": 128})
    cpu = torch.device("cpu")
    try:
        picked = [auto_path(4, n, cpu, 0.0) for n in (255, 511, 512, 2047, 2048)]
        assert picked == ["sdpa", "sdpa", "short_windows", "short_windows", "tiled"]
        assert auto_path(0, 4096, cpu, 0.0) == "sdpa"  # no window
        assert auto_path(4, 256, cpu, 0.0, torch.float64) == "float64_only"  # its one dtype
    finally:
        for name in ("short_windows", "inference_only", "float64_only"):
            unregister(name)


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


# The oracle tests that a registered path gets, and those of them that a path off by a millionth
# must fail: the float64 reference's tolerances are 1e-12 or tighter, float32's 1e-5.
ORACLES = {
    "test_attention.py": {
        "test_every_path_matches_the_float64_reference": True,
        "test_every_path_with_a_backward_has_the_float64_references_gradients": True,
        "test_every_path_takes_leading_dims_and_unequal_query_and_key_lengths": True,
        "test_a_row_that_sees_no_key_is_zero_in_every_path": False,
        "test_a_row_that_sees_no_key_has_zero_and_finite_gradients": True,
    },
    "test_model.py": {
        "test_paths_match_naive": True,
        "test_gradients_match_naive": True,
        "test_every_path_with_a_backward_trains_as_naive_attention": True,
        "test_windowed_model_is_translation_invariant": False,
        "test_future_tokens_do_not_change_earlier_logits": False,
        "test_window_hides_keys_beyond_it": False,
        "test_logits_shape": False,
    },
    "test_equivalence.py": {"test_run_is_within_the_claim": True},
}


@pytest.mark.process
def test_a_path_registered_from_a_file_of_its_own_gets_every_oracle_test(tmp_path):
    """tests/support/chunked_path.py registers a path and nothing else; the oracle tests take it
    up (forward and backward against the float64 reference, with and without a window, in the
    model, in training, in exp014_equivalence) and pass it, and they fail its twin off by 1e-6.
    The outcomes are read from the JUnit XML, so the run prints no tracebacks (--tb=no): the
    twin's 90-odd failures, formatted, cost a third as much again as running every case."""
    report = tmp_path / "oracles.xml"
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "chunked_path", "-k", "chunked", "-q",
         "--tb=no", "-p", "no:cacheprovider", f"--junitxml={report}",
         *(str(Path(__file__).parent / name) for name in ORACLES)],
        env={**os.environ, "CHUNKED_PATH_OFF_BY": "1e-6"}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert ran.returncode in (0, 1), ran.stdout + ran.stderr
    outcomes: dict[str, dict[str, set[str]]] = {"chunked": {}, "chunked_off": {}}
    said = []  # why a case on the new path did not pass: the failure's message
    for case in ElementTree.parse(report).iter("testcase"):
        name, _, params = case.get("name").partition("[")
        path = "chunked_off" if "chunked_off" in params else "chunked"
        kinds = {child.tag for child in case} & {"failure", "error", "skipped"}
        outcomes[path].setdefault(name, set()).add(
            "passed" if not kinds else "skipped" if kinds == {"skipped"} else "failed"
        )
        if path == "chunked" and kinds:
            said += [f"{case.get('name')}: {child.get('message')}" for child in case]
    right, wrong = outcomes["chunked"], outcomes["chunked_off"]
    expected = {name for oracles in ORACLES.values() for name in oracles}
    assert expected <= set(right), f"not run on the new path: {expected - set(right)}"
    assert all(seen == {"passed"} for seen in right.values()), "\n".join(said) or right
    caught = {name for oracles in ORACLES.values() for name, fails in oracles.items() if fails}
    assert {name for name, seen in wrong.items() if "failed" in seen} == caught
