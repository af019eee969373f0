"""Low-pass mixing beside self-attention, made causal: "beyond self-attention" (BSARec, Shin et al. 2024).

BSARec splits each layer's input H into a low-frequency part (the first few Fourier bins over the
sequence) and the rest, rescales the rest per channel by beta^2, and mixes the result with
self-attention's output: alpha * filter + (1 - alpha) * attention. Attention alone acts as a
low-pass filter that smooths away the high-frequency, item-to-item signal; the filter branch
puts it back. Its Fourier transform runs over the whole sequence, which is fine when a model is
trained and scored at the last position only, but a model trained on every next item (ours)
would then see each position's future. Here the low-pass is a causal moving average over the
last `window` valid positions: the same split into a slow trend and what is left, with no
future in it, at O(T D) cost.

Legend: B batch, T time, D model width, W window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class LowPassMix:
    """The filter branch's settings.

    Args:
        alpha: the filter branch's weight; attention gets 1 - alpha. BSARec's best values were 0.3-0.7.
        window: moving-average length W; a box filter of length W keeps roughly the periods longer than
            W steps (BSARec's c = 5 bins of a 50-item sequence keep periods of about 17 items and more).
    """

    alpha: float = 0.5
    window: int = 16

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"`alpha` of the low-pass mix must be in (0, 1], got {self.alpha}")
        if self.window < 1:
            raise ValueError(f"`window` of the low-pass mix must be >= 1, got {self.window}")


def causal_moving_average(x: Tensor, window: int, valid: Tensor | None = None) -> Tensor:
    """(B, T, D) -> (B, T, D): at t, the mean of x over the valid positions among t - W + 1 .. t.

    `valid` (B, T), True where x holds a token: padding neither counts nor contributes. A position with no
    valid one in its window (padding before the first item) gets zeros.
    """
    weight = x.new_ones(x.shape[:2]) if valid is None else valid.to(x.dtype)
    sums = torch.cumsum(x * weight.unsqueeze(-1), dim=1)  # (B, T, D)
    counts = torch.cumsum(weight, dim=1)  # (B, T)
    if window < x.shape[1]:
        sums = sums - nn.functional.pad(sums[:, :-window], (0, 0, window, 0))
        counts = counts - nn.functional.pad(counts[:, :-window], (window, 0))
    return sums / counts.clamp_min(1.0).unsqueeze(-1)


class LowPassFilter(nn.Module):
    """The filter branch: low + beta^2 * (x - low), with the causal moving average as `low`.

    Args:
        d_model: model width D (beta is per channel, initialised N(0, 1) as in BSARec).
        window: moving-average length.
    """

    def __init__(self, d_model: int, window: int):
        super().__init__()
        self.window = window
        self.sqrt_beta = nn.Parameter(torch.randn(1, 1, d_model))

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        """(B, T, D) -> (B, T, D); position t reads only positions <= t."""
        low = causal_moving_average(x, self.window, valid)
        return low + self.sqrt_beta.square() * (x - low)
