"""Attention capture and the tools that read it: entropy and rollout. Weights are computed only inside
`AttentionCapture`: the fast path never builds them. Attention is not proof of what drove a prediction; apps report an
occlusion check beside it.

Legend: B batch, H heads, Tq queries, Tk keys, L layers."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.nn.attention import CrossAttention, MultiHeadAttention
from core.nn.scored_attention import AdditiveAttention, MultiplicativeAttention

# The attention modules that record their weights: the transformer's, and the recurrent decoders' (one head).
CAPTURED = (MultiHeadAttention, CrossAttention, AdditiveAttention, MultiplicativeAttention)


def _captured(model: nn.Module) -> dict[str, nn.Module]:  # by qualified name; its last part is the kind
    return {name: m for name, m in model.named_modules() if isinstance(m, CAPTURED)}


def attention_layers(model: nn.Module, kind: str = "self_attn") -> int:
    """How many attention modules named `kind` `AttentionCapture(model).layers(kind)` returns: a Transformer
    decoder has one cross-attention a layer, an attentional recurrent decoder one in all."""
    return sum(name.split(".")[-1] == kind for name in _captured(model))


class AttentionCapture:
    """Context manager that records attention weights of every attention module in a model. Inside the block each
    `MultiHeadAttention` / `CrossAttention` computes its weights explicitly (same output as the fast path) and appends
    them, one (B, H, Tq, Tk) tensor per call, under its module name; `AdditiveAttention` / `MultiplicativeAttention`
    append theirs with H = 1.

    Example:
        with AttentionCapture(model) as cap:
            model(x)
        self_attn = cap.layers("self_attn")  # list over layers of (B, H, T, T)

    Args:
        model: any module containing core attention modules."""

    def __init__(self, model: nn.Module):
        self.modules = _captured(model)
        if not self.modules:
            raise ValueError(f"{type(model).__name__} contains no core attention module to capture")
        self.weights: dict[str, list[Tensor]] = {}

    def __enter__(self) -> AttentionCapture:
        self.weights = {name: [] for name in self.modules}
        for name, m in self.modules.items():
            m.capture = self.weights[name]
        return self

    def __exit__(self, *exc: object) -> None:
        for m in self.modules.values():
            m.capture = None

    def layers(self, kind: str = "self_attn") -> list[Tensor]:
        """(B, H, Tq, Tk) weights of each module whose name ends with `kind`, in layer order. Several calls to one
        module (incremental decoding) are concatenated on the query axis, shorter key axes right-padded with zeros."""
        out = []
        for name, calls in self.weights.items():
            if name.split(".")[-1] == kind and calls:
                t_k = max(w.shape[-1] for w in calls)
                out.append(calls[0] if len(calls) == 1
                           else torch.cat([F.pad(w, (0, t_k - w.shape[-1])) for w in calls], dim=-2))
        if not out:
            raise ValueError(f"no captured weights for modules named {kind!r}; have {sorted(self.weights)}")
        return out


def attention_entropy(weights: Tensor) -> Tensor:
    """(..., Tq, Tk) rows that sum to 1 -> (..., Tq) Shannon entropies (nats); 0 log 0 counts as 0."""
    logs = torch.where(weights > 0, weights.log(), torch.zeros_like(weights))
    return -(weights * logs).sum(dim=-1)


def attention_rollout(layers: Sequence[Tensor], residual: bool = True) -> Tensor:
    """Attention rollout (Abnar & Zuidema, 2020) of (B, H, T, T) weights per layer, first layer first -> (B, T, T): how
    much each output position draws on each input position. Heads are averaged; with `residual`, each layer becomes 0.5
    A + 0.5 I (the skip connection) and rows are renormalised; the layers are multiplied from the last down."""
    if not layers:
        raise ValueError("attention_rollout needs at least one layer of weights")
    rollout: Tensor | None = None
    for w in layers:
        a = w.float().mean(dim=1)  # (B, T, T)
        if residual:
            a = 0.5 * a + 0.5 * torch.eye(a.shape[-1], device=a.device)
            a = a / a.sum(dim=-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout
    assert rollout is not None
    return rollout
