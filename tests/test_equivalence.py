import inspect
import math
import re

import pytest
import registry
import torch

from octlm_experiments import checks, equivalence

SMALL = dict(kv_heads=2, heads=4, width=32, layers=2, vocab_size=64, length=19, batch=2, block=8)
DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(equivalence.run).parameters.items()
}
LIMITS = {"float32": 1e-5, "float64": 1e-12}  # the harness's float32 claim; float64 is ~1e-16


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("path", registry.paths(backward_on="cpu", others=True))
def test_run_is_within_the_claim(path, kv_heads, window, dtype):
    point = {**SMALL, "kv_heads": kv_heads, "window": window}
    [row] = equivalence.run(path=path, dtype=dtype, **point)
    assert row["max_abs_diff"] <= LIMITS[dtype]
    assert row["max_grad_diff"] <= LIMITS[dtype]
    assert 0 <= row["mean_abs_diff"] <= row["max_abs_diff"]
    # The differences are relative to numbers of a sensible size, not to zeros.
    assert row["max_abs_logit"] > 0.1 and row["max_abs_grad"] > 1e-3


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("path", registry.without_backward_on("cpu"))
def test_a_path_without_a_cpu_backward_has_its_logits_checked_and_why_said(path, dtype):
    """flex on the CPU: compiled in float32, eager in float64; its backward does not exist."""
    [row] = equivalence.run(path=path, dtype=dtype, **{**SMALL, "window": 5})
    assert 0 <= row["max_abs_diff"] <= LIMITS[dtype]
    assert row["path_err64"] <= LIMITS[dtype] and row["naive_grad_err64"] <= LIMITS[dtype]
    assert "max_grad_diff" not in row and "path_grad_err64" not in row
    assert "backward" in row["grad_unsupported"]


def test_row_is_flat_snake_case_scalars():
    [row] = equivalence.run(**SMALL)
    assert {"max_abs_diff", "mean_abs_diff", "max_grad_diff"} <= row.keys()
    for key, value in row.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", key), key
        assert isinstance(value, float) and math.isfinite(value), key


def test_run_is_reproducible():
    assert equivalence.run(**SMALL) == equivalence.run(**SMALL)


def test_run_detects_a_wrong_attention(monkeypatch):
    """The measurement is live: SDPA that forgets causality must show up in both differences."""
    real = torch.nn.functional.scaled_dot_product_attention

    def not_causal(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        return real(query, key, value, dropout_p=dropout_p, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", not_causal)
    [row] = equivalence.run(path="sdpa", **SMALL)
    assert row["max_abs_diff"] > 1e-2
    assert row["max_grad_diff"] > 1e-2


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(kv_heads=3), "kv_heads=3 must divide heads=8"),
        (dict(kv_heads=0), "kv_heads must be positive, got 0"),
        (dict(heads=-8), "heads must be positive, got -8"),
        (dict(length=0), "length must be positive, got 0"),
        (dict(batch=0), "batch must be positive"),
        (dict(width=0), "width must be positive"),
        (dict(layers=0), "layers must be positive"),
        (dict(vocab_size=0), "vocab_size must be positive"),
        (dict(block=0), "block must be positive"),
        (dict(width=60), "width=60 must be an even multiple of heads=8"),
        (dict(width=24), "width=24 must be an even multiple of heads=8"),
        (dict(window=-1), "window must be 0 or more, got -1"),
        (dict(device="gpu0"), "device must be cpu, cuda or cuda:N, got 'gpu0'"),
    ],
)
def test_check_rejects(params, message):
    with pytest.raises(ValueError, match=message) as error:
        checks.point(equivalence.check, {**DEFAULTS, **params})
    assert "\n" not in str(error.value)


def test_check_accepts_the_defaults_and_small_points():
    assert checks.point(equivalence.check, DEFAULTS) is None
    point = {**DEFAULTS, **SMALL, "path": "tiled", "window": 16, "dtype": "float64"}
    assert checks.point(equivalence.check, point) is None


def test_run_checks_before_any_work(monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("run built a model before checking its arguments")

    monkeypatch.setattr(equivalence, "OctLM", no_model)
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads=8"):
        equivalence.run(kv_heads=3)
