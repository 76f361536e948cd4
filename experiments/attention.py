"""Attention four ways: the naive reference, FlashAttention's tiling, PyTorch's fused SDPA,
and PyTorch's FlexAttention, which octlm_experiments.paths registers as the paths that the model and
the experiments choose from by name.

Shapes, here and in the model: B batch, H query heads, H_kv key/value heads (H_kv divides H),
L length, D head width. query is (B, H, L, D); key and value are (B, H_kv, L, D). Any leading
dims may stand in for B. Masks follow SDPA: True where a query may attend to a key.

All four share one signature, (query, key, value, *, causal, window, ...), and one rule of
which keys a query sees (visible):
- causal: a query sees keys at its own position and before (top-left aligned, like SDPA).
- window > 0 (causal only): a query sees at most `window` keys, itself included
  (query - key < window).
- A query row that sees no key at all (more queries than keys, with a window) gets output 0 and
  zero gradients, in every path: the convention of SDPA and FlashAttention.

A new path is one octlm_experiments.paths.register(name, function, ...) call, with what it can do.
The tests check every registered path against the float64 reference as its capabilities allow;
`pytest -p MODULE` runs them on a path that MODULE registers (README.md, Tests).

The tiled path has its own autograd (TiledAttention): its backward recomputes the probabilities
block by block, as FlashAttention-2's does, so that training never holds an (L, L) tensor.
"""

import functools
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.nn.attention import flex_attention as flex

from octlm_experiments import checks


def attention_mask(
    length_q: int, length_k: int, *, causal: bool, window: int, device=None
) -> Tensor | None:
    """The (L_q, L_k) boolean mask of visible keys, or None when every key is visible."""
    checks.window(window, causal)
    if not causal:
        return None
    rows = torch.arange(length_q, device=device).unsqueeze(1)
    columns = torch.arange(length_k, device=device).unsqueeze(0)
    return visible(rows, columns, causal=causal, window=window)


def visible(rows: Tensor, columns: Tensor, *, causal: bool, window: int) -> Tensor:
    """The one visibility rule: True where the query at position `rows` sees the key at position
    `columns` (index tensors that broadcast). Causal: the key is at the query's position or
    before it; window > 0 too: fewer than `window` positions before it. Not causal: every key.
    Every path's mask is this rule: attention_mask, flex_block_mask, Tiling.hide."""
    if not causal:
        return torch.ones_like(rows - columns, dtype=torch.bool)
    seen = columns <= rows
    return seen & (rows - columns < window) if window > 0 else seen


def repeat_kv(key: Tensor, value: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Repeat each KV head for the query heads sharing it: (.., H_kv, L, D) -> (.., H, L, D)."""
    groups = _kv_groups(heads, key.shape[-3])
    if groups == 1:
        return key, value
    return key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)


def naive_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    causal: bool = True,
    window: int = 0,
    dropout: float = 0.0,
) -> Tensor:
    """The reference: materialize the (L, L) scores, mask, softmax, weight the values."""
    key, value = repeat_kv(key, value, query.shape[-3])
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (B, H, L, L)
    mask = attention_mask(
        query.shape[-2], key.shape[-2], causal=causal, window=window, device=query.device
    )
    if mask is None:
        return F.dropout(scores.softmax(dim=-1), p=dropout) @ value
    # A row that sees no key keeps its scores (a softmax over all -inf is nan, and so would be
    # every gradient through it) and gets its weights zeroed: output 0, gradients 0.
    sees_a_key = mask.any(dim=-1, keepdim=True)  # (L_q, 1)
    scores = scores.masked_fill(~mask & sees_a_key, float("-inf"))
    weights = scores.softmax(dim=-1) * sees_a_key
    return F.dropout(weights, p=dropout) @ value


def reference_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    grad_output: Tensor | None = None,
    *,
    causal: bool = True,
    window: int = 0,
) -> tuple[Tensor, ...]:
    """The accuracy oracle: naive_attention in float64 on float64 copies of the inputs.

    Returns the output, and with grad_output the gradients of sum(output * grad_output) for
    query, key and value too, all float64. It runs one (batch, query head) at a time, so it
    holds one (L, L) float64 tensor rather than B x H of them.
    """
    groups = _kv_groups(query.shape[-3], key.shape[-3])
    # (B, H, L, D) -> (B * H, L, D): head i of the flattened query uses flattened KV head i // G.
    q, k, v = (t.detach().double().flatten(0, -3) for t in (query, key, value))
    with_grads = grad_output is not None
    d_out = grad_output.double().flatten(0, -3) if with_grads else None
    output, grads = torch.empty_like(q), [torch.zeros_like(t) for t in (q, k, v)]
    for i in range(q.shape[0]):
        j = i // groups
        picks = [slice(i, i + 1), slice(j, j + 1), slice(j, j + 1)]  # this head's q, k and v
        inputs = [
            t[pick].requires_grad_(with_grads) for t, pick in zip((q, k, v), picks, strict=True)
        ]
        with torch.set_grad_enabled(with_grads):
            out = naive_attention(*inputs, causal=causal, window=window)
        output[picks[0]] = out.detach()
        if with_grads:
            head_grads = torch.autograd.grad(out, inputs, d_out[i : i + 1])
            for total, pick, grad in zip(grads, picks, head_grads, strict=True):
                total[pick] += grad
    output = output.view(query.shape)
    if not with_grads:
        return (output,)
    return output, *(g.view(t.shape) for g, t in zip(grads, (query, key, value), strict=True))


def sdpa_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    causal: bool = True,
    window: int = 0,
    dropout: float = 0.0,
) -> Tensor:
    """PyTorch's fused attention: is_causal without a mask tensor, or a mask alone, never both."""
    mask = None
    if window > 0:
        mask = attention_mask(
            query.shape[-2], key.shape[-2], causal=causal, window=window, device=query.device
        )
    return F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=causal and mask is None,
        enable_gqa=key.shape[-3] != query.shape[-3],
    )


