"""Transformer layers: feed-forward, encoder layer, decoder layer; pre-LN or post-LN. Pre-LN (`norm_first=True`,
default): x + f(norm(x)); trains without warmup tricks and needs a final norm after the stack. Post-LN: norm(x + f(x)),
the original Transformer. Gated (encoder layers, pre-LN only): x + sigmoid(x G + c) * f(norm(x)), LiGR's residual (Gui
et al., 2025, arXiv 2502.03417) as eSASRec trains it: each position learns how much of each sublayer's update to take.

Legend: B batch, T target/time, S source, D model width, F feed-forward width."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.nn.attention import CrossAttention, MultiHeadAttention, SequenceKernel, SideStream
from core.nn.kv_cache import KVCache, StaticKV
from core.nn.mixing import LowPassFilter, LowPassMix
from core.nn.options import check_choice
from core.nn.positions import RotaryEmbedding

Activation = Literal["gelu", "relu", "swiglu"]


class FeedForward(nn.Module):
    """Position-wise feed-forward network.

    Args:
        d_model: model width D.
        d_ff: hidden width F.
        dropout: dropout after the activation.
        activation: "gelu", "relu", or "swiglu" (Shazeer, 2020: silu(xW) * xV, two input projections of width F each).
    """

    def __init__(self, d_model: int, d_ff: int, *, dropout: float = 0.0, activation: Activation = "gelu"):
        super().__init__()
        check_choice("activation", activation, ("gelu", "relu", "swiglu"))
        self.activation = activation
        self.up = nn.Linear(d_model, 2 * d_ff if activation == "swiglu" else d_ff)
        self.down = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)  # (B, T, F) or (B, T, 2F)
        if self.activation == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        else:
            h = F.gelu(h) if self.activation == "gelu" else F.relu(h)
        return self.down(self.drop(h))


class Residual(nn.Module):
    """One sublayer with its norm, dropout and residual connection: pre-LN x + f(norm(x)), post-LN norm(x + f(x)).

    Args:
        d_model: model width D.
        dropout: dropout on the sublayer's output.
        norm_first: pre-LN (True) or post-LN (False)."""

    def __init__(self, d_model: int, *, dropout: float, norm_first: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        # `fn` may return only the last positions (`EncoderLayer`'s `last`): the skip follows it (`_skip`).
        if self.norm_first:
            out = fn(self.norm(x))
            return self._skip(x, out) + self.drop(out)
        out = fn(x)
        return self.norm(self._skip(x, out) + self.drop(out))

    @staticmethod
    def _skip(x: Tensor, out: Tensor) -> Tensor:
        return x[:, x.shape[1] - out.shape[1] :]


class GatedResidual(Residual):
    """Pre-LN residual with a learned sigmoid gate on the update: x + sigmoid(W x + b) * f(norm(x)) (LiGR's).

    Args:
        d_model: model width D.
        dropout: dropout on the sublayer's output.
        norm_first: must be True (pre-LN)."""

    def __init__(self, d_model: int, *, dropout: float, norm_first: bool):
        if not norm_first:
            raise ValueError("a gated residual is pre-LN's (`norm_first=True`): post-LN normalises the sum instead")
        super().__init__(d_model, dropout=dropout, norm_first=norm_first)
        self.gate = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        out = fn(self.norm(x))
        skip = self._skip(x, out)
        return skip + torch.sigmoid(self.gate(skip)) * self.drop(out)


class EncoderLayer(nn.Module):
    """Self-attention + feed-forward. Causal when called with `is_causal=True`.

    Args:
        d_model: model width D.
        n_heads: attention heads.
        n_kv_heads: key/value heads for grouped-query attention (default n_heads).
        d_ff: feed-forward width.
        dropout: dropout on sublayer outputs and inside the feed-forward.
        attn_dropout: dropout on attention weights.
        ff_dropout: dropout after the feed-forward activation (fairseq's `activation_dropout`); None: `dropout`.
        activation: feed-forward activation.
        norm_first: pre-LN (True) or post-LN (False).
        mix: a low-pass filter branch mixed with self-attention (`core.nn.mixing`); None: attention only.
        kernel: the self-attention's `SequenceKernel` (`MultiHeadAttention`); None: the softmax over all keys.
        residual: the residual kind of both sublayers: `Residual` or `GatedResidual` (pre-LN only).
        side: a `SideStream` adding its own query-key logits to the self-attention's (`MultiHeadAttention`)."""

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None, d_ff: int,
                 dropout: float = 0.0, attn_dropout: float = 0.0, ff_dropout: float | None = None,
                 activation: Activation = "gelu", norm_first: bool = True, mix: LowPassMix | None = None,
                 kernel: SequenceKernel | None = None, residual: type[Residual] = Residual,
                 side: SideStream | None = None):
        super().__init__()
        ff_p = dropout if ff_dropout is None else ff_dropout
        self.self_attn = MultiHeadAttention(d_model, n_heads, kernel=kernel, n_kv_heads=n_kv_heads,
                                            dropout=attn_dropout, side=side)
        self.ff = FeedForward(d_model, d_ff, dropout=ff_p, activation=activation)
        self.attn_block = residual(d_model, dropout=dropout, norm_first=norm_first)
        self.ff_block = residual(d_model, dropout=dropout, norm_first=norm_first)
        self.mix = mix
        self.filter = None if mix is None else LowPassFilter(d_model, mix)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, is_causal: bool = False,
                rope: RotaryEmbedding | None = None, bias: Tensor | None = None, cache: KVCache | None = None,
                last: int | None = None, valid: Tensor | None = None, side: Tensor | None = None) -> Tensor:
        """Arguments as in `MultiHeadAttention.forward`; `valid` is also what the low-pass filter averages."""
        x = self.attn_block(x, lambda h: self._mixed(h, mask, is_causal=is_causal, rope=rope, bias=bias,
                                                     cache=cache, last=last, valid=valid, side=side))
        return self.ff_block(x, self.ff)

    def _mixed(self, h: Tensor, mask: Tensor | None, *, valid: Tensor | None, last: int | None, **attn) -> Tensor:
        out = self.self_attn(h, mask, last=last, valid=valid if self.self_attn.kernel is not None else None, **attn)
        if self.filter is None:
            return out
        if attn["cache"] is not None:
            raise ValueError("the low-pass mix averages over the whole history: decode without a KV cache")
        filtered = self.filter(h, valid)[:, h.shape[1] - out.shape[1] :]
        return self.mix.alpha * filtered + (1.0 - self.mix.alpha) * out


