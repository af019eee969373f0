"""Greedy and batched beam search over a network's `encode` / `decode(..., cache)` (or an `Ensemble`'s). Beam search
keeps `beam_size` live hypotheses per sentence in one (B*K)-row batch; the source side is kept once per sentence
(`core.CrossAttention`'s shared memory rows) and a beam keeps its parent's self-attention cache row where it can, so
only the rows whose beam changed are copied. A sentence is done when it has `beam_size` finished hypotheses or reaches
its limit of `max_len_a * source_length + max_len_b` subwords before EOS (fairseq's definition); done sentences leave
the batch so later steps cost less. Ended hypotheses are ranked by GNMT's length penalty (Wu et al., 2016), EOS counted.

Legend: B sentences, K beam size, S source length, V vocabulary, R = B*K rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from core.nn import DecoderCache
from translate.data.vocab import BOS_ID, EOS_ID
from translate.model.networks import TranslatorNetwork
from translate.search.options import SearchOptions

if TYPE_CHECKING:
    from translate.search.ensemble import Ensemble


@dataclass(order=True)
class Hypothesis:
    """A finished translation: its ids (without BOS/EOS) and scores."""

    score: float  # length-normalised log-probability, used for ranking
    tokens: list[int] = field(compare=False)
    log_prob: float = field(compare=False, default=0.0)


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty ((5 + length) / 6) ** alpha; alpha 0 disables it."""
    return ((5 + length) / 6) ** alpha


def max_output_lengths(src: Tensor, pad_id: int, a: float, b: int, limit: int) -> Tensor:
    """Per-sentence limit on output subwords (EOS not counted): a * source_length + b, capped at `limit`. (B,)"""
    return (a * (src != pad_id).sum(1) + b).long().clamp(min=1, max=limit)


@torch.inference_mode()
def search(model: TranslatorNetwork | Ensemble, src: Tensor, options: SearchOptions) -> list[list[Hypothesis]]:
    """The `options.n_best` best hypotheses per row of (B, S) source ids; beam size 1 runs (cheaper) greedy search."""
    o = options
    limit = {"max_len_a": o.max_len_a, "max_len_b": o.max_len_b}
    if o.beam_size == 1:
        return [[h] for h in greedy_search(model, src, BOS_ID, EOS_ID, **limit)]
    return beam_search(model, src, BOS_ID, EOS_ID, beam_size=o.beam_size, alpha=o.alpha, n_best=o.n_best, **limit)


@torch.no_grad()
def greedy_search(model: TranslatorNetwork | Ensemble, src: Tensor, bos_id: int, eos_id: int, *,
                  max_len_a: float = 1.5, max_len_b: int = 10, max_len: int | None = None) -> list[Hypothesis]:
    """Pick the most likely token at every step; one hypothesis per sentence, scored by its log-probability.
    The output limit (`max_output_lengths`) is capped at `max_len` (default: the model's position limit - 1)."""
    limits = max_output_lengths(src, model.pad_id, max_len_a, max_len_b, _cap(model, max_len))
    memory, src_mask = model.encode(src)
    cache = model.new_cache(int(limits.max()) + 1)
    out = token = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1 + t)
    log_prob = torch.zeros(len(src), device=src.device)
    done = torch.zeros_like(log_prob, dtype=torch.bool)
    for step in range(int(limits.max()) + 1):  # `limit` subwords, then EOS
        logp = _next_log_probs(model, token, memory, src_mask, cache, bos_id)  # (B, V)
        logp = _force_eos(logp, step >= limits, eos_id)
        best_lp, token = logp.max(-1, keepdim=True)  # (B, 1)
        log_prob += torch.where(done, 0.0, best_lp[:, 0])
        out = torch.cat([out, torch.where(done[:, None], eos_id, token)], dim=1)
        done |= token[:, 0] == eos_id
        if bool(done.all()):
            break
    return [Hypothesis(float(lp), _strip(row.tolist(), eos_id), float(lp))
            for row, lp in zip(out[:, 1:], log_prob, strict=True)]


