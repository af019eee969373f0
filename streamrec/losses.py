"""Next-item training losses, each on the selected (non-padding) positions.

- `full_softmax`: cross-entropy over the whole catalogue (default; best quality when it fits).
- `sampled_softmax`: softmax over the positive and K shared sampled negatives, with the
  logQ correction (Yi et al., 2019) so popular negatives are not over-penalised.
- `bce`: one positive vs K uniform negatives per position (original SASRec).
- `gbce`: BCE with the positive's probability raised to beta (Petrov & Macdonald, 2023), which
  undoes the overconfidence that negative sampling causes.

Legend: M positions, D model width, N items (1..N; 0 = padding), K negatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def full_softmax(hidden: Tensor, targets: Tensor, item_vectors: Tensor, chunk_elements: int = 1 << 20) -> Tensor:
    """Mean cross-entropy over all N items, computed in row chunks without an (M, N) logits tensor.

    Args:
        hidden: (M, D) states.
        targets: (M,) item ids in 1..N.
        item_vectors: (N+1, D), row 0 padding (excluded from the softmax).
        chunk_elements: logits held at once (rows per chunk = this // N, at least 16); 1M floats = 4 MiB,
            which measured ~15% faster than 4-32 MiB chunks on this machine's caches.

    Same value and gradients as `F.cross_entropy(hidden @ item_vectors[1:].T, targets - 1)`,
    but that materialises (M, N) logits, their log-softmax and its gradient: at max_len 200 on
    ML-1M three 350 MB buffers, freshly page-faulted every step. Chunking keeps the working set
    in cache; `benchmarks/streamrec_step.py` measures the difference.
    """
    rows = max(16, chunk_elements // max(item_vectors.shape[0] - 1, 1))
    return _ChunkedCrossEntropy.apply(hidden, item_vectors[1:], targets - 1, rows)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean softmax cross-entropy whose gradients are computed chunk by chunk during the forward pass.

    Per chunk: logits = h W^T, loss = logsumexp - target logit, dlogits = softmax - onehot,
    dh = dlogits W, dW += dlogits^T h. Backward only scales the stored gradients.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, rows: int) -> Tensor:
        # hidden (M, D), weight (N, D), targets (M,) in 0..N-1
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(hidden.dtype, torch.float32)  # bf16 inputs, fp32 softmax and sums
        grad_w = torch.zeros_like(weight, dtype=acc) if need_w else None
        w = weight.to(hidden.dtype)
        total = hidden.new_zeros((), dtype=acc)
        for start in range(0, hidden.shape[0], rows):
            h, t = hidden[start : start + rows], targets[start : start + rows]
            logits = h @ w.T  # (m, N), bf16 under autocast
            probs = torch.softmax(logits, dim=1, dtype=acc)  # one fused pass
            # loss = logsumexp - target logit, and logsumexp = max logit - log(max prob): exact, and
            # the max prob is >= 1/N so it never underflows (a target's own prob can).
            lse = logits.amax(dim=1).to(acc) - probs.amax(dim=1).log()
            total += (lse - logits.gather(1, t[:, None]).squeeze(1).to(acc)).sum()
            if need_h or need_w:
                probs[torch.arange(len(t), device=t.device), t] -= 1.0  # d(loss sum)/d(logits)
                probs = probs.to(h.dtype)
                if need_h:
                    grad_h[start : start + rows] = probs @ w
                if need_w:
                    grad_w += probs.T @ h
        ctx.save_for_backward(grad_h, grad_w)
        ctx.count, ctx.weight_dtype = hidden.shape[0], weight.dtype
        return total / max(hidden.shape[0], 1)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_out / max(ctx.count, 1)
        dh = None if grad_h is None else grad_h * scale.to(grad_h.dtype)
        dw = None if grad_w is None else (grad_w * scale).to(ctx.weight_dtype)
        return dh, dw, None, None


def sample_negatives(
    num_items: int, k: int, device: torch.device, probs: Tensor | None = None, generator: torch.Generator | None = None
) -> Tensor:
    """K item ids in 1..N, drawn with replacement, uniformly or from `probs`.

    Args:
        num_items: N.
        k: how many to draw.
        device: where to put them.
        probs: (N+1,) unnormalised sampling weights (row 0 ignored); uniform when None.
        generator: random generator for reproducibility.

    Returns:
        (K,) item ids.
    """
    if probs is None:
        return torch.randint(1, num_items + 1, (k,), device=device, generator=generator)
    return torch.multinomial(probs[1:], k, replacement=True, generator=generator) + 1


def sampled_softmax(
    hidden: Tensor, targets: Tensor, item_vectors: Tensor, neg_ids: Tensor, log_q: Tensor | None = None
) -> Tensor:
    """Softmax over [positive, K shared negatives] with the logQ correction.

    Args:
        hidden: (M, D) states.
        targets: (M,) positive item ids.
        item_vectors: (N+1, D).
        neg_ids: (K,) sampled negative ids, shared by all positions.
        log_q: (N+1,) log sampling probability of each item; None for uniform sampling,
            where the correction is a constant shift and cancels.

    A negative equal to the row's positive is masked out (an accidental hit, not a negative).
    """
    w = item_vectors.to(hidden.dtype)
    pos = (hidden * w[targets]).sum(-1, keepdim=True).float()  # (M, 1)
    neg = (hidden @ w[neg_ids].T).float()  # (M, K)
    if log_q is not None:
        log_q = log_q.float()
        pos = pos - log_q[targets][:, None]
        neg = neg - log_q[neg_ids][None, :]
    neg = neg.masked_fill(neg_ids[None, :] == targets[:, None], float("-inf"))
    logits = torch.cat([pos, neg], dim=1)  # (M, 1+K)
    return F.cross_entropy(logits, torch.zeros_like(targets))


def bce(hidden: Tensor, targets: Tensor, item_vectors: Tensor, neg_ids: Tensor) -> Tensor:
    """Binary cross-entropy: positive vs its own K negatives.

    Args:
        hidden: (M, D) states.
        targets: (M,) positive item ids.
        item_vectors: (N+1, D).
        neg_ids: (M, K) negative ids per position.
    """
    return gbce(hidden, targets, item_vectors, neg_ids, beta=1.0)


def gbce_beta(num_negatives: int, num_items: int, t: float) -> float:
    """gSASRec's beta = alpha (t (1 - 1/alpha) + 1/alpha), alpha = K / (N - 1) the sampling rate.

    t = 0 gives beta = 1 (plain BCE); t = 1 gives beta = alpha (fully calibrated).
    """
    alpha = num_negatives / max(num_items - 1, 1)
    return alpha * (t * (1 - 1 / alpha) + 1 / alpha)


def gbce(hidden: Tensor, targets: Tensor, item_vectors: Tensor, neg_ids: Tensor, beta: float) -> Tensor:
    """Generalised BCE: -log sigmoid(s+)^beta - sum log(1 - sigmoid(s-)), averaged over positions.

    Args:
        hidden: (M, D) states.
        targets: (M,) positive item ids.
        item_vectors: (N+1, D).
        neg_ids: (M, K) negative ids per position.
        beta: power on the positive probability (see `gbce_beta`).
    """
    w = item_vectors.to(hidden.dtype)
    pos = (hidden * w[targets]).sum(-1).float()  # (M,)
    neg = torch.einsum("md,mkd->mk", hidden, w[neg_ids]).float()  # (M, K)
    # -log sigmoid(x) = softplus(-x); -log(1 - sigmoid(x)) = softplus(x)
    return (beta * F.softplus(-pos) + F.softplus(neg).sum(-1)).mean()
