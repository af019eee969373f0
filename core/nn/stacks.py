"""Embeddings and layer stacks: encoder (bidirectional or causal) and decoder. Initialisation (documented because it
changes results): every `nn.Linear` inside a stack gets Xavier-uniform weights and zero biases; token embeddings are
N(0, D^-1/2) and scaled by sqrt(D) on the way in, so their output has unit variance at the start and the same matrix
works as a tied output projection (Vaswani et al. 2017; fairseq); LayerNorms start at (1, 0); learned positions are
N(0, 0.02).

Legend: B batch, T time, S source length, D model width, V vocabulary size."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from core.nn.attention import SequenceKernel, SideStream
from core.nn.blocks import Activation, DecoderLayer, EncoderLayer, Residual
from core.nn.kv_cache import DecoderCache
from core.nn.masks import additive_mask, causal_mask, combine_masks
from core.nn.mixing import LowPassMix
from core.nn.options import check_choice
from core.nn.positions import ALiBi, LearnedPositions, RotaryEmbedding, SinusoidalPositions, _check_length

Positions = Literal["sinusoidal", "learned", "rope", "alibi", "none"]


class TokenEmbedding(nn.Module):
    """Token embedding scaled by sqrt(d_model) (the initialisation: module docstring).

    Args:
        num_embeddings: vocabulary size V (items or subwords, padding included).
        d_model: model width D.
        pad_id: id whose vector is zero and receives no gradient (None: no padding); the apps
            keep theirs (`streamrec.data.constants.PAD_ID`, `translate.data.vocab.PAD_ID`).
        init_std: standard deviation of the initial vectors (None: d_model ** -0.5, unit variance once scaled)."""

    def __init__(self, num_embeddings: int, d_model: int, *, pad_id: int | None, init_std: float | None = None):
        super().__init__()
        if init_std is not None and init_std <= 0:
            raise ValueError(f"`init_std` must be > 0, got {init_std}")
        self.embedding = nn.Embedding(num_embeddings, d_model, padding_idx=pad_id)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5 if init_std is None else init_std)
        if pad_id is not None:
            self.embedding.weight.data[pad_id].zero_()
        self.scale = math.sqrt(d_model)

    @property
    def weight(self) -> Tensor:  # (V, D), e.g. for tied output scores
        return self.embedding.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.embedding(ids) * self.scale


def tie_weights(output: nn.Linear, embedding: TokenEmbedding) -> None:
    """Make an output projection share the embedding matrix (Press & Wolf, 2017)."""
    if output.weight.shape != embedding.weight.shape:
        raise ValueError(f"cannot tie an output layer of shape {tuple(output.weight.shape)} "
                         f"to an embedding of shape {tuple(embedding.weight.shape)}")
    output.weight = embedding.embedding.weight


def init_linear(module: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every `nn.Linear` in `module`."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class _Stack(nn.Module):
    """What both stacks share: positions (an additive table, or RoPE/ALiBi inside attention), input
    dropout, `n_layers` layers of one kind, a final norm, and the documented initialisation."""

    def __init__(self, layer: type[EncoderLayer] | type[DecoderLayer], d_model: int, n_heads: int, *,
                 n_kv_heads: int | None, n_layers: int, d_ff: int, dropout: float, attn_dropout: float,
                 ff_dropout: float | None, max_len: int, positions: Positions, activation: Activation,
                 norm_first: bool, **layer_options):
        super().__init__()
        # Checked here too: RoPE and ALiBi are sized from n_heads before any layer exists.
        if n_heads <= 0 or d_model % n_heads:
            raise ValueError(f"`n_heads` ({n_heads}) must divide `d_model` ({d_model})")
        check_choice("positions", positions, ("sinusoidal", "learned", "rope", "alibi", "none"))
        self.max_len = max_len
        additive = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}.get(positions)
        self.additive: nn.Module | None = None if additive is None else additive(d_model, max_len)
        self.rope = RotaryEmbedding(d_model // n_heads, max_len) if positions == "rope" else None
        self.alibi = ALiBi(n_heads, max_len) if positions == "alibi" else None
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            layer(d_model, n_heads, n_kv_heads=n_kv_heads, d_ff=d_ff, dropout=dropout, attn_dropout=attn_dropout,
                  ff_dropout=ff_dropout, activation=activation, norm_first=norm_first, **layer_options)
            for _ in range(n_layers)
        )
        # Post-LN already normalises each layer's output; pre-LN needs a final norm.
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        init_linear(self.layers)

    def _positions(self, x: Tensor, offset: int, cached: bool = True) -> tuple[Tensor, Tensor | None]:
        """x with additive positions from `offset`, and the ALiBi bias or None (`cached`: the keys include
        `offset` cached steps before x)."""
        t = x.shape[1]
        _check_length(offset, t, self.max_len)
        if self.additive is not None:
            x = self.additive(x, offset)
        bias = None if self.alibi is None else self.alibi(t, offset * cached + t, device=x.device)
        return x, bias


class Encoder(_Stack):
    """A stack of self-attention layers with positions and a final norm (pre-LN only). Bidirectional by default;
    `causal=True` makes it a decoder-only stack (StreamRec), which can also decode incrementally with a
    `DecoderCache(n_layers, cross=False)`.

    Args:
        d_model: model width D.
        n_heads: attention heads; must divide D.
        n_kv_heads: key/value heads (grouped-query attention); default n_heads.
        n_layers: number of layers.
        d_ff: feed-forward width.
        dropout: dropout on the input and inside each layer.
        attn_dropout: dropout on attention weights.
        ff_dropout: dropout after each feed-forward activation; None uses `dropout`.
        max_len: longest sequence supported (no default: each app sets its own).
        positions: "sinusoidal", "learned", "rope", "alibi" or "none".
        activation: feed-forward activation ("gelu", "relu", "swiglu").
        norm_first: pre-LN (True) or post-LN (False).
        causal: forbid attending to later positions.
        mix: a causal low-pass branch beside each layer's attention (`core.nn.mixing`); needs `causal`.
        kernel: for long histories, every layer's `SequenceKernel` (`core.nn.windowed.WindowAttention`,
            `core.nn.linear_attention.LinearAttention`): causal only, no (T, T) mask, the padding as `valid`.
        residual: every layer's residual kind (`core.nn.blocks.Residual`, or `GatedResidual`: pre-LN only).
        side: a `core.nn.attention.SideStream`: each layer projects `forward`'s `side` to logits of its own."""

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None, n_layers: int, d_ff: int,
                 dropout: float = 0.0, attn_dropout: float = 0.0, ff_dropout: float | None = None, max_len: int,
                 positions: Positions = "sinusoidal", activation: Activation = "gelu", norm_first: bool = True,
                 causal: bool = False, mix: LowPassMix | None = None, kernel: SequenceKernel | None = None,
                 residual: type[Residual] = Residual, side: SideStream | None = None):
        if mix is not None and not causal:
            raise ValueError("the low-pass mix is a causal filter: use it with `causal=True`")
        if kernel is not None and (not causal or positions == "alibi"):
            raise ValueError(f"attention {type(kernel).__name__} needs `causal=True` and positions other than alibi")
        super().__init__(EncoderLayer, d_model, n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers, d_ff=d_ff,
                         dropout=dropout, attn_dropout=attn_dropout, ff_dropout=ff_dropout, max_len=max_len,
                         positions=positions, activation=activation, norm_first=norm_first, mix=mix, kernel=kernel,
                         residual=residual, side=side)
        self.causal = causal
        self.kernel = kernel

    def new_cache(self) -> DecoderCache:
        """An empty cache for incremental causal decoding with this stack."""
        if not self.causal or self.kernel is not None:
            raise ValueError("incremental decoding needs a causal encoder (`causal=True`) with full attention")
        return DecoderCache(len(self.layers), cross=False)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, cache: DecoderCache | None = None,
                last: int | None = None, offset: int = 0, valid: Tensor | None = None,
                side: Tensor | None = None) -> Tensor:
        """(B, T, D) embedded tokens (positions are added here) -> (B, T, D), or (B, last, D). `mask` broadcasts to
        (B, H, T, T). `last`: the final layer computes only the last `last` positions (a recommender needs the last
        state alone). `offset`: the first column's position without a cache, so left-padded inputs cut to their longest
        row keep every item's position. `valid` (B, T), True at tokens: what a low-pass mix averages and the padding a
        `kernel` reads (all positions when None). `side` (B, T, width): the `SideStream` at x's positions, the same in
        every layer (never updated by them)."""
        if cache is not None:
            offset = cache.offset
        x, bias = self._positions(x, offset, cached=cache is not None)
        causal = self.causal
        capturing = any(layer.self_attn.capture is not None for layer in self.layers)
        if self.kernel is not None and mask is not None:
            raise ValueError(f"attention {type(self.kernel).__name__} takes the padding as `valid` (B, T), not a mask")
        if causal and mask is not None and cache is None and not capturing:
            # Causality and padding folded into one float mask here, not re-combined and converted in each
            # layer. (Capture mode keeps the boolean mask: it reports a query that sees no key as a zero row.)
            device = x.device.type
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
            bias = additive_mask(combine_masks(mask, causal_mask(x.shape[1], device=x.device)), dtype, bias)
            mask, causal = None, False
        x = self.drop(x)
        final = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache.self_attn[i]
            x = layer(x, mask, is_causal=causal, rope=self.rope, bias=bias, cache=layer_cache,
                      last=last if i == final else None, valid=valid, side=side)
        return self.norm(x if last is None else x[:, -last:])


