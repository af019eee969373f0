"""A time-variant convolution in place of self-attention, after TV-Rec (Shin et al., NeurIPS 2025): a node-variant
graph filter on the line graph of a sequence.

A graph filter is a polynomial of the shift operator S, y = sum_k h_k S^k x; a node-variant filter gives each node
(here each position) taps of its own, y = sum_k diag(h_k) S^k x. With S the one-step shift of a zero-padded sequence
(TV-Rec's directed cyclic graph, padded so that nothing flows backwards) that is a causal convolution whose taps depend
on the position:

    y_t = sum_{k=0..t} H[t, k] x_{t-k},        H = C B,

shared by every channel, H (T x T: position, lag) a mix of M basis filters B (M x T) with per-position coefficients C
(T x M). Positions are absolute in a window of T that sequences are left-padded to, so the last position, the one
that predicts, has taps of its own and no positional embedding is needed. The paper computes the filter in the
spectral domain; here it is the (T, T) lower-triangular matrix A[t, s] = H[t, t - s] applied as one batched matmul,
the cost of one attention head's weights. The authors' code was not available to check against: the formula is the
paper's, as written above, and `tests/core/test_time_variant.py` checks this module against it term by term.

Legend: B batch, T window (positions), T' positions given (a window's last T'), D width, M basis filters."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from core.nn.blocks import Activation, FeedForward, Residual


class TimeVariantFilter(nn.Module):
    """y_t = sum_{k<=t} H[t, k] x_{t-k} with H = C B (module docstring); `max_len` positions, `n_bases` filters."""

    def __init__(self, max_len: int, n_bases: int):
        super().__init__()
        if max_len < 1 or n_bases < 1:
            raise ValueError(f"`max_len` ({max_len}) and `n_bases` ({n_bases}) must be >= 1")
        self.max_len = max_len
        self.coefficients = nn.Parameter(torch.randn(max_len, n_bases) / math.sqrt(n_bases))  # C (T, M)
        self.bases = nn.Parameter(torch.randn(n_bases, max_len) / max_len)  # B (M, T): lags 0..T-1

    def taps(self) -> Tensor:
        """(T, T) H[t, k]: the tap of lag k at position t (lags past t never reach a real input)."""
        return self.coefficients @ self.bases

    def matrix(self, length: int, offset: int = 0) -> Tensor:
        """(T', T') A[i, j] = H[offset + i, i - j] for j <= i, else 0: the filter on window positions offset ..
        offset + T' - 1 (a batch whose leading all-padding columns were cut)."""
        if offset < 0 or offset + length > self.max_len:
            raise ValueError(f"positions {offset}..{offset + length - 1} are outside the filter's window of "
                             f"{self.max_len}")
        i = torch.arange(length, device=self.bases.device)
        lag = i[:, None] - i[None, :]  # (T', T')
        rows = self.taps()[offset : offset + length]  # (T', T)
        return rows.gather(1, lag.clamp(min=0)) * (lag >= 0)

    def forward(self, x: Tensor, valid: Tensor | None = None, offset: int = 0) -> Tensor:
        """(B, T', D) at window positions offset.. -> (B, T', D); `valid` (B, T') True at tokens: padding reads as 0."""
        if valid is not None:
            x = x * valid.unsqueeze(-1).to(x.dtype)
        return self.matrix(x.shape[1], offset).to(x.dtype) @ x  # (T', T') broadcast over B


class TimeVariantLayer(nn.Module):
    """The filter and a feed-forward, each in a pre-LN residual (`residual`: `Residual` or `GatedResidual`)."""

    def __init__(self, d_model: int, d_ff: int, max_len: int, n_bases: int, *, dropout: float = 0.0,
                 activation: Activation = "gelu", residual: type[Residual] = Residual):
        super().__init__()
        self.filter = TimeVariantFilter(max_len, n_bases)
        self.ff = FeedForward(d_model, d_ff, dropout=dropout, activation=activation)
        self.filter_block = residual(d_model, dropout=dropout, norm_first=True)
        self.ff_block = residual(d_model, dropout=dropout, norm_first=True)

    def forward(self, x: Tensor, valid: Tensor | None = None, offset: int = 0) -> Tensor:
        x = self.filter_block(x, lambda h: self.filter(h, valid, offset))
        return self.ff_block(x, self.ff)


class TimeVariantEncoder(nn.Module):
    """`n_layers` `TimeVariantLayer`s and a final LayerNorm: a causal sequence encoder without attention, whose output
    at position t reads inputs up to t only."""

    def __init__(self, d_model: int, *, n_layers: int, d_ff: int, max_len: int, n_bases: int, dropout: float = 0.0,
                 activation: Activation = "gelu", residual: type[Residual] = Residual):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(TimeVariantLayer(d_model, d_ff, max_len, n_bases, dropout=dropout,
                                                     activation=activation, residual=residual)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, valid: Tensor | None = None, *, last: int | None = None, offset: int = 0) -> Tensor:
        """(B, T', D) embedded inputs at window positions offset.. -> (B, T' or `last`, D)."""
        x = self.dropout(x)
        for layer in self.layers:
            x = layer(x, valid, offset)
        return self.norm(x if last is None else x[:, -last:])
