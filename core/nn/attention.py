"""Multi-head attention on `scaled_dot_product_attention`. The fast path never materialises the (Tq, Tk) weight matrix:
SDPA picks a flash or fused kernel (on CPU too). Explanations need the weights, so a module whose `capture` attribute
holds a list (`core.nn.explain.AttentionCapture`) recomputes them and appends them there, with the same output.

Grouped-query attention: `n_kv_heads` key/value heads are shared by `n_heads / n_kv_heads` query heads each.

Legend: B batch, T time, Tq queries, Tk keys, S source length, D model width, H query heads, Hkv key/value heads, Dh
head width (D / H)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.nn.cpu_fastpath import sdpa_math_with_cheap_dropout
from core.nn.kv_cache import KVCache, StaticKV
from core.nn.masks import causal_mask, combine_masks
from core.nn.positions import RotaryEmbedding, apply_rope

# Longest key sequence for which bf16 training on CPU runs SDPA in fp32 (inputs cast up, output back): up to
# here the CPU flash kernel's bf16 backward is the slower one (`benchmarks/sdpa_cpu_backend.py`). fp32, inference,
# attention-weight dropout, fp16 and GPUs keep SDPA's own choice.
FP32_MAX_KEYS = 512


def _fp32_on_cpu(q: Tensor, k: Tensor, dropout_p: float) -> bool:
    """Whether this call is bf16 training on the CPU at a length where the fp32 kernel is the faster."""
    return (q.device.type == "cpu" and q.dtype == torch.bfloat16 and k.shape[-2] <= FP32_MAX_KEYS
            and dropout_p == 0.0 and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, is_causal: bool = False,
           bias: Tensor | None = None, dropout_p: float = 0.0, capture: list[Tensor] | None = None,
           cheap_dropout: bool = False) -> Tensor:
    """(B, H, Tq, Dh) queries over (B, Hkv, Tk, Dh) keys and values (Hkv divides H) -> (B, H, Tq, Dh). `mask`
    (boolean, True = may attend) and `bias` (additive float, e.g. ALiBi) broadcast to (B, H, Tq, Tk); `is_causal`: the
    queries are the last Tq of the Tk positions. `capture`, a list: the weights are computed explicitly and appended to
    it. `cheap_dropout`: on the CPU, the dropout mask of `core.nn.cpu_fastpath`."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    if is_causal and t_q == 1:
        is_causal = False  # the single newest query may see every key
    if is_causal and (mask is not None or bias is not None or t_q != t_k or capture is not None):
        # SDPA cannot combine is_causal with attn_mask, and aligns it top-left.
        mask = combine_masks(mask, causal_mask(t_q, t_k, device=q.device))
        is_causal = False
    attn_mask: Tensor | None = mask
    if bias is not None:
        bias = bias.to(q.dtype)
        # finfo.min rather than -inf: a fully masked row must not turn into NaN.
        attn_mask = bias if mask is None else bias.masked_fill(~mask, torch.finfo(q.dtype).min)
    if capture is not None:
        return _attend_explicit(q, k, v, attn_mask, mask, dropout_p, capture)
    enable_gqa = k.shape[1] != q.shape[1]
    if cheap_dropout and dropout_p > 0 and q.device.type == "cpu":
        out = sdpa_math_with_cheap_dropout(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
    elif _fp32_on_cpu(q, k, dropout_p):
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.float()
        with torch.autocast("cpu", enabled=False):  # autocast would cast the fp32 inputs straight back to bf16
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask,
                                                 is_causal=is_causal, enable_gqa=enable_gqa).to(q.dtype)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                             enable_gqa=enable_gqa)
    if bias is not None and mask is not None:
        # With finite fill values a query that sees no key would average every value;
        # give it 0, as SDPA does for a boolean mask and as capture mode does.
        out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return out