class Decoder(_Stack):
    """A stack of decoder layers (causal self-attention + cross-attention) and a final norm (pre-LN only).

    Args:
        d_model: model width D.
        n_heads: attention heads; must divide D.
        n_kv_heads: key/value heads (grouped-query attention); default n_heads.
        n_layers: number of layers.
        d_ff: feed-forward width.
        dropout: dropout on the input and inside each layer.
        attn_dropout: dropout on attention weights.
        ff_dropout: dropout after each feed-forward activation; None uses `dropout`.
        max_len: longest target sequence supported (no default: each app sets its own).
        positions: "sinusoidal", "learned", "rope", "alibi" or "none" (self-attention only).
        activation: feed-forward activation ("gelu", "relu", "swiglu").
        norm_first: pre-LN (True) or post-LN (False)."""

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None, n_layers: int, d_ff: int,
                 dropout: float = 0.0, attn_dropout: float = 0.0, ff_dropout: float | None = None, max_len: int,
                 positions: Positions = "sinusoidal", activation: Activation = "gelu", norm_first: bool = True):
        super().__init__(DecoderLayer, d_model, n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers, d_ff=d_ff,
                         dropout=dropout, attn_dropout=attn_dropout, ff_dropout=ff_dropout, max_len=max_len,
                         positions=positions, activation=activation, norm_first=norm_first)

    def new_cache(self, capacity: int = 16) -> DecoderCache:
        """An empty cache for incremental decoding with this stack, first sized for `capacity` steps."""
        return DecoderCache(len(self.layers), cross=True, capacity=capacity)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None = None, *,
                self_mask: Tensor | None = None, cache: DecoderCache | None = None) -> Tensor:
        """(B, T, D) embedded targets against the encoder output -> (B, T, D); arguments as in
        `DecoderLayer.forward`, `cache` from `new_cache()` (filled and advanced by this call)."""
        x, bias = self._positions(x, 0 if cache is None else cache.offset)
        x = self.drop(x)
        for i, layer in enumerate(self.layers):
            self_cache = None if cache is None else cache.self_attn[i]
            cross_cache = None if cache is None or cache.cross_attn is None else cache.cross_attn[i]
            x = layer(x, memory, memory_mask, self_mask=self_mask, rope=self.rope, bias=bias, cache=self_cache,
                      cross_cache=cross_cache)
        return self.norm(x)