def flex_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    causal: bool = True,
    window: int = 0,
    compiled: bool | None = None,
) -> Tensor:
    """PyTorch's FlexAttention (torch.nn.attention.flex_attention) with a block mask: the kernel
    skips every (128, 128) block of scores that holds no visible pair, so a window costs time and
    memory in proportion to L * window, not L^2. Grouped-query attention through its enable_gqa.

    compiled: the fused kernel torch.compile makes (CUDA: Triton; CPU: C++, float32 and half
    precision, forward only in torch 2.13), compiled once per shape and then reused; False: the
    eager implementation, which materializes the scores (any dtype: what float64 checks use).
    None: compiled, except float64 on the CPU. The block mask is made once per (L_q, L_k,
    causal, window, device) and kept.
    """
    checks.window(window, causal)
    groups = _kv_groups(query.shape[-3], key.shape[-3])
    if compiled is None:
        compiled = not (query.device.type == "cpu" and query.dtype == torch.float64)
    q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (query, key, value))  # (B, H, L, D)
    mask = flex_block_mask(q.shape[-2], k.shape[-2], causal, window, str(query.device))
    if compiled:
        # Each new shape compiles anew; past torch's default of 8 per function it would quietly
        # run the eager implementation instead.
        with torch._dynamo.config.patch(recompile_limit=256):
            output = _compiled_flex()(q, k, v, block_mask=mask, enable_gqa=groups > 1)
    else:
        with warnings.catch_warnings():  # that it is not compiled: here, on purpose
            warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
            output = flex.flex_attention(q, k, v, block_mask=mask, enable_gqa=groups > 1)
    return output.view(query.shape)


@functools.cache
def _compiled_flex():
    return torch.compile(flex.flex_attention, dynamic=False)


@functools.lru_cache(maxsize=64)
def flex_block_mask(length_q: int, length_k: int, causal: bool, window: int, device: str):
    """Which blocks of the (L_q, L_k) scores hold a visible pair; None when all are visible."""
    if not causal:
        return None

    def sees(batch, head, row, column):  # FlexAttention's mask_mod: the rule, on index tensors
        return visible(row, column, causal=causal, window=window)

    return flex.create_block_mask(sees, None, None, length_q, length_k, device=device)


# Tiled attention. Inside it, query heads are grouped by the KV head they share, so grouped-query
# attention never repeats K or V: queries (and the output and its gradient) are (B, H_kv, G, L, D)
# with G = H / H_kv query heads per KV head, keys and values are (B, H_kv, 1, L, D), and every
# block product broadcasts over G. Blocks are bq query rows by bk keys (both `block` or fewer).


# What an SDPA call that no kernel can run raises: no kernel chosen, or cuDNN's, chosen, finding
# no execution plan for the graph (its check can pass where its planner then gives up).
REFUSALS = ("No available kernel", "No viable backend", "No execution plans support the graph",
            "CUDNN_STATUS_NOT_SUPPORTED")  # fmt: skip


