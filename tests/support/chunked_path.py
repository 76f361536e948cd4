"""An attention path of a user's own, registered from this file alone: attention a chunk of
query rows at a time, by the one visibility rule. `pytest -p chunked_path` then runs every
oracle test on it beside the project's paths (tests/test_attention.py's last test proves it).
With CHUNKED_PATH_OFF_BY=x, a second path too, chunked_off, whose output is off by that much
relative, as a subtly wrong path's would be: the oracle tests must fail it."""

import math
import os

import torch
from torch import Tensor

from octlm_experiments.attention import repeat_kv, visible
from octlm_experiments.paths import register

CHUNK = 5  # query rows at a time: lengths the tests use are rarely a multiple
OFF_BY = os.environ.get("CHUNKED_PATH_OFF_BY")


def chunked_attention(
    query: Tensor, key: Tensor, value: Tensor, *, causal: bool = True, window: int = 0
) -> Tensor:
    key, value = repeat_kv(key, value, query.shape[-3])  # (.., H, L_k, D)
    columns = torch.arange(key.shape[-2], device=query.device).unsqueeze(0)
    chunks = []
    for start in range(0, query.shape[-2], CHUNK):
        rows = query[..., start : start + CHUNK, :]  # (.., H, c, D)
        scores = rows @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (.., H, c, L_k)
        positions = torch.arange(start, start + rows.shape[-2], device=query.device)
        seen = visible(positions.unsqueeze(1), columns, causal=causal, window=window)
        sees_a_key = seen.any(dim=-1, keepdim=True)  # a row that sees none: output 0
        weights = scores.masked_fill(~seen & sees_a_key, float("-inf")).softmax(dim=-1)
        chunks.append((weights * sees_a_key) @ value)
    return torch.cat(chunks, dim=-2)


def chunked_off(query: Tensor, key: Tensor, value: Tensor, *, causal=True, window=0) -> Tensor:
    return chunked_attention(query, key, value, causal=causal, window=window) * (1 + float(OFF_BY))


register("chunked", chunked_attention)
if OFF_BY:
    register("chunked_off", chunked_off)
