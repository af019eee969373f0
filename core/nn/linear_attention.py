"""Causal linear attention (Katharopoulos et al. 2020): softmax replaced by a positive feature map. With
phi(x) = elu(x) + 1, position t reads

    out_t = phi(q_t) S_t / (phi(q_t) . z_t),   S_t = sum_{s<=t} phi(k_s) v_s^T,   z_t = sum_{s<=t} phi(k_s),

so decoding keeps the constant-size state (S, z) instead of a KV cache, and a whole sequence costs time
and memory linear in T. Training runs in chunks of C positions: inside a chunk the (C x C) form, across
chunks the running sums, so nothing of size T x T or T x Dh x Dh is ever held.

Legend: B batch, H query heads, Hkv key/value heads, T time, C chunk, N chunks, Dh head width."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK = 64  # positions per chunk: the (C x C) part stays small, the running sums are read T / C times


def feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1: positive, so every normaliser phi(q) . z is > 0."""
    return F.elu(x) + 1.0


def causal_linear_attention(q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None = None, chunk: int = CHUNK) -> Tensor:
    """(B, H, T, Dh) queries (before the feature map), (B, Hkv, T, Dh) keys and values -> (B, H, T, Dh). Padding
    (`valid` False) adds nothing to the sums; a query with no valid key up to it gets zeros."""
    b, h, t, dh = q.shape
    k, v = (x if x.shape[1] == h else x.repeat_interleave(h // x.shape[1], dim=1) for x in (k, v))
    dtype = torch.promote_types(q.dtype, torch.float32)  # sums in at least fp32 (bf16 inputs)
    fq, fk, v = feature_map(q.to(dtype)), feature_map(k.to(dtype)), v.to(dtype)
    if valid is not None:
        fk = fk * valid[:, None, :, None].to(dtype)
    n = -(-t // chunk)
    pad = n * chunk - t
    if pad:
        fq, fk, v = (F.pad(x, (0, 0, 0, pad)) for x in (fq, fk, v))
    fq, fk, v = (x.reshape(b, h, n, chunk, dh) for x in (fq, fk, v))
    kv = fk.transpose(-2, -1) @ v  # (B, H, N, Dh, Dh): each chunk's sum of phi(k) v^T
    states = torch.cumsum(kv, dim=2) - kv  # the sums of the chunks before each chunk
    z = torch.cumsum(fk.sum(3), dim=2) - fk.sum(3)  # (B, H, N, Dh)
    scores = (fq @ fk.transpose(-2, -1)).tril()  # (B, H, N, C, C): within a chunk, causal
    num = scores @ v + fq @ states  # (B, H, N, C, Dh)
    den = scores.sum(-1) + (fq * z[:, :, :, None, :]).sum(-1)  # (B, H, N, C)
    out = num / den.clamp_min(torch.finfo(dtype).tiny)[..., None]
    return out.reshape(b, h, n * chunk, dh)[:, :, :t].to(q.dtype)


@dataclass
class LinearAttentionState:
    """The running sums of one layer for incremental decoding: (B, H, Dh, Dh) and (B, H, Dh)."""

    sums: Tensor
    norms: Tensor

    @classmethod
    def empty(cls, b: int, h: int, dh: int, device: torch.device | str | None = None) -> LinearAttentionState:
        return cls(torch.zeros(b, h, dh, dh, device=device), torch.zeros(b, h, dh, device=device))


def linear_attention_step(q: Tensor, k: Tensor, v: Tensor, state: LinearAttentionState) -> Tensor:
    """One new position: (B, H, 1, Dh) query, (B, Hkv, 1, Dh) key and value -> (B, H, 1, Dh); updates `state`."""
    h = q.shape[1]
    k, v = (x if x.shape[1] == h else x.repeat_interleave(h // x.shape[1], dim=1) for x in (k, v))
    dtype = state.sums.dtype
    fq, fk = feature_map(q[:, :, 0].to(dtype)), feature_map(k[:, :, 0].to(dtype))
    state.sums = state.sums + fk[..., :, None] * v[:, :, 0].to(dtype)[..., None, :]
    state.norms = state.norms + fk
    num = (fq[..., None, :] @ state.sums)[..., 0, :]  # (B, H, Dh)
    den = (fq * state.norms).sum(-1, keepdim=True)
    return (num / den).to(q.dtype)[:, :, None]


@dataclass(frozen=True)
class LinearAttention:
    """Causal linear attention as a part `MultiHeadAttention` takes (`kernel`); it has no attention dropout."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, dropout_p: float) -> Tensor:
        return causal_linear_attention(q, k, v, valid)
