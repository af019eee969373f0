"""Key/value caches for incremental decoding. Self-attention appends one step's keys and values per call;
cross-attention stores the encoder's once per input. A search that keeps, drops or duplicates hypotheses reorders every
cache's batch rows with `reorder` (or one side of them: `reorder_self`, `reorder_cross`).

Legend: B batch rows (e.g. inputs x hypotheses), Hkv key/value heads, T cached steps, Dh head width."""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Growing key/value store for one self-attention layer. Storage is preallocated and doubled when full, so appending
    a step copies only that step.

    Args:
        capacity: steps to allocate at first (a search that knows its length limit passes it)."""

    def __init__(self, capacity: int = 16) -> None:
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self.length = 0
        self.capacity = capacity

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, Hkv, Tnew, Dh) keys (position-encoded) and values; returns all so far, (B, Hkv, T, Dh)."""
        end = self.length + k.shape[2]
        if self._k is None or end > self._k.shape[2]:
            self._grow(k, v, end)
        assert self._k is not None and self._v is not None
        self._k[:, :, self.length : end] = k
        self._v[:, :, self.length : end] = v
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    def _grow(self, k: Tensor, v: Tensor, needed: int) -> None:
        capacity = max(needed, 2 * (0 if self._k is None else self._k.shape[2]), self.capacity)
        new_k, new_v = (x.new_empty(*x.shape[:2], capacity, x.shape[-1]) for x in (k, v))
        if self._k is not None and self._v is not None:
            new_k[:, :, : self.length] = self._k[:, :, : self.length]
            new_v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = new_k, new_v

    def reorder(self, index: Tensor, moved: Tensor | None = None) -> None:
        """Keep batch rows `index` (B_new,), in that order; `moved` (the rows where index[row] != row, given when
        B_new = B) copies only those rows, in place."""
        if self._k is None or self._v is None:
            return
        if moved is not None:
            if moved.numel():
                src = index[moved]
                for buf in (self._k, self._v):
                    filled = buf[:, :, : self.length]
                    filled.index_copy_(0, moved, filled.index_select(0, src))  # reads all sources first
            return
        self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)


class StaticKV:
    """Keys and values of the encoder output for one cross-attention layer, computed once."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def is_set(self) -> bool:
        return self.k is not None

    def set(self, k: Tensor, v: Tensor) -> None:
        self.k, self.v = k, v

    def reorder(self, index: Tensor) -> None:
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class DecoderCache:
    """All per-layer caches of a decoder stack.

    Args:
        n_layers: number of layers in the stack.
        cross: whether layers also cross-attend (encoder-decoder) or only self-attend.
        capacity: steps each self-attention cache allocates at first."""

    def __init__(self, n_layers: int, *, cross: bool = True, capacity: int = 16) -> None:
        self.self_attn = [KVCache(capacity) for _ in range(n_layers)]
        self.cross_attn = [StaticKV() for _ in range(n_layers)] if cross else None

    @property
    def offset(self) -> int:  # positions already decoded: the absolute position of the next token
        return self.self_attn[0].length

    def reorder(self, index: Tensor) -> None:
        self.reorder_self(index)
        self.reorder_cross(index)

    def reorder_self(self, index: Tensor) -> None:
        """The self-attention rows only (hypotheses swapping within an input); when the batch keeps its size and
        fewer than half the rows change, only those are copied."""
        moved = None
        rows = self.self_attn[0]._k.shape[0] if self.self_attn and self.self_attn[0]._k is not None else -1
        if index.shape[0] == rows:
            changed = (index != torch.arange(rows, device=index.device)).nonzero()[:, 0]
            moved = changed if 2 * changed.numel() < rows else None
        for c in self.self_attn:
            c.reorder(index, moved)

    def reorder_cross(self, index: Tensor) -> None:
        """The cross-attention rows only: an input's keys/values change only when inputs leave the batch."""
        for c in self.cross_attn or []:
            c.reorder(index)