def _attend_explicit(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, mask: Tensor | None,
                     dropout_p: float, capture: list[Tensor]) -> Tensor:
    """softmax(QK^T / sqrt(Dh) + bias) V with the weights kept; capture mode only."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, Tk, Dh)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    # Softmax in at least fp32 (bf16 inputs), without lowering fp64.
    weights = scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    if mask is not None:
        # A query with no visible key gets zero weights (SDPA outputs 0 for it too).
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    capture.append(weights.detach())
    if dropout_p > 0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


class _HeadsMixin(nn.Module):
    cheap_dropout = False  # `core.nn.cpu_fastpath.enable_cpu_fastpath` sets it on the instances it speeds up

    def _init_heads(self, d_model: int, n_heads: int, n_kv_heads: int | None, dropout: float) -> None:
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads <= 0 or d_model % n_heads:
            raise ValueError(f"`n_heads` ({n_heads}) must divide `d_model` ({d_model})")
        if n_kv_heads <= 0 or n_heads % n_kv_heads:
            raise ValueError(f"`n_kv_heads` ({n_kv_heads}) must divide `n_heads` ({n_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.kv_dim = n_kv_heads * self.head_dim
        self.dropout = dropout
        # A list here switches on capture mode (see core.nn.explain.AttentionCapture).
        self.capture: list[Tensor] | None = None

    def _split(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, -1).transpose(1, 2)  # (B, heads, T, Dh), or a side stream's head width

    def _merge(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, D)

    def _dropout_p(self) -> float:
        return self.dropout if self.training else 0.0


class SequenceKernel(Protocol):
    """Causal self-attention over whole sequences that never holds a (T, T) matrix, in place of the softmax over
    every allowed key: `core.nn.windowed.WindowAttention`, `core.nn.linear_attention.LinearAttention`."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, dropout_p: float) -> Tensor:
        """(B, H, T, Dh) queries, (B, Hkv, T, Dh) keys and values, (B, T) True at tokens -> (B, H, T, Dh)."""


@dataclass(frozen=True)
class SideStream:
    """A second input that steers self-attention without being read by it: each layer projects it to its own queries
    and keys, q_s k_s^T is added to q k^T before the softmax, and the values come from the main input alone. Decoupled
    side information (DIF-SR, Xie et al. 2022): attributes decide where a position looks, and are not mixed into the
    states themselves, where they would crowd the ids out. The sum is scaled by the main heads' 1 / sqrt(Dh), as DIF-SR.

    Args:
        width: the stream's width; the query heads split it as they split the model width."""

    width: int

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"`width` of the side stream must be >= 1, got {self.width}")


class MultiHeadAttention(_HeadsMixin):
    """Self-attention with one fused QKV projection.

    Args:
        d_model: model width D.
        n_heads: query heads H; must divide D.
        n_kv_heads: key/value heads (grouped-query attention); must divide H. Default H.
        dropout: dropout on attention weights during training.
        bias: whether projections have a bias.
        kernel: None (default): the softmax over every allowed key (SDPA). For long causal sequences, with time
            and memory linear in T, a `SequenceKernel` (`WindowAttention`, `LinearAttention`): causal only, it
            takes the padding as `valid` (B, T) instead of a mask, and has no KV cache, positional bias or capture.
        side: a `SideStream` whose logits join the softmax's (`forward`'s `side`); not with a `kernel`."""

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None, dropout: float = 0.0,
                 bias: bool = True, kernel: SequenceKernel | None = None, side: SideStream | None = None):
        super().__init__()
        self._init_heads(d_model, n_heads, n_kv_heads, dropout)
        if side is not None and (side.width % n_heads or kernel is not None):
            raise ValueError(f"a side stream needs `n_heads` ({n_heads}) to divide its width ({side.width}) and the "
                             "softmax over all keys (no `kernel`)")
        self.kernel = kernel
        self.qkv = nn.Linear(d_model, d_model + 2 * self.kv_dim, bias=bias)  # rows: [q; k; v]
        side_dh = 0 if side is None else side.width // n_heads
        self.side_qk = None if side is None else nn.Linear(side.width, side_dh * (n_heads + self.n_kv_heads),
                                                              bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, is_causal: bool = False,
                rope: RotaryEmbedding | None = None, bias: Tensor | None = None, cache: KVCache | None = None,
                last: int | None = None, valid: Tensor | None = None, side: Tensor | None = None) -> Tensor:
        """(B, T, D) -> (B, T, D), or (B, last, D); with a cache, x holds the new steps only. `mask` and `bias` as in
        `attend`; `rope` is applied from the cache length on. `last`: only the last `last` positions query (all are
        keys), so a model that needs one output per sequence skips the rest. `valid` (B, T), True at tokens: the padding
        a `kernel` reads (it reads no `mask`). `side` (B, T, width): the `SideStream` at x's positions."""
        q, k, v = self.qkv(x).split([self.d_model, self.kv_dim, self.kv_dim], dim=-1)
        q, k, v = self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)
        if rope is not None:
            q, k = apply_rope(q, k, rope, offset=0 if cache is None else cache.length)
        if (side is None) != (self.side_qk is None):
            raise ValueError("pass `side` exactly when the attention was built with a `SideStream`")
        if side is not None:
            q, k = self._with_side(q, k, side)
        if self.kernel is not None:
            if not is_causal or mask is not None or bias is not None or cache is not None or self.capture is not None:
                raise ValueError(f"attention {type(self.kernel).__name__} is causal self-attention over whole "
                                 "sequences: padding as `valid`, no mask, bias, KV cache or capture")
            out = self.kernel(q, k, v, valid, self._dropout_p())
            out = out if last is None else out[:, :, -last:]
            return self.out(self._merge(out))
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hkv, Tk, Dh)
        if last is not None and last < q.shape[2]:
            q = q[:, :, -last:]
            mask = mask if mask is None or mask.shape[-2] == 1 else mask[..., -last:, :]
            bias = bias if bias is None or bias.shape[-2] == 1 else bias[..., -last:, :]
        out = attend(q, k, v, mask, is_causal=is_causal, bias=bias, dropout_p=self._dropout_p(), capture=self.capture,
                     cheap_dropout=self.cheap_dropout)
        return self.out(self._merge(out))

    def _with_side(self, q: Tensor, k: Tensor, side: Tensor) -> tuple[Tensor, Tensor]:
        """[q, q_s] and [k, k_s] along the head width, so that one SDPA call takes q k^T + q_s k_s^T (SDPA allows
        values narrower than keys). SDPA divides by the root of the wider head: q is scaled up to undo that, leaving
        the sum over sqrt(Dh), the main heads' (a KV cache then holds the wide keys)."""
        assert self.side_qk is not None
        side_dh = self.side_qk.in_features // self.n_heads
        q_s, k_s = self.side_qk(side).split([self.n_heads * side_dh, self.n_kv_heads * side_dh], dim=-1)
        q = torch.cat([q, self._split(q_s, self.n_heads)], dim=-1) * math.sqrt(1 + side_dh / self.head_dim)
        return q, torch.cat([k, self._split(k_s, self.n_kv_heads)], dim=-1)