class DecoderLayer(nn.Module):
    """Causal self-attention + cross-attention to the encoder + feed-forward.

    Args:
        d_model: model width D.
        n_heads: attention heads (self and cross).
        n_kv_heads: key/value heads for grouped-query attention (default n_heads).
        d_ff: feed-forward width.
        dropout: dropout on sublayer outputs and inside the feed-forward.
        attn_dropout: dropout on attention weights.
        ff_dropout: dropout after the feed-forward activation (fairseq's `activation_dropout`); None: `dropout`.
        activation: feed-forward activation.
        norm_first: pre-LN (True) or post-LN (False)."""

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None, d_ff: int,
                 dropout: float = 0.0, attn_dropout: float = 0.0, ff_dropout: float | None = None,
                 activation: Activation = "gelu", norm_first: bool = True):
        super().__init__()
        attn = dict(n_kv_heads=n_kv_heads, dropout=attn_dropout)
        ff_p = dropout if ff_dropout is None else ff_dropout
        self.self_attn = MultiHeadAttention(d_model, n_heads, **attn)
        self.cross_attn = CrossAttention(d_model, n_heads, **attn)
        self.ff = FeedForward(d_model, d_ff, dropout=ff_p, activation=activation)
        self.self_block, self.cross_block, self.ff_block = (
            Residual(d_model, dropout=dropout, norm_first=norm_first) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None = None, *,
                self_mask: Tensor | None = None, rope: RotaryEmbedding | None = None, bias: Tensor | None = None,
                cache: KVCache | None = None, cross_cache: StaticKV | None = None) -> Tensor:
        """(B, T, D) targets (with a cache, only the new steps) against (Bm, S, D) memory (see `CrossAttention`).
        `self_mask` is an extra target mask (causality is always applied); `rope` and `bias` (ALiBi) act in
        self-attention only."""
        x = self.self_block(x, lambda h: self.self_attn(h, self_mask, is_causal=True, rope=rope, bias=bias,
                                                        cache=cache))
        x = self.cross_block(x, lambda h: self.cross_attn(h, memory, memory_mask, cache=cross_cache))
        return self.ff_block(x, self.ff)