def sdpa_refusal(error: RuntimeError, warned: list) -> str | None:
    """PyTorch's reasons, when `error` says no SDPA kernel can run the inputs (else None): the
    warnings it gave while refusing, then the error itself."""
    if not any(text in str(error) for text in REFUSALS):
        return None
    return " | ".join([str(warning.message) for warning in warned] + [str(error)])


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block: int = 128,
    *,
    causal: bool = True,
    window: int = 0,
) -> Tensor:
    """FlashAttention's forward and backward: blocks of queries against blocks of keys.

    Nothing of size (L, L) is ever allocated or kept for backward: the forward runs a running
    softmax and saves only the inputs, the output and each query row's log-sum-exp; the backward
    walks the blocks again and recomputes the probabilities from those. Key blocks that no query
    of a block can see (above the causal diagonal, or left of the window) are skipped in both.
    float16 and bfloat16 accumulate in float32, as the fused kernels do.
    """
    tiling = Tiling(block, causal, window)
    _kv_groups(query.shape[-3], key.shape[-3])
    return TiledAttention.apply(query, key, value, tiling)


@dataclass(frozen=True)
class Tiling:
    """How the (L_q, L_k) scores are cut into blocks, and which blocks are computed.

    skip=False computes the blocks that no query can see too (masked to -inf); it exists to show
    that skipping them changes nothing.
    """

    block: int
    causal: bool
    window: int
    skip: bool = True

    def __post_init__(self):
        checks.positive(block=self.block)
        checks.window(self.window, self.causal)

    def key_starts(self, q_start: int, q_stop: int, length_k: int) -> range:
        """Start positions of the key blocks computed for the query rows [q_start, q_stop)."""
        if not self.causal or not self.skip:
            return range(0, length_k, self.block)
        first = max(0, q_start - self.window + 1) if self.window > 0 else 0
        return range(first // self.block * self.block, min(q_stop, length_k), self.block)

    def hide(self, scores: Tensor, q_start: int, k_start: int) -> Tensor:
        """scores (.., bq, bk) with -inf where a query cannot see a key; as is if it sees all."""
        q_stop, k_stop = q_start + scores.shape[-2], k_start + scores.shape[-1]
        above_diagonal = k_stop - 1 > q_start
        outside_window = self.window > 0 and (q_stop - 1) - k_start >= self.window
        if not self.causal or not (above_diagonal or outside_window):
            return scores
        rows = torch.arange(q_start, q_stop, device=scores.device).unsqueeze(1)
        columns = torch.arange(k_start, k_stop, device=scores.device).unsqueeze(0)
        hidden = ~visible(rows, columns, causal=self.causal, window=self.window)
        return scores.masked_fill(hidden, float("-inf"))


class TiledAttention(torch.autograd.Function):
    """tiled_attention's forward and backward; apply(query, key, value, tiling).

    Saved for backward: query, key and value as given, the output, and the log-sum-exp of each
    query row's scores (B, H_kv, G, L_q, 1). Nothing else, and nothing of size (L, L).
    """

    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, tiling: Tiling) -> Tensor:
        output, lse = _tiled_forward(*_grouped(query, key, value), tiling)
        output = output.flatten(-4, -3).to(query.dtype)  # (B, H, L_q, D)
        ctx.save_for_backward(query, key, value, output, lse)
        ctx.tiling = tiling
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        query, key, value, output, lse = ctx.saved_tensors
        grad_query, grad_key, grad_value = _tiled_backward(
            *_grouped(query, key, value, output, grad_output), lse, ctx.tiling
        )
        return (
            grad_query.flatten(-4, -3).to(query.dtype),  # (B, H, L_q, D)
            grad_key.squeeze(-3).to(key.dtype),  # (B, H_kv, L_k, D)
            grad_value.squeeze(-3).to(value.dtype),
            None,
        )


def _tiled_forward(
    query: Tensor, key: Tensor, value: Tensor, tiling: Tiling
) -> tuple[Tensor, Tensor]:
    """The output (B, H_kv, G, L_q, D) and each row's log-sum-exp (B, H_kv, G, L_q, 1)."""
    output = torch.empty_like(query)
    lse = query.new_empty(query.shape[:-1] + (1,))
    for q_start in range(0, query.shape[-2], tiling.block):
        rows = slice(q_start, q_start + tiling.block)
        output[..., rows, :], lse[..., rows, :] = _forward_query_block(
            query[..., rows, :], key, value, q_start, tiling
        )
    return output, lse


