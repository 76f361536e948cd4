from dataclasses import replace

import pytest
import registry
import torch
import torch.nn.functional as F

import octlm_experiments.model
from octlm_experiments.attention import tiled_attention
from octlm_experiments.model import ModelConfig, OctLM, apply_rotary, rotary_angles
from octlm_experiments.paths import PATHS

LAYOUTS = {"multi-head": (8, 8), "grouped": (8, 2), "multi-query": (8, 1)}
# float64 is tight: the paths differ by reordered sums only, about 1e-16 on logits of about 1.
TOLERANCES = {torch.float32: dict(atol=2e-6, rtol=1e-5), torch.float64: dict(atol=1e-13, rtol=0)}


def tiny_config(**overrides) -> ModelConfig:
    """A debug-sized octlm; tiled_block 8 so that length 37 spans several blocks."""
    fields = dict(vocab_size=64, width=64, n_layers=2, max_length=48, tiled_block=8)
    return ModelConfig(**{**fields, **overrides})


def build(config: ModelConfig, dtype=torch.float32, seed=0) -> OctLM:
    torch.manual_seed(seed)
    return OctLM(config).to(dtype).eval()


def tokens(batch: int, length: int, vocab_size: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randint(vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def with_attention(model: OctLM, attention: str) -> OctLM:
    """A model on another attention path with the same weights (so also a state_dict check)."""
    other = OctLM(replace(model.config, attention=attention))
    other.load_state_dict(model.state_dict())
    return other.to(next(model.parameters()).dtype).train(model.training)


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Record the arguments of each scaled_dot_product_attention call; still call the real one."""
    real, calls = F.scaled_dot_product_attention, []

    def recording(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs
    ):
        calls.append(
            dict(
                query=query,
                key=key,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                enable_gqa=kwargs.get("enable_gqa", False),
            )
        )
        return real(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


@pytest.mark.parametrize("batch, length", [(1, 1), (3, 7), (2, 48)])
@pytest.mark.parametrize("attention, dtype", registry.path_dtypes())
def test_logits_shape(attention, dtype, batch, length):
    model = build(tiny_config(attention=attention, n_kv_heads=2), dtype)
    with torch.no_grad():  # a path without a CPU backward takes no inputs that need one
        logits = model(tokens(batch, length))
    assert logits.shape == (batch, length, 64)
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()


# A path that compiles runs its eager implementation in float64; its kernel compiles once per
# shape (seconds each), so it is checked at one shape in float32, below.
@pytest.mark.parametrize("window", [0, 1, 5])
@pytest.mark.parametrize("length", [1, 7, 37])
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("attention, dtype", registry.path_dtypes(others=True))
def test_paths_match_naive(attention, layout, length, window, dtype):
    heads, kv_heads = LAYOUTS[layout]
    config = tiny_config(attention="naive", n_heads=heads, n_kv_heads=kv_heads, window=window)
    reference = build(config, dtype)
    model = with_attention(reference, attention)
    ids = tokens(2, length)
    with torch.no_grad():  # flex has no backward on the CPU: its inputs must not need one
        expected = reference(ids)
        assert expected.dtype == dtype
        torch.testing.assert_close(model(ids), expected, **TOLERANCES[dtype])


@pytest.mark.slow
@pytest.mark.parametrize("attention", registry.compiling())
def test_a_compiled_paths_model_matches_naive_in_float32(attention):
    reference = build(tiny_config(attention="naive", n_kv_heads=2, window=5))
    ids = tokens(2, 37)
    with torch.no_grad():
        torch.testing.assert_close(with_attention(reference, attention)(ids), reference(ids))


@pytest.mark.parametrize("attention", registry.paths(backward_on="cpu", others=True))
def test_gradients_match_naive(attention):
    config = tiny_config(attention="naive", n_kv_heads=2, window=5)
    reference = build(config, torch.float64)
    model = with_attention(reference, attention)
    ids = tokens(2, 21)
    for each in (reference, model):
        logits = each(ids[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
    for (name, expected), actual in zip(
        reference.named_parameters(), model.parameters(), strict=True
    ):
        assert expected.grad.abs().max() > 0, name
        torch.testing.assert_close(actual.grad, expected.grad, atol=1e-13, rtol=0, msg=name)


@pytest.mark.parametrize("attention", registry.paths(backward_on="cpu", others=True))
def test_every_path_with_a_backward_trains_as_naive_attention(attention):
    """Five AdamW steps in float64, with a window and grouped KV heads, from the same weights:
    the losses and the weights that naive attention's training gives, while both change."""
    reference = build(tiny_config(attention="naive", n_kv_heads=2, window=5), torch.float64)
    model = with_attention(reference, attention)
    ids = tokens(4, 21)
    losses = []
    for each in (reference.train(), model.train()):
        optimizer = torch.optim.AdamW(each.parameters(), lr=1e-2)
        for _ in range(5):
            logits = each(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert losses[4] < losses[0], "the reference learns"
    torch.testing.assert_close(losses[5:], losses[:5], atol=1e-10, rtol=0)
    for (name, expected), actual in zip(
        reference.named_parameters(), model.parameters(), strict=True
    ):
        torch.testing.assert_close(actual, expected, atol=1e-10, rtol=0, msg=name)


def test_rotary_scores_depend_on_relative_position_only():
    cos, sin = rotary_angles(12, 8, 10_000.0, torch.device("cpu"), torch.float64)
    query, key = torch.randn(2, 1, 1, 1, 8, dtype=torch.float64).expand(2, 1, 1, 12, 8)
    query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)  # (1, 1, 12, 8)
    torch.testing.assert_close(query.norm(dim=-1), query[..., :1, :].norm(dim=-1).expand(1, 1, 12))
    scores = (query @ key.transpose(-2, -1))[0, 0]  # (12, 12)
    torch.testing.assert_close(scores[1:, 1:], scores[:-1, :-1])
    assert (scores[0, 0] - scores[1, 0]).abs() > 1e-3


@pytest.mark.parametrize("attention", registry.paths())
def test_windowed_model_is_translation_invariant(attention):
    """Scores see relative positions only, and with a window a logit sees the last
    n_layers * (window - 1) + 1 tokens; so where those tokens stand must not matter."""
    model = build(tiny_config(attention=attention, window=4), torch.float64)
    ids = tokens(2, 30)
    shift, reach = 5, 2 * (4 - 1)
    with torch.no_grad():
        shifted = model(ids[:, shift:])[:, reach:]
        torch.testing.assert_close(shifted, model(ids)[:, shift + reach :], atol=1e-12, rtol=0)


@pytest.mark.parametrize("attention", registry.paths())
def test_future_tokens_do_not_change_earlier_logits(attention):
    model = build(tiny_config(attention=attention, n_kv_heads=2), torch.float64)
    ids = tokens(2, 20)
    changed = ids.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 64
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(after[:, :12], before[:, :12], atol=0, rtol=0)
    assert (after[:, 12:] - before[:, 12:]).abs().amax(dim=-1).min() > 0


@pytest.mark.parametrize("attention", registry.paths())
def test_window_hides_keys_beyond_it(attention):
    """With window 5, positions 0..4 see what plain causal attention sees, later ones do not."""
    ids = tokens(2, 20)
    with torch.no_grad():
        causal = build(tiny_config(attention=attention), torch.float64)(ids)
        windowed = build(tiny_config(attention=attention, window=5), torch.float64)(ids)
    torch.testing.assert_close(windowed[:, :5], causal[:, :5])
    assert (windowed[:, 5:] - causal[:, 5:]).abs().amax(dim=-1).min() > 1e-6


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_state_dict_is_the_same_for_every_path(layout):
    heads, kv_heads = LAYOUTS[layout]
    shapes = {}
    for attention in registry.names():
        model = OctLM(tiny_config(attention=attention, n_heads=heads, n_kv_heads=kv_heads))
        shapes[attention] = {name: t.shape for name, t in model.state_dict().items()}
    assert all(shape == shapes["naive"] for shape in shapes.values())
    kv_width = kv_heads * 64 // heads
    assert shapes["naive"]["blocks.0.attention.key.weight"] == (kv_width, 64)
    assert shapes["naive"]["blocks.0.attention.query.weight"] == (64, 64)


@pytest.mark.parametrize("window", [0, 4])
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_sdpa_call_arguments(sdpa_calls, layout, window):
    heads, kv_heads = LAYOUTS[layout]
    model = build(tiny_config(attention="sdpa", n_heads=heads, n_kv_heads=kv_heads, window=window))
    model(tokens(2, 9))
    assert len(sdpa_calls) == model.config.n_layers
    for call in sdpa_calls:
        assert call["query"].shape == (2, heads, 9, 8)
        assert call["key"].shape == (2, kv_heads, 9, 8)
        assert (call["attn_mask"] is None) == (window == 0)
        assert call["is_causal"] is (window == 0)
        assert call["enable_gqa"] is (kv_heads < heads)
        assert call["dropout_p"] == 0.0
    if window:
        rows, columns = torch.arange(9).unsqueeze(1), torch.arange(9).unsqueeze(0)
        visible = (columns <= rows) & (rows - columns < window)
        assert torch.equal(sdpa_calls[0]["attn_mask"], visible)


def test_sdpa_dropout_only_in_training(sdpa_calls):
    model = build(tiny_config(attention="sdpa", dropout=0.25))
    ids = tokens(2, 9)
    evaluated = model(ids)
    torch.testing.assert_close(model(ids), evaluated, atol=0, rtol=0)
    model.train()
    model(ids)
    assert [call["dropout_p"] for call in sdpa_calls] == [0.0] * 4 + [0.25] * 2
    naive = with_attention(model, "naive").eval()
    torch.testing.assert_close(naive(ids), evaluated)


@pytest.mark.parametrize(
    "window, length, device, dropout, path",
    [(4, 2048, "cpu", 0.0, "tiled"), (4, 2047, "cpu", 0.0, "sdpa"), (0, 4096, "cpu", 0.0, "sdpa"),
     (4, 4096, "cpu", 0.1, "sdpa"), (4, 4096, "cuda", 0.0, "flex"), (4, 4095, "cuda", 0.0, "sdpa"),
     (0, 8192, "cuda", 0.0, "sdpa"), (4, 8192, "cuda", 0.1, "sdpa")],
)  # fmt: skip
def test_auto_takes_tiled_or_flex_for_long_windows(window, length, device, dropout, path):
    assert octlm_experiments.model.auto_path(window, length, torch.device(device), dropout) == path


def test_the_default_path_runs_tiled_from_2048_positions_with_a_window(monkeypatch, sdpa_calls):
    lengths = []

    def recording(query, key, value, block, **kwargs):
        lengths.append(query.shape[-2])
        return tiled_attention(query, key, value, block, **kwargs)

    monkeypatch.setitem(PATHS, "tiled", recording)
    config = tiny_config(max_length=2048, window=16, n_layers=1, tiled_block=512)
    model, naive = build(config), build(replace(config, attention="naive"))
    ids = tokens(1, 2048)
    torch.testing.assert_close(model(ids), naive(ids))
    model(ids[:, :2047])
    assert lengths == [2048] and len(sdpa_calls) == 1


def test_tiled_uses_the_configured_block(monkeypatch):
    blocks = []

    def recording(query, key, value, block, **kwargs):
        blocks.append(block)
        return tiled_attention(query, key, value, block, **kwargs)

    monkeypatch.setitem(PATHS, "tiled", recording)
    build(tiny_config(attention="tiled", tiled_block=5))(tokens(1, 9))
    assert blocks == [5, 5]


@pytest.mark.parametrize("attention", ["naive", "tiled", "flex"])
def test_other_paths_never_call_sdpa(sdpa_calls, attention):
    with torch.no_grad():
        build(tiny_config(attention=attention, n_kv_heads=2, window=3), torch.float64)(tokens(2, 9))
    assert sdpa_calls == []


def test_naive_dropout_in_training_only():
    model = build(tiny_config(attention="naive", dropout=0.25))
    ids = tokens(2, 9)
    evaluated = model(ids)
    torch.testing.assert_close(model(ids), evaluated, atol=0, rtol=0)
    model.train()
    torch.manual_seed(0)
    assert not torch.allclose(model(ids), evaluated)


def test_tiled_refuses_dropout_in_training():
    model = build(tiny_config(attention="tiled", dropout=0.1))
    ids = tokens(2, 9)
    evaluated = model(ids)
    torch.testing.assert_close(evaluated, with_attention(model, "naive")(ids))
    model.train()
    with pytest.raises(NotImplementedError, match="tiled.*dropout"):
        model(ids)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(n_heads=8, n_kv_heads=3), "kv_heads=3 must divide heads=8"),
        (dict(n_kv_heads=0), "kv_heads must be positive, got 0"),
        (dict(n_heads=6, n_kv_heads=6), "width=64 must be an even multiple of heads=6"),
        (
            dict(width=48, n_heads=16, n_kv_heads=16),
            "width=48 must be an even multiple of heads=16",
        ),
        (dict(window=-1), "window must be 0 or more, got -1"),
        (dict(attention="flash"), "attention must be one of .*'flash'"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
        (dict(dropout=-0.1), r"dropout must be in \[0, 1\)"),
        (dict(vocab_size=0), "vocab_size must be positive"),
        (dict(width=-64), "width must be positive"),
        (dict(n_layers=0), "n_layers must be positive"),
        (dict(max_length=0), "max_length must be positive"),
        (dict(tiled_block=0), "tiled_block must be positive"),
    ],
)
def test_invalid_config(overrides, message):
    with pytest.raises(ValueError, match=message) as error:
        tiny_config(**overrides)
    assert "\n" not in str(error.value)


def test_default_config_is_valid():
    config = ModelConfig()
    assert config.attention == "auto"
    assert OctLM(config)(tokens(1, 3, config.vocab_size)).shape == (1, 3, config.vocab_size)


@pytest.mark.parametrize("length", [0, 49])
def test_length_outside_max_length(length):
    model = build(tiny_config())
    with pytest.raises(ValueError, match="outside 1..max_length=48"):
        model(tokens(1, length))


def test_tokens_must_be_batched():
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        build(tiny_config())(torch.zeros(5, dtype=torch.long))
