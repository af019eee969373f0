""""Because you watched X": which history items drove each recommendation. Two views, reported side by side because
attention is not proof:

- attention: self-attention captured from the recommending (last) position, averaged over heads and rolled out through
  the layers with the residual path (Abnar & Zuidema, 2020). One distribution over the history per user, the same for
  all of the user's recommendations.
- occlusion: how much a recommended item's score drops when one history item is removed (the rest shifted and
  re-padded, as a shorter history would be). Specific to each item.

Legend: B users, T history length, K recommendations per user, N items."""

from __future__ import annotations

import torch
from torch import Tensor

from core.nn import AttentionCapture, attention_rollout
from core.runtime.errors import InputError
from streamrec.model.network import PAD_ID, StreamRecModel

EXPLAIN_COLUMNS = ("because_attention", "attention_weight", "because_occlusion", "occlusion_drop")  # explain_columns'


@torch.no_grad()
def attention_weights(model: StreamRecModel, inputs: Tensor) -> Tensor:
    """Rolled-out attention of the last position over (B, T) left-padded histories: (B, T) weights, 0 at padding,
    summing to 1 over the real positions."""
    if not model.has_attention:
        raise InputError(f"a {model.arch} model has no attention to explain with; score it without --explain, and "
                         "for its occlusion view call `streamrec.ranking.explain.occlusion_drops` (sasrec and bert4rec "
                         "models explain both ways)")
    with AttentionCapture(model.encoder) as cap:
        model.encode(model.scoring_inputs(inputs))
    rollout = model.history_positions(attention_rollout(cap.layers("self_attn"))[:, -1])  # (B, T)
    rollout = rollout.masked_fill(inputs == PAD_ID, 0.0)
    return rollout / rollout.sum(-1, keepdim=True).clamp_min(1e-12)


def _without_each_position(inputs: Tensor) -> Tensor:
    """(B, T) -> (T, B, T): variant t drops position t and left-pads the rest."""
    b, t = inputs.shape
    pad = inputs.new_zeros(b, 1)
    return torch.stack([torch.cat([pad, inputs[:, :i], inputs[:, i + 1 :]], dim=1) for i in range(t)])


@torch.no_grad()
def occlusion_drops(model: StreamRecModel, inputs: Tensor, items: Tensor) -> Tensor:
    """(B, K, T) score drop of each of the (B, K) recommended items when each history position is removed (base
    score - score without position t); 0 at padding positions."""
    b, t = inputs.shape
    base = model.score(model.last_hidden(inputs)).gather(1, items)  # (B, K)
    variants = _without_each_position(inputs).view(t * b, t)  # (T*B, T)
    hidden = model.last_hidden(variants).view(t, b, -1)  # (T, B, D)
    occluded = torch.einsum("tbd,bkd->bkt", hidden, model.item_vectors[items].to(hidden.dtype))  # (B, K, T)
    return (base[:, :, None] - occluded).masked_fill((inputs == PAD_ID)[:, None, :], 0.0)


def explain_columns(model: StreamRecModel, inputs: Tensor, items: Tensor,
                    max_sequences: int = 4096) -> dict[str, Tensor]:
    """Per recommendation: the top-attended history item and the top-occlusion item, with weights. The "because you
    watched" columns of `python -m streamrec.score --explain`. Runs in sub-batches so that B x T occlusion variants stay
    under `max_sequences`. `items` (B, K) may hold 0 for an empty slot; returns (B, K) tensors (`EXPLAIN_COLUMNS`)."""
    parts: list[dict[str, Tensor]] = []
    step = max(1, max_sequences // inputs.shape[1])
    for start in range(0, inputs.shape[0], step):
        x, rec = inputs[start : start + step], items[start : start + step]
        att = attention_weights(model, x)  # (b, T)
        drops = occlusion_drops(model, x, rec.clamp_min(1))  # (b, K, T)
        drops = drops.masked_fill((x == PAD_ID)[:, None, :], float("-inf"))
        att_w, att_pos = att.max(-1)
        occ_drop, occ_pos = drops.max(-1)
        k = rec.shape[1]
        parts.append({
            "because_attention": x.gather(1, att_pos[:, None]).expand(-1, k),
            "attention_weight": att_w[:, None].expand(-1, k),
            "because_occlusion": x.gather(1, occ_pos),
            "occlusion_drop": occ_drop,
        })
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}


def agreement(attention: Tensor, drops: Tensor, inputs: Tensor) -> float:
    """Fraction of (user, recommendation) pairs whose top-attended history position is also
    the position whose removal lowers that recommendation's score most (padding positions never count)."""
    top_occ = drops.masked_fill((inputs == PAD_ID)[:, None, :], float("-inf")).argmax(-1)  # (B, K)
    top_att = attention.argmax(-1)[:, None]  # (B, 1)
    return float((top_occ == top_att).float().mean())
