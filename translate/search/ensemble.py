"""An ensemble of translators that beam search drives like one network (`translate.model.networks`).

Each step's next-token distribution is the mean of the members' probabilities, as fairseq's ensembles do. `encode`
concatenates the members' encoder outputs along the feature axis, so search can keep, index and drop the memory of a
sentence as it does for one model; `decode` splits it again."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from core.nn import DecoderCache
from translate.model.networks import TranslatorNetwork


class EnsembleCache:
    """One `DecoderCache` per member, reordered together."""

    def __init__(self, caches: Sequence[DecoderCache]):
        self.caches = list(caches)

    def reorder_self(self, index: Tensor) -> None:
        for cache in self.caches:
            cache.reorder_self(index)

    def reorder_cross(self, index: Tensor) -> None:
        for cache in self.caches:
            cache.reorder_cross(index)


class Ensemble(nn.Module):
    """Translators (sharing vocabulary sizes and padding id) searched as one model: the mean of their
    next-token probabilities."""

    def __init__(self, members: Sequence[TranslatorNetwork]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one translator")
        vocab = {m.output.out_features for m in members}
        if len(vocab) > 1 or len({m.pad_id for m in members}) > 1:
            raise ValueError(f"ensemble members must share a vocabulary; they have target sizes {sorted(vocab)}")
        self.members = nn.ModuleList(members)
        self.pad_id = members[0].pad_id
        self._widths = [m.tgt_embed.embedding.embedding_dim for m in members]

    @property
    def max_src_len(self) -> int:
        return min(m.max_src_len for m in self.members)

    @property
    def max_tgt_len(self) -> int:
        return min(m.max_tgt_len for m in self.members)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Every member's memory, concatenated along features (B, S, sum of widths), and the source mask."""
        outputs = [m.encode(src) for m in self.members]
        return torch.cat([memory for memory, _ in outputs], dim=-1), outputs[0][1]

    def new_cache(self, capacity: int = 16) -> EnsembleCache:
        return EnsembleCache([m.new_cache(capacity) for m in self.members])

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, cache: EnsembleCache | None = None) -> Tensor:
        """Log of the members' mean probabilities (B, T, V), float32; a log-softmax leaves them unchanged."""
        parts = memory.split(self._widths, dim=-1)
        caches = [None] * len(self.members) if cache is None else cache.caches
        log_probs = [m.decode(tgt, part, src_mask, c).float().log_softmax(-1)
                     for m, part, c in zip(self.members, parts, caches, strict=True)]
        if len(log_probs) == 1:
            return log_probs[0]
        return torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))
