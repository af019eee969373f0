"""Attention masks, one convention for the whole project. A mask is a boolean tensor where **True means "may attend"**,
the meaning `torch.nn.functional.scaled_dot_product_attention` gives a boolean `attn_mask`. Every mask here broadcasts
to (B, H, Tq, Tk):

- padding masks are (B, 1, 1, Tk): they hide padded keys from every query;
- causal masks are (Tq, Tk): query i may see keys up to its own absolute position;
- `combine_masks` ANDs any of them together (None means "no restriction").

Legend: B batch, H heads, T time, Tq query length, Tk key length."""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, T) token ids -> (B, 1, 1, T) key mask, True where the token is not `pad_id`."""
    return (ids != pad_id)[:, None, None, :]


def lengths_mask(lengths: Tensor, max_len: int | None = None, left_padded: bool = False) -> Tensor:
    """(B,) real-token counts -> (B, 1, 1, T) key mask, T = `max_len` or the longest; `left_padded`: padding
    sits before the tokens (StreamRec's histories)."""
    t = int(lengths.max()) if max_len is None else max_len
    if bool((lengths > t).any()):
        raise ValueError(f"a length ({int(lengths.max())}) exceeds `max_len` ({t})")
    pos = torch.arange(t, device=lengths.device)[None, :]
    keep = pos >= (t - lengths)[:, None] if left_padded else pos < lengths[:, None]
    return keep[:, None, None, :]


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) lower-triangular mask aligned to the end of the keys (`t_k` defaults to `t_q`). With a KV cache the
    `t_q` new queries sit at absolute positions `t_k - t_q .. t_k - 1`, so query i may attend keys `0 .. t_k - t_q + i`.
    (SDPA's own `is_causal` aligns to the top-left, right only when t_q == t_k.)"""
    t_k = t_q if t_k is None else t_k
    if t_k < t_q:
        raise ValueError(f"causal mask needs at least as many keys ({t_k}) as queries ({t_q})")
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """AND boolean masks together, broadcasting; `None` entries impose nothing (all None: None)."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise TypeError(f"masks must be boolean (True = may attend), got {m.dtype}")
        out = m if out is None else out & m
    return out


def causal_padding_mask(key_mask: Tensor) -> Tensor:
    """(B, 1, 1, T) padding mask -> (B, 1, T, T) causal padding mask with no empty rows. A left-padded query at a pad
    position would see no key at all; some SDPA kernels then return NaN. Letting every query see itself keeps all rows
    finite; pad outputs are ignored by the loss anyway."""
    t, device = key_mask.shape[-1], key_mask.device
    return (causal_mask(t, device=device) & key_mask) | torch.eye(t, dtype=torch.bool, device=device)


def additive_mask(mask: Tensor, dtype: torch.dtype, bias: Tensor | None = None) -> Tensor:
    """A boolean mask as SDPA's float `attn_mask`: 0 (plus `bias`) where allowed, the dtype's minimum elsewhere. Built
    once per forward pass, this spares SDPA converting a (B, 1, T, T) boolean mask in every layer. The minimum rather
    than -inf keeps a row with no allowed key finite (it averages the values, not NaN). `dtype`: the attention's compute
    dtype (bf16 under autocast)."""
    base = torch.zeros((), dtype=dtype, device=mask.device) if bias is None else bias.to(dtype)
    return base.expand(torch.broadcast_shapes(base.shape, mask.shape)).masked_fill(~mask, torch.finfo(dtype).min)
