"""Position information: added to embeddings (sinusoidal, learned) or inside attention (RoPE rotates q and k, ALiBi adds
a per-head distance bias). Every variant takes an `offset`: the absolute position of the first token, which is the
number of positions already in a KV cache during incremental decoding. Every table needs its `max_len`: core has no
default length (each app sets its own, and a stack passes it on).

Legend: B batch, T time, D model width, H heads, Dh head width (D / H)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _check_length(offset: int, t: int, max_len: int) -> None:
    if offset + t > max_len:
        raise ValueError(f"sequence reaches position {offset + t} but `max_len` is {max_len}; "
                         "raise `max_len` or truncate the input")


class SinusoidalPositions(nn.Module):
    """Fixed sine/cosine positions (Vaswani et al., 2017), added to the input.

    Args:
        d_model: model width D (even).
        max_len: longest sequence the table covers."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even `d_model`, got {d_model}")
        self.max_len = max_len
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq)
        # Not persistent: a pure function of the arguments; checkpoints stay small and a new max_len loads.
        self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add positions `offset .. offset+T-1` to x, (B, T, D)."""
        _check_length(offset, x.shape[1], self.max_len)
        return x + self.table[offset : offset + x.shape[1]].to(x.dtype)


class LearnedPositions(nn.Module):
    """A trained embedding per absolute position, added to the input.

    Args:
        d_model: model width D.
        max_len: number of positions learned."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add positions `offset .. offset+T-1` to x, (B, T, D)."""
        _check_length(offset, x.shape[1], self.max_len)
        return x + self.embedding(torch.arange(offset, offset + x.shape[1], device=x.device)).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al., 2021), applied to queries and keys. "Rotate half" pairing: feature i turns
    with feature i + Dh/2 by `position * base^(-2i/Dh)`, so the score q_m . k_n depends only on m - n.

    Args:
        head_dim: per-head width Dh (even).
        max_len: longest absolute position supported.
        base: frequency base."""

    def __init__(self, head_dim: int, max_len: int, *, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}; change `d_model` or `n_heads`")
        self.max_len = max_len
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq  # (T, Dh/2)
        angles = torch.cat([angles, angles], dim=-1)  # (T, Dh)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate x, (B, H, T, Dh), as positions `offset .. offset+T-1`."""
        t = x.shape[-2]
        _check_length(offset, t, self.max_len)
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)  # the "rotate half" pairing
        return x * self.cos[offset : offset + t].to(x.dtype) + rotated * self.sin[offset : offset + t].to(x.dtype)


def apply_rope(q: Tensor, k: Tensor, rope: RotaryEmbedding, offset: int = 0) -> tuple[Tensor, Tensor]:
    """Rotate (B, H, T, Dh) queries and (B, Hkv, T, Dh) keys of the same tokens, at positions `offset ..` (the
    cache length): keys are rotated before they enter a KV cache, so cached keys keep their own positions."""
    return rope(q, offset), rope(k, offset)


def alibi_slopes(n_heads: int) -> Tensor:
    """Per-head ALiBi slopes (Press et al., 2022): 2^(-8i/H) for i = 1..H. For H not a power of two, the paper's recipe:
    the slopes of the closest lower power of two, then every other slope of the next power of two."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(nn.Module):
    """Attention with linear biases: score(i, j) += -slope_h * |i - j|. An additive float bias for SDPA's `attn_mask`;
    in a causal model (j <= i) the paper's slope_h * (j - i).

    Args:
        n_heads: number of query heads H.
        max_len: longest absolute position supported."""

    def __init__(self, n_heads: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, t_q: int, t_k: int, device: torch.device | None = None) -> Tensor:
        """(1, H, Tq, Tk) float32 bias for `t_q` queries that are the last of `t_k` keys (KV-cache aligned)."""
        _check_length(0, t_k, self.max_len)
        q_pos = torch.arange(t_k - t_q, t_k, device=device)
        k_pos = torch.arange(t_k, device=device)
        dist = (q_pos[:, None] - k_pos[None, :]).abs().float()  # (Tq, Tk)
        return -(self.slopes.to(device)[:, None, None] * dist)[None]