def _forward_query_block(
    query: Tensor, key: Tensor, value: Tensor, q_start: int, tiling: Tiling
) -> tuple[Tensor, Tensor]:
    """One block of query rows (.., bq, D) against every key block it can see: output and lse."""
    scale = 1.0 / math.sqrt(query.shape[-1])
    q_stop = q_start + query.shape[-2]
    running_max = query.new_full(query.shape[:-1] + (1,), float("-inf"))  # (B, H_kv, G, bq, 1)
    running_sum = torch.zeros_like(running_max)
    output = torch.zeros_like(query)  # (B, H_kv, G, bq, D): unnormalized
    for k_start in tiling.key_starts(q_start, q_stop, key.shape[-2]):
        columns = slice(k_start, k_start + tiling.block)
        scores = query @ key[..., columns, :].transpose(-2, -1) * scale  # (B, H_kv, G, bq, bk)
        scores = tiling.hide(scores, q_start, k_start)
        block_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        # A row that has seen no visible key yet keeps max -inf, but subtracts 0 in the exponents
        # (exp(-inf - 0) = 0, where -inf - -inf would be nan). Clamping the max itself to 0
        # would underflow rows whose visible scores are all below about -100 (float32).
        shift = block_max.masked_fill(block_max == float("-inf"), 0.0)
        correction = (running_max - shift).exp()
        weights = (scores - shift).exp()
        running_sum = correction * running_sum + weights.sum(dim=-1, keepdim=True)
        output = correction * output + weights @ value[..., columns, :]
        running_max = block_max
    # A row that saw no key (sum 0) gets output 0 and lse +inf, so that the backward's
    # exp(S - lse) is 0 there: FlashAttention's convention. Any other row's sum is at least 1.
    seen = running_sum > 0
    output = torch.where(seen, output / running_sum, 0.0)
    return output, torch.where(seen, running_max + running_sum.log(), float("inf"))


def _tiled_backward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    output: Tensor,
    grad_output: Tensor,
    lse: Tensor,
    tiling: Tiling,
) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention-2's backward: dq (B, H_kv, G, L_q, D), dk and dv (B, H_kv, 1, L_k, D).

    Walks the blocks the forward computed, recomputing their probabilities from the saved lse.
    A KV head's gradients sum over the G query heads that share it, block by block.
    """
    scale = 1.0 / math.sqrt(query.shape[-1])
    delta = (grad_output * output).sum(dim=-1, keepdim=True)  # D_i = rowsum(dO_i * O_i)
    grad_query = torch.zeros_like(query)
    grad_key, grad_value = torch.zeros_like(key), torch.zeros_like(value)
    for q_start in range(0, query.shape[-2], tiling.block):
        rows = slice(q_start, q_start + tiling.block)
        q, d_out = query[..., rows, :], grad_output[..., rows, :]  # (B, H_kv, G, bq, D)
        for k_start in tiling.key_starts(q_start, q_start + q.shape[-2], key.shape[-2]):
            columns = slice(k_start, k_start + tiling.block)
            k, v = key[..., columns, :], value[..., columns, :]  # (B, H_kv, 1, bk, D)
            scores = tiling.hide(q @ k.transpose(-2, -1) * scale, q_start, k_start)
            probs = (scores - lse[..., rows, :]).exp()  # P = exp(S - lse): (B, H_kv, G, bq, bk)
            # dV += P^T dO and dK += dS^T Q, each summed over the group's G query heads.
            grad_value[..., columns, :] += (probs.transpose(-2, -1) @ d_out).sum(-3, keepdim=True)
            # dS = P * (dP - D) with dP = dO V^T; the softmax scale folded in once, here.
            grad_scores = probs * (d_out @ v.transpose(-2, -1) - delta[..., rows, :]) * scale
            grad_query[..., rows, :] += grad_scores @ k
            grad_key[..., columns, :] += (grad_scores.transpose(-2, -1) @ q).sum(-3, keepdim=True)
    return grad_query, grad_key, grad_value


def _grouped(query: Tensor, key: Tensor, value: Tensor, *like_query: Tensor) -> list[Tensor]:
    """The tiled loops' layout and dtype (float32 or wider; views when already so).

    query and tensors shaped like it: (B, H, L, D) -> (B, H_kv, G, L, D), query heads grouped by
    the KV head they share; key and value: (B, H_kv, L, D) -> (B, H_kv, 1, L, D).
    """
    compute, kv_heads = torch.promote_types(query.dtype, torch.float32), key.shape[-3]
    grouped = [t.to(compute).unflatten(-3, (kv_heads, -1)) for t in (query, *like_query)]
    return [
        grouped[0],
        key.to(compute).unsqueeze(-3),
        value.to(compute).unsqueeze(-3),
        *grouped[1:],
    ]


def _kv_groups(heads: int, kv_heads: int) -> int:
    """How many query heads share each KV head."""
    checks.heads(heads, kv_heads)
    return heads // kv_heads