class CrossAttention(_HeadsMixin):
    """Attention from decoder states to an encoder output (memory). Shared memory rows: each of Bm memory rows (Bm
    dividing B) may serve G = B / Bm consecutive query rows, e.g. several decodings of one input: as if every memory row
    were repeated G times, but its keys and values are projected, cached and read once.

    Args:
        d_model: model width D (of both queries and memory).
        n_heads: query heads H; must divide D.
        n_kv_heads: key/value heads; must divide H. Default H.
        dropout: dropout on attention weights during training.
        bias: whether projections have a bias."""

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None, dropout: float = 0.0,
                 bias: bool = True):
        super().__init__()
        self._init_heads(d_model, n_heads, n_kv_heads, dropout)
        self.q = nn.Linear(d_model, d_model, bias=bias)
        self.kv = nn.Linear(d_model, 2 * self.kv_dim, bias=bias)  # rows: [k; v]
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None = None, *,
                cache: StaticKV | None = None) -> Tensor:
        """(B, T, D) queries over (Bm, S, D) memory (shared rows, see the class) -> (B, T, D). `mask` broadcasts to
        (Bm, H, T, S); with shared rows one row per memory row, (Bm, 1, 1, S). `cache` keeps the memory's keys and
        values from the first call on (the memory is then ignored)."""
        q = self._split(self.q(x), self.n_heads)  # (B, H, T, Dh)
        if cache is not None and cache.is_set:
            k, v = cache.k, cache.v
        else:
            k, v = self.kv(memory).split([self.kv_dim, self.kv_dim], dim=-1)
            k, v = self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)  # (Bm, Hkv, S, Dh)
            if cache is not None:
                cache.set(k, v)
        assert k is not None and v is not None
        b, h, t, dh = q.shape
        bm = k.shape[0]
        if b % bm:
            raise ValueError(f"memory rows ({bm}) must divide query rows ({b}): each memory row serves "
                             "the same number of consecutive query rows")
        g = b // bm  # query rows per memory row
        # The G query rows of a memory row attend as one row of G*T queries.
        q = q.view(bm, g, h, t, dh).transpose(1, 2).reshape(bm, h, g * t, dh)  # (Bm, H, G*T, Dh)
        if t == 1 and g > 1:
            # One incremental step: the G queries as G heads per key/value head (SDPA's GQA), one query each: SDPA runs
            # that faster than G queries of one head at a beam search's shape (benchmarks/translate_speed.py).
            q = q.reshape(bm, h * g, 1, dh)  # (Bm, H*G, 1, Dh)
        out = attend(q, k, v, mask, dropout_p=self._dropout_p(), capture=self.capture, cheap_dropout=self.cheap_dropout)
        out = out.view(bm, h, g, t, dh).transpose(1, 2).reshape(b, h, t, dh)  # (B, H, T, Dh)
        if self.capture is not None and g > 1:  # report weights per query row, as without shared rows
            self.capture[-1] = self.capture[-1].view(bm, h, g, t, -1).transpose(1, 2).reshape(b, h, t, -1)
        return self.out(self._merge(out))
