"""Attention three ways: the naive reference, FlashAttention's tiled forward, PyTorch's fused SDPA.

Shapes, here and in the model: B batch, H query heads, H_kv key/value heads (H_kv divides H),
L length, D head width. query is (B, H, L, D); key and value are (B, H_kv, L, D). Any leading
dims may stand in for B. Masks follow SDPA: True where a query may attend to a key.

All three share one signature, (query, key, value, *, causal, window, ...):
- causal: a query sees keys at its own position and before (top-left aligned, like SDPA).
- window > 0 (causal only): a query sees at most `window` keys, itself included
  (query - key < window).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def attention_mask(
    length_q: int, length_k: int, *, causal: bool, window: int, device=None
) -> Tensor | None:
    """The (L_q, L_k) boolean mask of visible keys, or None when every key is visible."""
    _check_mask_args(causal, window)
    if not causal:
        return None
    rows = torch.arange(length_q, device=device).unsqueeze(1)
    columns = torch.arange(length_k, device=device).unsqueeze(0)
    visible = columns <= rows
    if window > 0:
        visible &= rows - columns < window
    return visible


def repeat_kv(key: Tensor, value: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Repeat each KV head for the query heads sharing it: (.., H_kv, L, D) -> (.., H, L, D)."""
    kv_heads = key.shape[-3]
    if heads % kv_heads:
        raise ValueError(f"{kv_heads} key/value heads do not divide {heads} query heads")
    groups = heads // kv_heads
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
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.dropout(scores.softmax(dim=-1), p=dropout)
    return weights @ value


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


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block: int = 128,
    *,
    causal: bool = True,
    window: int = 0,
) -> Tensor:
    """FlashAttention's forward: blocks of queries against blocks of keys with a running softmax.

    Nothing of size (L, L) is ever allocated, and key blocks that no query of the block can see
    (above the causal diagonal, or left of the window) are skipped. float16 and bfloat16
    accumulate in float32, as the fused kernels do.
    """
    if block <= 0:
        raise ValueError(f"block must be positive, got {block}")
    _check_mask_args(causal, window)
    key, value = repeat_kv(key, value, query.shape[-3])
    dtype, compute = query.dtype, torch.promote_types(query.dtype, torch.float32)
    query, key, value = query.to(compute), key.to(compute), value.to(compute)
    length_q = query.shape[-2]
    output = torch.empty_like(query)
    for q_start in range(0, length_q, block):
        q_stop = min(q_start + block, length_q)
        output[..., q_start:q_stop, :] = _query_block(
            query[..., q_start:q_stop, :], key, value, q_start, block, causal, window
        )
    return output.to(dtype)


def _query_block(
    query: Tensor, key: Tensor, value: Tensor, q_start: int, block: int, causal: bool, window: int
) -> Tensor:
    """One block of query rows against every key block it can see."""
    length_k, scale = key.shape[-2], 1.0 / math.sqrt(query.shape[-1])
    q_stop = q_start + query.shape[-2]
    rows = torch.arange(q_start, q_stop, device=query.device).unsqueeze(1)
    running_max = query.new_full(query.shape[:-1] + (1,), float("-inf"))  # (B, H, bq, 1)
    running_sum = torch.zeros_like(running_max)
    output = torch.zeros_like(query)  # (B, H, bq, D): unnormalized
    for k_start in _visible_key_blocks(q_start, q_stop, length_k, block, causal, window):
        k_stop = min(k_start + block, length_k)
        scores = query @ key[..., k_start:k_stop, :].transpose(-2, -1) * scale  # (B, H, bq, bk)
        if _straddles_edge(q_start, q_stop, k_start, k_stop, causal, window):
            columns = torch.arange(k_start, k_stop, device=query.device).unsqueeze(0)
            hidden = columns > rows
            if window > 0:
                hidden |= rows - columns >= window
            scores = scores.masked_fill(hidden, float("-inf"))
        block_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        # A row that has seen no visible key yet keeps max 0, so exp(-inf - 0) = 0 below.
        block_max = block_max.masked_fill(block_max.isinf(), 0.0)
        correction = (running_max - block_max).exp()
        weights = (scores - block_max).exp()
        running_sum = correction * running_sum + weights.sum(dim=-1, keepdim=True)
        output = correction * output + weights @ value[..., k_start:k_stop, :]
        running_max = block_max
    return output / running_sum


def _visible_key_blocks(
    q_start: int, q_stop: int, length_k: int, block: int, causal: bool, window: int
) -> range:
    """Start positions of the key blocks that some query in [q_start, q_stop) can see."""
    if not causal:
        return range(0, length_k, block)
    first = max(0, q_start - window + 1) if window > 0 else 0
    return range(first // block * block, min(q_stop, length_k), block)


def _straddles_edge(
    q_start: int, q_stop: int, k_start: int, k_stop: int, causal: bool, window: int
) -> bool:
    """Whether some query of the block cannot see some key of it (so it needs a mask)."""
    if not causal:
        return False
    above_diagonal = k_stop - 1 > q_start
    outside_window = window > 0 and (q_stop - 1) - k_start >= window
    return above_diagonal or outside_window


def _check_mask_args(causal: bool, window: int) -> None:
    if window < 0:
        raise ValueError(f"window must be 0 (off) or positive, got {window}")
    if window > 0 and not causal:
        raise ValueError("a sliding window needs causal attention")
