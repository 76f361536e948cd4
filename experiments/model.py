"""octlm: a small decoder-only language model.

Token embedding, then n_layers blocks of (RMSNorm, causal self-attention with rotary position
embeddings and grouped-query attention, RMSNorm, MLP), each around a residual connection, then a
final RMSNorm and the output head. The attention path (any that octlm_experiments.paths registers,
or "auto", the default, see auto_path) is chosen by the config alone; the parameters are the same
for all of them, so weights move freely between them.

Shapes follow octlm_experiments.attention: B batch, H query heads, H_kv key/value heads, L length,
D head
width; W is the model width and V the vocabulary size.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from octlm_experiments import checks
from octlm_experiments.paths import CAPABILITIES, attend, check_path, unsupported

AUTO = "auto"  # attention=AUTO: the path auto_path picks, call by call
DEFAULT = "sdpa"  # what auto takes where no path declares itself faster


def check_attention(attention: str) -> None:
    """A one-line ValueError unless `attention` is a registered path or auto."""
    check_path(attention, "attention", also=(AUTO,))


def auto_path(
    window: int, length: int, device: torch.device, dropout: float, dtype=torch.float32
) -> str:
    """The path attention="auto" takes: for a sliding window, the registered path that declares
    itself faster than SDPA with the mask on this device from a length this sequence reaches
    (Capabilities.windowed_from, the one declared from the longest such length: tiled from
    2,048 on the CPU, flex from 4,096 on CUDA, as measured), that trains in the dtype there
    (paths.unsupported) and has the attention dropout asked for (neither has any); SDPA
    otherwise."""
    if window == 0:
        return DEFAULT
    faster = [
        (can.windowed_from[device.type], name)
        for name, can in CAPABILITIES.items()
        if can.windowed_from.get(device.type, math.inf) <= length
        and unsupported(name, device, dtype, backward=True) is None
        and (dropout == 0 or can.dropout)
    ]
    return max(faster)[1] if faster else DEFAULT


class RMSNorm(nn.Module):
    """Divide each vector by its root mean square, then scale by a learned gain."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        # Half precision loses the mean of squares, so normalize in at least float32.
        normed = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = normed * torch.rsqrt(normed.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rotary_angles(
    length: int, head_width: int, base: float, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, each (L, D/2): pair i at position t turns t * base^(-2i/D).

    Computed on the fly, in at least float32, rather than kept in buffers that model.to(bfloat16)
    would round; so they are no part of the state_dict either.
    """
    dtype = torch.promote_types(dtype, torch.float32)
    frequencies = base ** -(torch.arange(0, head_width, 2, device=device, dtype=dtype) / head_width)
    positions = torch.arange(length, device=device, dtype=dtype)
    angles = torch.outer(positions, frequencies)  # (L, D/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (x_i, x_{i + D/2}) pairs of x (B, H, L, D) by the angles of their position."""
    first, second = x.to(cos.dtype).chunk(2, dim=-1)  # (B, H, L, D/2) each
    rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.to(x.dtype)


@dataclass
class ModelConfig:
    """Everything that shapes an OctLM; checked on construction.

    attention picks the attention path (octlm_experiments.paths.PATHS, or auto), window > 0 makes it
    a sliding window (a query sees at most `window` keys, itself included), tiled_block is the
    block size of a path that tiles (tiled's).
    """

    vocab_size: int = 256
    width: int = 128
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 8
    max_length: int = 256
    attention: str = AUTO
    dropout: float = 0.0
    window: int = 0
    tiled_block: int = 64
    rope_base: float = 10_000.0

    def __post_init__(self):
        sizes = ("vocab_size", "n_layers", "max_length", "tiled_block")
        checks.positive(**{name: getattr(self, name) for name in sizes})
        checks.heads(self.n_heads, self.n_kv_heads)
        checks.rotary_width(self.width, self.n_heads)
        checks.window(self.window, causal=True)
        check_attention(self.attention)
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.rope_base <= 1:
            raise ValueError(f"rope_base must be greater than 1, got {self.rope_base}")

    @property
    def head_width(self) -> int:
        return self.width // self.n_heads


class CausalSelfAttention(nn.Module):
    """Multi-head, grouped-query or multi-query causal self-attention with rotary positions."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_width = config.head_width
        self.attention, self.window = config.attention, config.window
        self.block, self.dropout = config.tiled_block, config.dropout
        # Grouped-query attention: fewer key/value heads than query heads, so smaller K and V.
        kv_width = config.n_kv_heads * config.head_width
        self.query = nn.Linear(config.width, config.width, bias=False)
        self.key = nn.Linear(config.width, kv_width, bias=False)
        self.value = nn.Linear(config.width, kv_width, bias=False)
        self.output = nn.Linear(config.width, config.width, bias=False)
        self.residual_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        batch, length, width = x.shape
        query = self._split_heads(self.query(x), self.n_heads)  # (B, H, L, D)
        key = self._split_heads(self.key(x), self.n_kv_heads)  # (B, H_kv, L, D)
        value = self._split_heads(self.value(x), self.n_kv_heads)  # (B, H_kv, L, D)
        # Position enters through queries and keys only, so scores see relative position.
        query, key = apply_rotary(query, *rope), apply_rotary(key, *rope)
        attended = self._attend(query, key, value)  # (B, H, L, D)
        attended = attended.transpose(1, 2).reshape(batch, length, width)  # (B, L, W)
        return self.residual_dropout(self.output(attended))

    def _split_heads(self, x: Tensor, heads: int) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, heads, self.head_width).transpose(1, 2)  # (B, heads, L, D)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        # The attention functions take a plain probability and would drop in eval mode too.
        dropout = self.dropout if self.training else 0.0
        path = self.attention
        if path == AUTO:
            path = auto_path(self.window, query.shape[-2], query.device, dropout, query.dtype)
        return attend(
            path, query, key, value, window=self.window, block=self.block, dropout=dropout
        )


class MLP(nn.Module):
    """Widen four times, GELU, narrow back."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.width)
        self.attention = CausalSelfAttention(config)
        self.mlp_norm = RMSNorm(config.width)
        self.mlp = MLP(config.width, config.dropout)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class OctLM(nn.Module):
    """The decoder: token ids (B, L) in, next-token logits (B, L, V) out."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init: each residual branch adds to the stream, so shrink what it adds.
        for name, parameter in self.named_parameters():
            if name.endswith(("attention.output.weight", "mlp.down.weight")):
                nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * config.n_layers))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, L), got shape {tuple(tokens.shape)}")
        length = tokens.shape[1]
        if not 1 <= length <= self.config.max_length:
            raise ValueError(f"length {length} is outside 1..max_length={self.config.max_length}")
        x = self.embedding(tokens)  # (B, L, W)
        rope = rotary_angles(
            length, self.config.head_width, self.config.rope_base, x.device, x.dtype
        )
        for block in self.blocks:
            x = block(x, rope)
        return self.head(self.norm(x))  # (B, L, V)
