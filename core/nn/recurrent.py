"""A recurrent encoder-decoder: a bidirectional GRU/LSTM encoder and an attentional decoder with input feeding. The
decoder follows Luong et al. (2015): at step t the recurrent stack reads [y_t-1 embedding; h~_t-1] (input feeding: the
previous attentional vector tells it what was attended), its top state h_t attends over the encoder outputs
(`core.nn.scored_attention`: additive, dot or general scores), and the attentional vector is h~_t = tanh(W_c [c_t;
h_t]); the output layer reads h~_t. The initial decoder state is tanh(W m) of the mean m of the encoder outputs over
real source tokens (Nematus' choice), so the decoder needs nothing but the memory and its mask, like the transformer's
`core.nn.Decoder`.

Teacher forcing cannot run the target in parallel (h~_t-1 feeds step t), so a whole target runs step by step
through the same code as incremental decoding; `RecurrentCache` carries the state between calls.

Shared memory rows, as `core.nn.attention.CrossAttention` allows: each of Bm memory rows serves G = B / Bm
consecutive target rows, read once for its G rows (`core.nn.scored_attention`).

Legend: B target rows, Bm memory rows, G = B / Bm, S source length, T target steps, D model width (embeddings, memory,
attentional vector), Hd recurrent hidden width, L layers."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from core.nn.options import check_choice
from core.nn.scored_attention import AdditiveAttention, MultiplicativeAttention

Cell = Literal["gru", "lstm"]
Scoring = Literal["additive", "dot", "general"]


def recurrent_stack(cell: Cell, input_size: int, hidden_size: int, n_layers: int, dropout: float,
                    bidirectional: bool) -> nn.GRU | nn.LSTM:
    """A batch-first `nn.GRU` or `nn.LSTM`, dropout between its layers."""
    check_choice("cell", cell, ("gru", "lstm"))
    if n_layers < 1:
        raise ValueError(f"`n_layers` ({n_layers}) must be >= 1")
    rnn = nn.GRU if cell == "gru" else nn.LSTM
    return rnn(input_size, hidden_size, num_layers=n_layers, batch_first=True, bidirectional=bidirectional,
               dropout=dropout if n_layers > 1 else 0.0)


class RecurrentEncoder(nn.Module):
    """Bidirectional GRU/LSTM over right-padded sources (packed, so padding never enters a state): D-wide
    embeddings in, both directions' Hd-wide states projected back to D out; `dropout` on the inputs, between
    layers and on the output."""

    def __init__(self, d_model: int, hidden_size: int, *, n_layers: int = 2, dropout: float = 0.0, cell: Cell = "gru"):
        super().__init__()
        self.rnn = recurrent_stack(cell, d_model, hidden_size, n_layers, dropout, bidirectional=True)
        self.proj = nn.Linear(2 * hidden_size, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """(B, S, D) embedded source, (B, 1, 1, S) padding mask (True = real) -> (B, S, D); zeros at padding."""
        b, s, _ = x.shape
        real = mask.reshape(b, s)  # (B, S)
        lengths = real.sum(1).clamp(min=1).cpu()  # an all-padding row runs one step; its output is masked
        out, _ = self.rnn(pack_padded_sequence(self.dropout(x), lengths, batch_first=True, enforce_sorted=False))
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=s)  # (B, S, 2Hd)
        return self.proj(self.dropout(out)) * real[:, :, None]


class CausalRecurrentEncoder(nn.Module):
    """A unidirectional GRU/LSTM over left-padded sequences (GRU4Rec's network) whose outputs do not depend on how much
    padding precedes a row. Left padding would run the cell over the padding first (its biases move the state away from
    zero), so each row is rotated to start at column 0, run, and rotated back: two gathers instead of packing, which
    keeps the graph exportable. The hidden width is D too, so states score against item vectors."""

    def __init__(self, d_model: int, *, n_layers: int = 1, dropout: float = 0.0, cell: Cell = "gru"):
        super().__init__()
        self.rnn = recurrent_stack(cell, d_model, d_model, n_layers, dropout, bidirectional=False)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(d_model)  # as the transformer stack's final norm: item scores keep their scale

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """(B, T, D) inputs, (B, T) True at real (left-padded: contiguous, last) positions -> (B, T, D), 0 at pads."""
        b, t, d = x.shape
        shift = t - valid.sum(1)  # (B,) leading padding columns
        cols = torch.arange(t, device=x.device)[None, :]
        # Column j of a rotated row reads column (j + shift) mod T; written with `where`, as the ONNX exporter
        # has no remainder by a symbolic length.
        to_front = cols + shift[:, None]
        to_front = torch.where(to_front >= t, to_front - t, to_front)[..., None]  # (B, T, 1): real items first
        out, _ = self.rnn(self.dropout(x).gather(1, to_front.expand(-1, -1, d)))  # (B, T, D), padding last
        back = cols - shift[:, None]
        back = torch.where(back < 0, back + t, back)[..., None]
        out = out.gather(1, back.expand(-1, -1, out.shape[-1]))  # (B, T, D) left-padded again
        return self.norm(out).masked_fill(~valid[..., None], 0.0)


class RecurrentCache:
    """What an attentional recurrent decoder carries between steps, with `core.nn.DecoderCache`'s reordering."""

    def __init__(self) -> None:
        self.state: tuple[Tensor, ...] | None = None  # (L, B, Hd) each: h, and c for an LSTM
        self.feed: Tensor | None = None  # (B, D) input feed
        self.keys: Tensor | None = None  # (Bm, S, .) the memory's projected keys

    @property
    def started(self) -> bool:
        return self.state is not None

    def reorder(self, index: Tensor) -> None:
        """Select and reorder the rows of both sides (target and memory rows alike)."""
        self.reorder_self(index)
        self.reorder_cross(index)

    def reorder_self(self, index: Tensor) -> None:
        if self.state is not None and self.feed is not None:
            self.state = tuple(h.index_select(1, index) for h in self.state)
            self.feed = self.feed.index_select(0, index)

    def reorder_cross(self, index: Tensor) -> None:
        if self.keys is not None:
            self.keys = self.keys.index_select(0, index)


class RecurrentDecoder(nn.Module):
    """Attentional GRU/LSTM decoder with input feeding (Luong et al., 2015); `dropout` on the input embeddings,
    between layers and on the attentional vector; `attention` "dot" needs hidden_size == d_model."""

    def __init__(self, d_model: int, hidden_size: int, *, n_layers: int = 2, dropout: float = 0.0,
                 cell: Cell = "gru", attention: Scoring = "additive"):
        super().__init__()
        self.n_layers, self.hidden_size, self.cell = n_layers, hidden_size, cell
        self.rnn = recurrent_stack(cell, 2 * d_model, hidden_size, n_layers, dropout, bidirectional=False)
        self.bridge = nn.Linear(d_model, n_layers * hidden_size)
        check_choice("attention", attention, ("additive", "dot", "general"))
        self.cross_attn = (AdditiveAttention(hidden_size, d_model, d_model) if attention == "additive"
                           else MultiplicativeAttention(hidden_size, d_model, attention))
        self.combine = nn.Linear(d_model + hidden_size, d_model)  # W_c
        self.dropout = nn.Dropout(dropout)

    def new_cache(self) -> RecurrentCache:
        return RecurrentCache()

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor, cache: RecurrentCache | None = None) -> Tensor:
        """(B, T, D) embedded inputs (with a cache, the new steps) -> (B, T, D) attentional vectors h~. `memory`
        (Bm, S, D) and its (Bm, 1, 1, S) padding `mask`: shared rows, see the module. `cache` from `new_cache()` is
        advanced by this call (None: decode `x` from the start)."""
        cache = RecurrentCache() if cache is None else cache
        mask = mask.reshape(memory.shape[0], 1, memory.shape[1])  # (Bm, 1, S)
        if not cache.started:
            self._start(cache, memory, mask, x.shape[0])
        x = self.dropout(x)
        return torch.cat([self._step(x[:, t : t + 1], memory, mask, cache) for t in range(x.shape[1])], dim=1)

    def _start(self, cache: RecurrentCache, memory: Tensor, mask: Tensor, rows: int) -> None:
        """Initial state tanh(W mean(memory)) per memory row, given to its G target rows; zero input feed."""
        bm = memory.shape[0]
        real = mask.transpose(1, 2).to(memory.dtype)  # (Bm, S, 1)
        mean = (memory * real).sum(1) / real.sum(1).clamp_min(1.0)  # (Bm, D)
        h = torch.tanh(self.bridge(mean)).view(bm, self.n_layers, self.hidden_size).transpose(0, 1)  # (L, Bm, Hd)
        h = h.repeat_interleave(rows // bm, dim=1).contiguous()  # (L, B, Hd)
        cache.state = (h,) if self.cell == "gru" else (h, torch.zeros_like(h))
        cache.feed = memory.new_zeros(rows, memory.shape[-1])  # (B, D)
        cache.keys = self.cross_attn.project_keys(memory)  # once per source

    def _step(self, x: Tensor, memory: Tensor, mask: Tensor, cache: RecurrentCache) -> Tensor:
        """One step: (B, 1, D) embedded input -> (B, 1, D) attentional vector; advances the cache."""
        assert cache.state is not None and cache.feed is not None
        state = cache.state[0] if self.cell == "gru" else cache.state
        out, state = self.rnn(torch.cat([x, cache.feed[:, None]], dim=-1), state)  # (B, 1, Hd): input feeding
        context, _ = self.cross_attn(out, memory, mask, keys=cache.keys)  # (B, 1, D)
        attentional = self.dropout(torch.tanh(self.combine(torch.cat([context, out], dim=-1))))  # (B, 1, D)
        cache.state = (state,) if self.cell == "gru" else tuple(state)
        cache.feed = attentional[:, 0]
        return attentional
