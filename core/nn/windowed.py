"""Causal sliding-window (local) attention in blocks: time and memory linear in the sequence length. Query t sees
keys t - W + 1 .. t. A banded mask over full attention gives the same result but still computes and stores all T x T
scores. Here the queries are cut into blocks of W, and each block attends only to its own block and the one before it
(2W keys, the band masked inside), so the scores take T x 2W.

On CUDA the same band runs as FlexAttention's block-sparse kernel instead (`kernel="flex"`, compiled once
per process): it skips the key blocks outside the band without copying K and V into block pairs.

Legend: B batch, H query heads, Hkv key/value heads, T time, W window, N blocks (T / W rounded up), Dh head width."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

WindowKernel = Literal["auto", "blocks", "flex"]
KERNELS: tuple[str, ...] = get_args(WindowKernel)


def windowed_attention(q: Tensor, k: Tensor, v: Tensor, window: int, valid: Tensor | None = None,
                       dropout_p: float = 0.0, kernel: WindowKernel = "auto") -> Tensor:
    """Causal attention of each of the (B, H, T, Dh) queries to the last `window` of the (B, Hkv, T, Dh) keys and values
    (itself included) -> (B, H, T, Dh); a query that sees no `valid` key gets zeros. `kernel`: "blocks" (SDPA over block
    pairs, any device), "flex" (FlexAttention with the band as a block mask; no dropout; eager, hence slow, off CUDA) or
    "auto": flex on CUDA when it exists and there is no dropout."""
    if window < 1:
        raise ValueError(f"`window` must be >= 1, got {window}")
    if kernel not in KERNELS:
        raise ValueError(f"`kernel` must be one of {KERNELS}, got {kernel!r}")
    if kernel == "auto":
        kernel = "flex" if q.is_cuda and dropout_p == 0.0 and _flex() is not None else "blocks"
    keep = torch.ones_like(q[:, 0, :, 0], dtype=torch.bool) if valid is None else valid.to(torch.bool)  # (B, T)
    if kernel == "flex":
        return _flex_windowed(q, k, v, window, keep, dropout_p)
    b, h, t, dh = q.shape
    k, v = (x if x.shape[1] == h else x.repeat_interleave(h // x.shape[1], dim=1) for x in (k, v))  # GQA
    n = -(-t // window)
    pad = n * window - t  # at the end: later positions, which no real query sees
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    keep = F.pad(keep, (window, pad))  # (B, W + N*W): one block of padding before the first
    # Blocks become batch rows, (B*N, H, W, Dh): four-dimensional, so SDPA's fused CPU kernel takes the mask.
    qb = q.reshape(b, h, n, window, dh).transpose(1, 2).reshape(b * n, h, window, dh)
    kb, vb = (_with_previous_block(x, n, window) for x in (k, v))  # (B*N, H, 2W, Dh)
    key_keep = keep.unfold(1, 2 * window, window).reshape(b * n, 1, 1, 2 * window)  # the previous block first
    i = torch.arange(window, device=q.device)[:, None]
    j = torch.arange(2 * window, device=q.device)[None, :]
    band = (j > i) & (j <= i + window)  # key j of the pair sits at position j - W relative to the block
    mask = band & key_keep  # (B*N, 1, W, 2W)
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=dropout_p)
    out = out.masked_fill(~mask.any(-1, keepdim=True), 0.0)  # no visible key: 0, on every backend
    return out.reshape(b, n, h, window, dh).transpose(1, 2).reshape(b, h, n * window, dh)[:, :, :t]


def _with_previous_block(x: Tensor, n: int, window: int) -> Tensor:
    """(B, H, N*W, Dh) -> (B*N, H, 2W, Dh): each block preceded by the block before it (zeros for the first)."""
    b, h, _, dh = x.shape
    blocks = x.reshape(b, h, n, window, dh).transpose(1, 2)  # (B, N, H, W, Dh)
    previous = F.pad(blocks, (0, 0, 0, 0, 0, 0, 1, 0))[:, :n]  # shift by one block
    return torch.cat([previous, blocks], dim=3).reshape(b * n, h, 2 * window, dh)


@cache
def _flex() -> tuple | None:
    """(flex_attention, create_block_mask) from torch's public module, or None on a torch without it."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    return flex_attention, create_block_mask


@cache
def _mask_options(cuda: bool) -> dict[str, bool]:
    """`_compile=True` where `create_block_mask` takes it (a private flag, hence the check): the eager mask
    evaluates all B x T x T entries, the compiled one only the block summaries. Callers never change it."""
    return {"_compile": True} if cuda and "_compile" in inspect.signature(_flex()[1]).parameters else {}


@cache
def _compiled_flex():
    """FlexAttention compiled once: uncompiled it runs a reference loop that materialises every score."""
    return torch.compile(_flex()[0], dynamic=False)


def _flex_windowed(q: Tensor, k: Tensor, v: Tensor, window: int, keep: Tensor, dropout_p: float) -> Tensor:
    """The band as a FlexAttention block mask: key blocks wholly outside it are never read; `keep` (B, T) bool."""
    parts = _flex()
    if parts is None:
        raise ValueError(f"kernel 'flex' needs torch.nn.attention.flex_attention, which torch {torch.__version__} "
                         "lacks; use kernel 'blocks'")
    if dropout_p:
        raise ValueError("kernel 'flex' has no attention dropout; use kernel 'blocks' when dropout_p > 0")
    flex_attention, create_block_mask = parts
    b, h, t, _ = q.shape

    def band(batch, head, qi, kj):  # FlexAttention's mask_mod: True where query qi may see key kj
        return (kj <= qi) & (kj > qi - window) & keep[batch, kj]

    mask = create_block_mask(band, b, None, t, t, device=q.device, **_mask_options(q.is_cuda))
    run = _compiled_flex() if q.is_cuda else flex_attention
    out = run(q, k, v, block_mask=mask, enable_gqa=k.shape[1] != h)
    # A query with no valid key in its window gets zeros, as the blocks give (FlexAttention's own choice for such
    # rows is not promised across versions): key counts in the window from a running sum of `keep`.
    seen = F.pad(keep.cumsum(1), (window, 0))
    visible = (seen[:, window:] - seen[:, :t]) > 0  # (B, T)
    return out.masked_fill(~visible[:, None, :, None], 0.0)


@dataclass(frozen=True)
class WindowAttention:
    """Causal attention over the last `window` positions, as a part `MultiHeadAttention` takes (`kernel`).

    Args:
        window: the positions each query sees, itself included."""

    window: int = 256

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"attention `window` must be >= 1, got {self.window}")

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, dropout_p: float) -> Tensor:
        return windowed_attention(q, k, v, self.window, valid, dropout_p=dropout_p)