@torch.no_grad()
def beam_search(model: TranslatorNetwork | Ensemble, src: Tensor, bos_id: int, eos_id: int, *, beam_size: int = 5,
                alpha: float = 0.6, max_len_a: float = 1.5, max_len_b: int = 10, n_best: int = 1,
                max_len: int | None = None) -> list[list[Hypothesis]]:
    """Batched beam search with a KV cache: per sentence its `n_best` best hypotheses, best first (`alpha`: the
    GNMT length-penalty exponent; the output limit as in `greedy_search`)."""
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"`n_best` ({n_best}) must be between 1 and `beam_size` ({beam_size})")
    k, n_sent = beam_size, src.shape[0]
    limits = max_output_lengths(src, model.pad_id, max_len_a, max_len_b, _cap(model, max_len))
    logp, memory, src_mask, cache = _first_step(model, src, bos_id, k, int(limits.max()) + 1)  # (R, V)
    tokens = torch.full((n_sent * k, 1), bos_id, dtype=torch.long, device=src.device)  # (R, 1+t)
    scores = torch.full((n_sent, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all beams start identical: keep one alive so the first step is not duplicated
    active = torch.arange(n_sent, device=src.device)  # original index of each sentence still searched
    finished: list[list[Hypothesis]] = [[] for _ in range(n_sent)]

    for step in range(int(limits.max()) + 1):  # `limit` subwords, then EOS
        if step:
            logp = _next_log_probs(model, tokens[:, -1:], memory, src_mask, cache, bos_id)  # (R, V)
        logp = _force_eos(logp, (step >= limits[active]).repeat_interleave(k), eos_id)
        vocab = logp.shape[-1]
        cand = logp.view(-1, k, vocab).add_(scores[:, :, None]).view(-1, k * vocab)  # (B_act, K*V), in place
        top_scores, top_idx = topk_by_blocks(cand, min(2 * k, k * vocab))  # (B_act, 2K)
        top_beam, top_tok = top_idx // vocab, top_idx % vocab
        _collect_finished(finished, active, tokens, top_scores, top_beam, top_tok, eos_id, k, step + 1, alpha)
        # Live beams: the best K candidates that did not end.
        live_scores = top_scores.masked_fill(top_tok == eos_id, float("-inf"))
        scores, pick = live_scores.topk(k, dim=-1)  # (B_act, K)
        beam, tok = top_beam.gather(1, pick), top_tok.gather(1, pick)
        slot = _stable_slots(beam)  # where each new beam lives: most stay in their parent's row
        order = slot.argsort(dim=1)  # the beam in each slot: the inverse permutation
        scores, beam, tok = scores.gather(1, order), beam.gather(1, order), tok.gather(1, order)
        row = (torch.arange(len(active), device=src.device)[:, None] * k + beam).view(-1)  # (R,)
        counts = torch.tensor([len(finished[i]) for i in active.tolist()], device=src.device)
        keep = (counts < k) & (step < limits[active])
        if not bool(keep.any()):
            break
        if not bool(keep.all()):  # drop finished sentences from every per-sentence and per-row tensor
            scores, active = scores[keep], active[keep]
            row = row.view(-1, k)[keep].view(-1)
            tok = tok[keep]
            kept = keep.nonzero()[:, 0]  # (B_act,) the sentences that stay
            cache.reorder_cross(kept)
            memory, src_mask = memory[kept], src_mask[kept]
        cache.reorder_self(row)  # the target side follows its beams; the source side is per sentence
        tokens = torch.cat([tokens[row], tok.view(-1, 1)], dim=1)
    return [sorted(hyps, reverse=True)[:n_best] for hyps in finished]


def _stable_slots(parent: Tensor) -> Tensor:
    """The slot (row within its sentence) of each new beam, given its parent's slot. (B, K) -> (B, K). A parent's first
    child (in score order) takes the parent's own slot; further children take the slots of parents that left no child,
    in order. The self-attention cache then copies only the rows of those further children (beams stored in score order
    would copy every row) and leaves the rest in place."""
    k = parent.shape[1]
    ar = torch.arange(k, device=parent.device)
    same = parent[:, :, None] == parent[:, None, :]  # (B, K, K) beams j and j' share a parent
    first = ~(same & (ar[None, :] < ar[:, None])).any(-1)  # no earlier beam has this parent
    childless = ~(parent[:, :, None] == ar).any(1)  # (B, K) slots whose beam left no child
    free = torch.where(childless, ar, ar + k).sort(dim=1).values  # the free slots first, ascending
    rank = ((~first).cumsum(1) - 1).clamp(min=0)  # j's place among the further children
    return torch.where(first, parent, free.gather(1, rank))


def topk_by_blocks(x: Tensor, k: int, block: int = 128) -> tuple[Tensor, Tensor]:
    """`x.topk(k, dim=-1)` for (B, N) rows, N in the tens of thousands (the K*V beam candidates). Every one of the k
    largest lies in one of the k blocks (of `block` columns) with the largest maxima, so a max per block, a topk over
    those and one over the k chosen blocks give the same values and, ties aside, the same indices. A max per element is
    far cheaper than torch.topk's selection, so the costly topk reads k blocks instead of all N columns."""
    b, n = x.shape
    n_blocks = n // block
    if n_blocks <= k:
        return x.topk(k, dim=-1)
    maxima = x[:, : n_blocks * block].view(b, n_blocks, block).amax(-1)  # (B, n_blocks)
    chosen = maxima.topk(k, dim=-1).indices  # (B, k)
    cols = (chosen[:, :, None] * block + torch.arange(block, device=x.device)).view(b, -1)  # (B, k*block)
    if n > n_blocks * block:  # the columns after the last whole block are always candidates
        cols = torch.cat([cols, torch.arange(n_blocks * block, n, device=x.device).expand(b, -1)], dim=1)
    values, pos = x.gather(1, cols).topk(k, dim=-1)
    return values, cols.gather(1, pos)


def _first_step(model: TranslatorNetwork | Ensemble, src: Tensor, bos_id: int, k: int, steps: int,
                ) -> tuple[Tensor, Tensor, Tensor, DecoderCache]:
    """Encode, decode BOS once per sentence (all its beams start identical), then give each sentence K target-side rows.
    The source side stays one row per sentence for the whole search: `CrossAttention` lets the K beam rows share it, so
    it is neither copied nor read K times a step."""
    memory, src_mask = model.encode(src)
    cache = model.new_cache(steps)  # the most steps this search decodes: the cache never grows
    bos = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    logp = _next_log_probs(model, bos, memory, src_mask, cache, bos_id)  # (B, V)
    rows = torch.arange(src.shape[0], device=src.device).repeat_interleave(k)  # (R,) sentence of each row
    cache.reorder_self(rows)
    return logp[rows], memory, src_mask, cache


def _next_log_probs(model: TranslatorNetwork | Ensemble, tokens: Tensor, memory: Tensor, src_mask: Tensor,
                    cache: DecoderCache, bos_id: int) -> Tensor:
    """Log-probabilities (rows, V) of the token after `tokens` (the newest step), in float32. Padding and BOS never
    follow in a real target, but the softmax gives them a little mass; they are made impossible (-inf, as fairseq does
    for padding) so no hypothesis can contain them. The other tokens keep their log-probabilities (the model's)."""
    logp = model.decode(tokens, memory, src_mask, cache)[:, -1].float().log_softmax(-1)
    logp[:, model.pad_id] = logp[:, bos_id] = float("-inf")
    return logp


def _collect_finished(finished: list[list[Hypothesis]], active: Tensor, tokens: Tensor, top_scores: Tensor,
                      top_beam: Tensor, top_tok: Tensor, eos_id: int, k: int, length: int, alpha: float) -> None:
    """Move candidates that end with EOS into their sentence's finished list, in score order. Only EOS among the top K
    candidates counts (as in fairseq): an EOS ranked below K live continuations would not have survived as a beam, and
    counting it makes beam 1 differ from greedy."""
    ended = (top_tok == eos_id) & torch.isfinite(top_scores)
    ended[:, k:] = False
    if not bool(ended.any()):
        return
    penalty = length_penalty(length, alpha)
    for i, j in ended.nonzero().tolist():
        sent = int(active[i])
        if len(finished[sent]) >= k:
            continue
        lp = float(top_scores[i, j])
        finished[sent].append(Hypothesis(lp / penalty, tokens[i * k + int(top_beam[i, j]), 1:].tolist(), lp))


def _force_eos(logp: Tensor, rows: Tensor, eos_id: int) -> Tensor:
    """At the length limit only EOS may follow. logp (R, V), rows (R,) bool."""
    if not bool(rows.any()):
        return logp
    forced = torch.full_like(logp, float("-inf"))
    forced[:, eos_id] = logp[:, eos_id]  # keep EOS's own probability so scores stay honest
    return torch.where(rows[:, None], forced, logp)


def _cap(model: TranslatorNetwork | Ensemble, max_len: int | None) -> int:
    limit = model.max_tgt_len - 1  # the decoder reads BOS + `limit` subwords to predict EOS
    return limit if max_len is None else min(max_len, limit)


def _strip(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids
