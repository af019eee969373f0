"""Attention as the recurrent translators introduced it: one query per step, a learned score per source position.

- Additive (Bahdanau et al. 2015): score(q, k) = v^T tanh(W_q q + W_k k).
- Multiplicative (Luong et al. 2015): "dot", score = q . k; "general", score = q^T W k.

Both return the context vector (the weighted sum of the values) and the weights, which are the word
alignments. The mask is core's (`core.nn.masks`: True = may attend), broadcastable to (B, T, S), e.g.
`padding_mask(src, pad)[:, 0]`. A query that may attend to nothing gets zero weights and a zero context, as
`core.nn.attention.attend` gives it. The keys' projection does not depend on the query, so `project_keys`
computes it once per source and a decoder passes it back at every step (`keys=`).

Shared memory rows, as in `core.nn.attention.CrossAttention`: each of Bm value rows serves G = B / Bm
consecutive query rows (a beam search's beams of one sentence), read once for the G rows instead of being
copied G times; the mask then has one row per value row. Inside `core.nn.explain.AttentionCapture` each call
appends its weights as (B, 1, T, S): one head.

Legend: B batch (query rows), Bm value rows, G = B / Bm, T query steps, S source length, Dq query width, Dk key width, A
attention width."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from core.nn.options import check_choice

Score = Literal["dot", "general"]


class _ScoredAttention(nn.Module):
    """What both scorings share: the softmax, shared memory rows and the capture of the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.capture: list[Tensor] | None = None  # set by `core.nn.explain.AttentionCapture`

    def project_keys(self, keys: Tensor) -> Tensor:
        raise NotImplementedError

    def _scores(self, query: Tensor, keys: Tensor) -> Tensor:  # (Bm, T', Dq), (Bm, S, .) -> (Bm, T', S)
        raise NotImplementedError

    def forward(self, query: Tensor, values: Tensor, mask: Tensor | None = None,
                keys: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(B, T, Dq) queries over (Bm, S, Dk) values -> (B, T, Dk) contexts and (B, T, S) weights. `mask` broadcasts to
        (Bm, G*T, S), with G > 1 as (Bm, 1, S); `keys`: `project_keys(values)` if known."""
        keys = self.project_keys(values) if keys is None else keys
        b, t, _ = query.shape
        bm = values.shape[0]
        if b % bm:
            raise ValueError(f"value rows ({bm}) must divide query rows ({b}): each value row serves "
                             "the same number of consecutive query rows")
        q = query.reshape(bm, (b // bm) * t, -1)  # (Bm, G*T, Dq): a value row's G query rows as one row
        scores = self._scores(q, keys)  # (Bm, G*T, S)
        if mask is None:
            weights = scores.softmax(-1)
        else:  # a row with nothing allowed gets zeros
            weights = scores.masked_fill(~mask, float("-inf")).softmax(-1).masked_fill(~mask.any(-1, keepdim=True), 0.0)
        context = (weights @ values).view(b, t, -1)  # (B, T, Dk)
        weights = weights.view(b, t, -1)  # (B, T, S)
        if self.capture is not None:
            self.capture.append(weights[:, None])  # (B, 1, T, S): one head
        return context, weights


class AdditiveAttention(_ScoredAttention):
    """Bahdanau attention; `attn_dim` is A, the width of the hidden layer the score is read from."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.query = nn.Linear(query_dim, attn_dim, bias=False)
        self.key = nn.Linear(key_dim, attn_dim)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        """(B, S, Dk) -> (B, S, A), W_k k + b."""
        return self.key(keys)

    def _scores(self, query: Tensor, keys: Tensor) -> Tensor:
        hidden = torch.tanh(self.query(query)[:, :, None, :] + keys[:, None, :, :])  # (Bm, T, S, A)
        return self.v(hidden)[..., 0]


class MultiplicativeAttention(_ScoredAttention):
    """Luong attention, `score` "dot" (q . k, needs Dq == Dk) or "general" (q^T W k)."""

    def __init__(self, query_dim: int, key_dim: int, score: Score = "general"):
        super().__init__()
        check_choice("score", score, ("dot", "general"))
        if score == "dot" and query_dim != key_dim:
            raise ValueError(f"'dot' scores need equal widths, got query {query_dim} and key {key_dim}")
        self.score = score
        self.weight = nn.Linear(key_dim, query_dim, bias=False) if score == "general" else None

    def project_keys(self, keys: Tensor) -> Tensor:
        """(B, S, Dk) -> (B, S, Dq): W k for "general", k itself for "dot"."""
        return keys if self.weight is None else self.weight(keys)

    def _scores(self, query: Tensor, keys: Tensor) -> Tensor:
        return query @ keys.transpose(1, 2)  # (Bm, T, S)
