"""Cross-entropy over a large output vocabulary without materialising the logits. Both apps end in `hidden @ weight.T`
followed by a softmax over every item or subword: (M, V) logits, their log-softmax and its gradient are three M x V
float buffers, written and read once and freshly page-faulted every step. `linear_cross_entropy` computes the loss and
both gradients chunk by chunk in the forward pass instead (`benchmarks/streamrec_loss.py`: against `F.cross_entropy`);
`rdrop_cross_entropy` (R-Drop, Liang et al., 2021) likewise. `contrastive_loss` is CL4SRec's and DuoRec's InfoNCE.

Legend: M rows (positions), D width, V classes."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.functional import linear

# Logits held at once: 1M floats (4 MiB). Half as many is slower at Translate's shape, twice as many slower at
# StreamRec's (`benchmarks/streamrec_loss.py --baseline-chunk-elements N` compares them).
CHUNK_ELEMENTS = 1 << 20


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, label_smoothing: float = 0.0,
                         chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Mean cross-entropy of softmax(hidden @ weight.T) against `targets`, in row chunks. Equal in value and gradients
    to `F.cross_entropy(hidden @ weight.T, targets, label_smoothing=...)`, for (M, D) `hidden` (bf16 is fine: softmax
    and sums run in fp32), (V, D) `weight` and (M,) `targets` (padding rows selected out beforehand). `chunk_elements`:
    logits held at once (rows per chunk: this // V, >= 16)."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"`label_smoothing` must be in [0, 1), got {label_smoothing}")
    rows = max(16, chunk_elements // max(weight.shape[0], 1))
    return _ChunkedCrossEntropy.apply(hidden, weight, targets, label_smoothing, rows)


def rdrop_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, label_smoothing: float = 0.0,
                        alpha: float = 5.0, chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """R-Drop loss of two dropout passes, (2, M, D) `hidden`, over the same rows, in chunks as `linear_cross_entropy`.
    Per row, the paper's eq. 3 halved, so the cross-entropy stays a mean over both passes and the paper's alpha values
    carry over (5 for IWSLT): (CE(p1) + CE(p2)) / 2 with label smoothing as `linear_cross_entropy`,
    plus alpha / 4 * (KL(p1 || p2) + KL(p2 || p1)); averaged over rows."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"`label_smoothing` must be in [0, 1), got {label_smoothing}")
    if hidden.dim() != 3 or hidden.shape[0] != 2:
        raise ValueError(f"`hidden` must be (2, M, D): two passes over the same rows, got {tuple(hidden.shape)}")
    rows = max(16, chunk_elements // max(weight.shape[0], 1))
    return _ChunkedRDrop.apply(hidden, weight, targets, label_smoothing, alpha, rows)


class _StoredGradients(torch.autograd.Function):
    """A mean loss whose forward stores the gradients of its sum (hidden, weight): backward only scales them."""

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_out / max(ctx.count, 1)
        dh = None if grad_h is None else grad_h * scale.to(grad_h.dtype)
        dw = None if grad_w is None else (grad_w * scale).to(ctx.weight_dtype)
        return (dh, dw) + (None,) * (len(ctx.needs_input_grad) - 2)


class _ChunkedRDrop(_StoredGradients):
    """`rdrop_cross_entropy` with its gradients computed chunk by chunk during the forward pass. Spares autograd's
    materialised (2, M, V) logits (`benchmarks/translate_rdrop_loss.py`). Per chunk, with l = log p and d = l1 - l2:
    loss = (ce1 + ce2) / 2 + alpha / 4 * sum(p1 - p2) d, dz1 = (p1 - (1 - eps) onehot - eps / V) / 2 + alpha / 4 * (p1
    (d - KL(p1 || p2)) + p1 - p2), and dz2 the same with 1 and 2 swapped."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, eps: float, alpha: float, rows: int) -> Tensor:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        acc = torch.promote_types(hidden.dtype, torch.float32)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=acc) if need_w else None
        w = weight.to(hidden.dtype)
        n_classes = weight.shape[0]
        total = hidden.new_zeros((), dtype=acc)
        for start in range(0, hidden.shape[1], rows):
            h, t = hidden[:, start : start + rows], targets[start : start + rows]
            logp = linear(h, w).log_softmax(dim=-1, dtype=acc)  # (2, m, V); linear(h, w) = h @ w.T
            nll = -logp.gather(-1, t.expand(2, -1).unsqueeze(-1)).sum()
            smooth = -logp.mean(dim=-1).sum()
            p = logp.exp()
            diff = logp[0] - logp[1]  # (m, V)
            kl12 = (p[0] * diff).sum(dim=-1, keepdim=True)  # KL(p1 || p2), (m, 1)
            kl21 = -(p[1] * diff).sum(dim=-1, keepdim=True)
            total += 0.5 * ((1.0 - eps) * nll + eps * smooth) + alpha / 4.0 * (kl12 + kl21).sum()
            if need_h or need_w:
                k = alpha / 4.0
                cross = p[0] - p[1]
                g = torch.empty_like(p)
                g[0] = 0.5 * p[0] + k * (p[0] * (diff - kl12) + cross)
                g[1] = 0.5 * p[1] + k * (p[1] * (-diff - kl21) - cross)
                g[:, torch.arange(len(t), device=t.device), t] -= 0.5 * (1.0 - eps)
                if eps:
                    g -= 0.5 * eps / n_classes
                g = g.to(h.dtype)
                if need_h:
                    grad_h[:, start : start + rows] = linear(g, w.T)  # g @ w
                if need_w:
                    grad_w += g[0].T @ h[0] + g[1].T @ h[1]
        ctx.save_for_backward(grad_h, grad_w)
        ctx.count, ctx.weight_dtype = hidden.shape[1], weight.dtype
        return total / max(hidden.shape[1], 1)


def contrastive_loss(first: Tensor, second: Tensor, temperature: float = 1.0, groups: Tensor | None = None) -> Tensor:
    """Mean NT-Xent (SimCLR's InfoNCE over 2B views) of two (B, D) views of B rows. Each of the 2B views is classified
    among the other 2B - 1 by dot product / `temperature` (CL4SRec and DuoRec use 1); its twin (the other view of its
    row) is the answer. Rows of the same (B,) `groups` value (DuoRec: the same next item) are left out of each other's
    candidates, as false negatives."""
    if temperature <= 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature}")
    if first.shape != second.shape or first.dim() != 2:
        raise ValueError(f"two (B, D) views needed, got {tuple(first.shape)} and {tuple(second.shape)}")
    rows = first.shape[0]
    views = torch.cat([first, second])
    views = views.to(torch.promote_types(views.dtype, torch.float32))  # (2B, D); bf16 views compare in fp32
    with torch.autocast(views.device.type, enabled=False):  # autocast would run the product in bf16 again
        sim = views @ views.T / temperature  # (2B, 2B)
    index = torch.arange(2 * rows, device=views.device)
    twin = (index + rows) % (2 * rows)
    row = index % rows
    excluded = index[:, None] == index[None, :]  # a view is not its own candidate
    if groups is not None:
        label = groups[row]
        excluded = excluded | ((label[:, None] == label[None, :]) & (row[:, None] != row[None, :]))
    sim = sim.masked_fill(excluded, float("-inf"))
    return torch.nn.functional.cross_entropy(sim, twin)


def _matmul_dtype(x: Tensor) -> torch.dtype:
    """The dtype `linear` computes in for `x`: autocast's lower precision where it is on for x's device."""
    device = x.device.type
    if x.is_floating_point() and x.dtype != torch.float64 and torch.is_autocast_enabled(device):  # autocast skips fp64
        return torch.get_autocast_dtype(device)
    return x.dtype


def _logsumexp(logits: Tensor, probs: Tensor, targets: Tensor, target_logit: Tensor) -> Tensor:
    """Each row's logsumexp, read off its softmax `probs` (fp32) without another pass over the row where possible. CPU:
    z_t - log p_t from two gathered numbers; rows whose target prob underflows are recomputed directly. Elsewhere
    max z - log max p (max p >= 1/V never underflows), which needs no host sync for a test of rows."""
    acc = probs.dtype
    if logits.device.type != "cpu":
        return logits.amax(dim=1).to(acc) - probs.amax(dim=1).log()
    target_prob = probs.gather(1, targets[:, None]).squeeze(1)
    lse = target_logit - target_prob.log()
    tiny = target_prob < torch.finfo(acc).tiny  # zero or subnormal: too few digits left
    if tiny.any():
        lse[tiny] = torch.logsumexp(logits[tiny].to(acc), dim=1)
    return lse


class _ChunkedCrossEntropy(_StoredGradients):
    """Mean softmax cross-entropy whose gradients are computed chunk by chunk during the forward pass. Per chunk:
    z = h W^T, loss = logsumexp(z) - (1 - eps) z_target - eps mean(z),
    dz = softmax(z) - (1 - eps) onehot - eps / V, dh = dz W, dW += dz^T h."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, eps: float, rows: int) -> Tensor:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        acc = torch.promote_types(hidden.dtype, torch.float32)  # bf16 inputs, fp32 softmax and sums
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=acc) if need_w else None
        # The matmuls' dtype: autocast's (bf16) when it is on, as `linear` would pick. Both operands are cast once,
        # not in every chunk's `linear` (which would cast the whole weight per chunk).
        low = _matmul_dtype(hidden)
        h_low, w = hidden.to(low), weight.to(low)
        total = hidden.new_zeros((), dtype=acc)
        for start in range(0, hidden.shape[0], rows):
            h, t = h_low[start : start + rows], targets[start : start + rows]
            logits = linear(h, w)  # (m, V) = h @ w.T
            probs = torch.softmax(logits, dim=1, dtype=acc)  # one fused pass
            target_logit = logits.gather(1, t[:, None]).squeeze(1).to(acc)
            row_loss = _logsumexp(logits, probs, t, target_logit) - (1.0 - eps) * target_logit
            if eps:
                row_loss = row_loss - eps * logits.mean(dim=1, dtype=acc)
            total += row_loss.sum()
            if need_h or need_w:
                probs[torch.arange(len(t), device=t.device), t] -= 1.0 - eps  # d(loss sum)/d(logits)
                if eps:
                    probs -= eps / weight.shape[0]
                probs = probs.to(h.dtype)
                if need_h:
                    grad_h[start : start + rows] = probs @ w
                if need_w and low == acc:  # MKL: (h.T @ probs).T in oneDNN was no faster at chunk shapes
                    grad_w.addmm_(probs.T, h)
                elif need_w:  # a bf16 product added in fp32 (autocast's own weight gradient is all bf16):
                    grad_w += probs.T @ h  # faster than the fp32 addmm_ of the fp32 probs
        ctx.save_for_backward(grad_h, grad_w)
        ctx.count, ctx.weight_dtype = hidden.shape[0], weight.dtype
        return total / max(hidden.shape[0], 1)
