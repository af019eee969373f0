"""One optimizer for a model with large embedding tables: AdamW on the dense parameters, row-wise AdaGrad on the tables
(TorchRec / FBGEMM's `EXACT_ROWWISE_ADAGRAD`). AdamW keeps two states of the table's size and needs a dense gradient: a
table of V rows costs 4 tables in training. Row-wise AdaGrad keeps one number per row and updates only the rows a step's
sparse gradient names, so a table costs itself, V accumulators and the touched rows:

    s_r += mean(g_r ** 2)                        one fp32 accumulator per row
    w_r -= lr * g_r / (sqrt(s_r) + eps)          only for rows r the step touched

Both kinds live in one `torch.optim.Optimizer` (a param group with `rowwise: True` holds tables), so one
learning-rate scheduler scales both and one `state_dict` resumes both.

Legend: V table rows, D row width, R rows touched in a step."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.adam import adam


class RowwiseAdagradAdamW(Optimizer):
    """AdamW on ordinary param groups, row-wise AdaGrad on param groups marked `rowwise: True`. The AdamW groups take
    the same steps as `torch.optim.AdamW` with these settings (its functional kernel and state layout: `step`,
    `exp_avg`, `exp_avg_sq`). A rowwise group holds (V, D) tables with sparse gradients (`F.embedding(sparse=True)`);
    duplicate rows in a gradient are summed before the update. A dense gradient counts every row as touched. Weight
    decay on a table is decoupled, as in AdamW, and applied to the touched rows only (untouched rows are not read at
    all). A group may set its own `lr`, `eps` and `weight_decay`; a rowwise group ignores `betas`."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"`lr` ({lr}), `eps` ({eps}) and `weight_decay` ({weight_decay}) must be >= 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"`betas` must lie in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, rowwise=False))
        for group in self.param_groups:
            bad = [tuple(p.shape) for p in group["params"] if group["rowwise"] and p.dim() != 2]
            if bad:
                raise ValueError(f"a `rowwise` param group holds (rows, width) tables, got shapes {bad}")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every group; `closure` (as Lightning passes it) recomputes the loss and gradients."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            (self._rowwise_adagrad if group["rowwise"] else self._adamw)(group)
        return loss

    def _adamw(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            if p.grad.is_sparse:
                raise RuntimeError(f"a parameter of shape {tuple(p.shape)} has a sparse gradient but sits in an "
                                   "AdamW group; put it in a group with `rowwise: True`")
            state = self.state[p]
            if not state:  # as torch.optim.AdamW lays it out, so its checkpoints read alike
                scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                state["step"] = torch.tensor(0.0, dtype=scalar)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if params:
            states = [self.state[p] for p in params]
            beta1, beta2 = group["betas"]
            adam(params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                 [], [s["step"] for s in states], decoupled_weight_decay=True, amsgrad=False, beta1=beta1,
                 beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

    def _rowwise_adagrad(self, group: dict[str, Any]) -> None:
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["sum"] = p.new_zeros(p.shape[0], dtype=torch.float32)  # (V,) one accumulator per row
            if p.grad.is_sparse:  # one entry per lookup: coalesce sums a row's, so the accumulator sees it once
                grad = p.grad.coalesce()
                rows, values = grad.indices()[0], grad.values()  # (R,), (R, D)
            else:
                rows, values = torch.arange(p.shape[0], device=p.device), p.grad
            total = state["sum"]
            total.index_add_(0, rows, values.float().square().mean(1))
            std = total[rows].sqrt_().add_(eps)  # (R,)
            if decay:
                p.index_add_(0, rows, p[rows], alpha=-lr * decay)
            p.index_add_(0, rows, (values / std[:, None]).to(p.dtype), alpha=-lr)
