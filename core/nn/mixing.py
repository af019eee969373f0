"""Low-pass mixing beside self-attention, made causal: "beyond self-attention" (BSARec, Shin et al. 2024). BSARec splits
each layer's input H into a low-frequency part (the first few Fourier bins over the sequence) and the rest, rescales the
rest per channel by beta^2, and mixes the result with self-attention's output: alpha * filter + (1 - alpha) * attention.
Attention alone smooths away the high-frequency, item-to-item signal; the filter branch puts it back. Its Fourier
transform runs over the whole sequence, so a model trained on every next item (ours) would see each position's future.
Here the low-pass is by default a causal moving average over the last `window` valid positions: the same split, no
future in it, at O(T D) cost. `kind="fourier"` is BSARec's own filter, for models trained at the last position only
(`data.prefixes`).

Legend: B batch, T time, D model width, W window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

LowPassKind = Literal["causal", "fourier"]


@dataclass(frozen=True)
class LowPassMix:
    """The filter branch's settings: `alpha` is its weight (attention gets 1 - alpha). `window`: causal, the
    moving-average length W (a box filter keeps roughly the periods longer than W steps); fourier, BSARec's c, which
    keeps the lowest c // 2 + 1 Fourier bins over `length` positions. `length`: the Fourier transform's length, the
    model's max_len, so a bin means the same period whatever a batch's length (histories are zero-padded to it)."""

    alpha: float = 0.5
    window: int = 16
    kind: LowPassKind = "causal"
    length: int = 50

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"`alpha` of the low-pass mix must be in (0, 1], got {self.alpha}")
        if self.window < 1:
            raise ValueError(f"`window` of the low-pass mix must be >= 1, got {self.window}")
        if self.kind not in ("causal", "fourier"):
            raise ValueError(f"`kind` of the low-pass mix must be causal or fourier, got {self.kind!r}")
        if self.length < 1:
            raise ValueError(f"`length` of the low-pass mix must be >= 1, got {self.length}")


def causal_moving_average(x: Tensor, window: int, valid: Tensor | None = None) -> Tensor:
    """(B, T, D) -> (B, T, D): at t, the mean of x over the valid positions among t - W + 1 .. t. `valid` (B, T), True
    where x holds a token: padding neither counts nor contributes. A position with no valid one in its window (padding
    before the first item) gets zeros."""
    weight = x.new_ones(x.shape[:2]) if valid is None else valid.to(x.dtype)
    sums = torch.cumsum(x * weight.unsqueeze(-1), dim=1)  # (B, T, D)
    counts = torch.cumsum(weight, dim=1)  # (B, T)
    if window < x.shape[1]:
        sums = sums - nn.functional.pad(sums[:, :-window], (0, 0, window, 0))
        counts = counts - nn.functional.pad(counts[:, :-window], (window, 0))
    return sums / counts.clamp_min(1.0).unsqueeze(-1)


def fourier_low_pass(x: Tensor, bins: int, length: int, valid: Tensor | None = None) -> Tensor:
    """(B, T, D) -> (B, T, D): x with all but its lowest `bins` Fourier bins over `length` >= T positions removed.
    BSARec's filter (rfft, zeroed bins, irfft, orthonormal). The rows are zero-padded from T to `length` at the end;
    with the left padding inside T that is a circular shift of a history padded on the left to `length`, which a Fourier
    filter shifts alike. `valid` (B, T) zeroes the padding first."""
    if valid is not None:
        x = x * valid.unsqueeze(-1).to(x.dtype)
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()  # no half-precision FFT on the CPU
    spectrum = torch.fft.rfft(wide, n=max(length, x.shape[1]), dim=1, norm="ortho")
    spectrum[:, bins:] = 0
    low = torch.fft.irfft(spectrum, n=max(length, x.shape[1]), dim=1, norm="ortho")
    return low[:, : x.shape[1]].to(x.dtype)


class LowPassFilter(nn.Module):
    """The filter branch: low + beta^2 * (x - low), `low` the causal moving average or BSARec's Fourier low-pass;
    beta is per channel, initialised N(0, 1) as in BSARec."""

    def __init__(self, d_model: int, mix: LowPassMix):
        super().__init__()
        self.mix = mix
        self.sqrt_beta = nn.Parameter(torch.randn(1, 1, d_model))

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        if self.mix.kind == "fourier":
            low = fourier_low_pass(x, self.mix.window // 2 + 1, self.mix.length, valid)
        else:
            low = causal_moving_average(x, self.mix.window, valid)
        return low + self.sqrt_beta.square() * (x - low)
