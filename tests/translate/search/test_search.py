"""Search against references: greedy, exhaustive enumeration, uncached decoding, batch independence."""

import itertools

import pytest
import torch

from translate.model.transformer import TransformerTranslator
from translate.search import decoding as search
from translate.search.decoding import beam_search, greedy_search, length_penalty, topk_by_blocks

BOS, EOS, PAD = 2, 3, 0


def _model(vocab=12, seed=0, max_len=16, eos_scale=1.0):
    torch.manual_seed(seed)
    model = TransformerTranslator(vocab, vocab, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=32,
                       max_len=max_len, dropout=0.0).eval()
    # Random init gives near-uniform logits; perturb the weights so outputs differ by input,
    # and shrink EOS's output row so that longer outputs can win.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
        model.tgt_embed.embedding.weight[EOS] *= eos_scale
    return model


@torch.no_grad()
def _sequence_log_prob(model, src, ids):
    """Uncached teacher-forced log-probability of BOS + ids (ids end with EOS)."""
    tgt_in = torch.tensor([[BOS, *ids[:-1]]])
    logp = model(src, tgt_in).log_softmax(-1)[0]
    return float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum())


def test_beam_one_equals_greedy():
    model = _model()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 4, PAD]])
    greedy = greedy_search(model, src, BOS, EOS)
    beam = beam_search(model, src, BOS, EOS, beam_size=1, alpha=0.0)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam, strict=True):
        assert g.log_prob == pytest.approx(b[0].log_prob, abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_large_beam_finds_the_exhaustive_best(alpha):
    """Enumerate every output of up to 3 tokens (EOS forced after them) and score it without the cache."""
    vocab, limit = 6, 3
    model = _model(vocab=vocab, seed=2, eos_scale=0.2)
    src = torch.tensor([[4, 5, 4]])
    best_score, best = float("-inf"), None
    for n in range(limit + 1):
        for body in itertools.product(range(vocab), repeat=n):
            if EOS in body or PAD in body or BOS in body:  # search never emits padding or BOS
                continue
            ids = [*body, EOS]
            score = _sequence_log_prob(model, src, ids) / length_penalty(len(ids), alpha)
            if score > best_score:
                best_score, best = score, list(body)
    assert best, "degenerate case: the empty output wins"
    beam = vocab**limit  # wide enough to keep every prefix alive
    hyp = beam_search(model, src, BOS, EOS, beam_size=beam, alpha=alpha, max_len_a=0.0, max_len_b=limit)[0][0]
    assert hyp.tokens == best
    assert hyp.score == pytest.approx(best_score, abs=1e-4)


@pytest.mark.parametrize("favoured", [PAD, BOS])
def test_padding_and_bos_are_never_emitted_even_when_most_likely(favoured):
    model = _model()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 4, PAD]])
    with torch.no_grad():
        model.output.weight[favoured] *= 20  # tied output row: the model now prefers this token
    assert (model(src, torch.tensor([[BOS], [BOS]]))[:, -1].argmax(-1) == favoured).all()
    greedy = greedy_search(model, src, BOS, EOS)
    beams = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4)
    for i in range(len(src)):
        for hyp in [greedy[i], *beams[i]]:
            assert PAD not in hyp.tokens and BOS not in hyp.tokens
            # the score is still the model's own log-probability of what was emitted
            expected = _sequence_log_prob(model, src[i : i + 1], hyp.tokens + [EOS])
            assert hyp.log_prob == pytest.approx(expected, abs=1e-4)


def test_beam_scores_equal_uncached_rescoring():
    model = _model()
    src = torch.tensor([[5, 6, 7, 8, 9]])
    hyps = beam_search(model, src, BOS, EOS, beam_size=4, alpha=0.6, n_best=4)[0]
    assert len(hyps) == 4
    for hyp in hyps:
        ids = hyp.tokens + [EOS]
        assert hyp.log_prob == pytest.approx(_sequence_log_prob(model, src, ids), abs=1e-4)


def test_nbest_is_sorted_and_distinct():
    model = _model()
    hyps = beam_search(model, torch.tensor([[5, 6, 7]]), BOS, EOS, beam_size=5, n_best=5)[0]
    assert len(hyps) == 5
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert len({tuple(h.tokens) for h in hyps}) == 5


def test_output_does_not_depend_on_the_rest_of_the_batch():
    model = _model()
    a = torch.tensor([[5, 6, 7]])
    alone = beam_search(model, a, BOS, EOS, beam_size=3)[0][0]
    batch = torch.tensor([[9, 10, 11, 4, 5, 6, 7], [5, 6, 7, PAD, PAD, PAD, PAD], [4, 4, PAD, PAD, PAD, PAD, PAD]])
    together = beam_search(model, batch, BOS, EOS, beam_size=3)[1][0]
    assert together.tokens == alone.tokens
    assert together.score == pytest.approx(alone.score, abs=1e-4)


def test_length_limit_is_respected():
    model = _model()
    src = torch.tensor([[5, 6]])
    hyps = beam_search(model, src, BOS, EOS, beam_size=3, max_len_a=0.0, max_len_b=1, n_best=3)[0]
    assert len(hyps) == 3  # n-best still full at the tightest limit
    for hyp in hyps:
        assert len(hyp.tokens) <= 1  # one subword, then EOS
    assert len(greedy_search(model, src, BOS, EOS, max_len_a=0.0, max_len_b=1)[0].tokens) <= 1


def test_outputs_reach_exactly_the_limit_when_eos_is_unlikely(monkeypatch):
    """The limit counts subwords before EOS, as fairseq's --max-len-a/b do; the default cap is the
    longest output the decoder's positions can hold (BOS + max_len - 1 subwords), as in training."""
    model = _model(max_len=16)
    decode = model.decode

    def eos_last(*args, **kwargs):  # EOS only when forced (a finite penalty: forcing keeps its score)
        logits = decode(*args, **kwargs).clone()
        logits[..., EOS] -= 1e4
        return logits

    monkeypatch.setattr(model, "decode", eos_last)
    src = torch.tensor([[5, 6, 7], [8, 9, PAD]])
    for a, b, expected in ((0.0, 2, [2, 2]), (1.0, 1, [4, 3]), (0.0, 100, [15, 15])):
        greedy = greedy_search(model, src, BOS, EOS, max_len_a=a, max_len_b=b)
        beams = beam_search(model, src, BOS, EOS, beam_size=3, max_len_a=a, max_len_b=b, n_best=3)
        assert [len(h.tokens) for h in greedy] == expected
        assert [[len(h.tokens) for h in hyps] for hyps in beams] == [[n] * 3 for n in expected]


@pytest.mark.parametrize("n", [1000, 40_000, 40_013])  # fewer blocks than k+1 (plain topk), whole blocks, a tail
def test_topk_by_blocks_equals_torch_topk(n):
    torch.manual_seed(n)
    x = torch.randn(6, n)
    x[0, : n - 3] = float("-inf")  # a row with fewer finite values than k (a beam at its length limit)
    x[1, -1] = 100.0  # the best value in the tail
    values, idx = topk_by_blocks(x, 10)
    ref_values, ref_idx = x.topk(10, dim=-1)
    torch.testing.assert_close(values, ref_values)
    finite = torch.isfinite(ref_values)
    assert torch.equal(idx[finite], ref_idx[finite])  # -inf ties may come from any column


def test_beam_search_with_a_large_vocabulary_equals_plain_topk(monkeypatch):
    """K*V > 128*(2K) columns: the search's block topk runs, and the outputs equal torch.topk's."""
    model = _model(vocab=400, seed=3)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 4, PAD]])
    ours = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4)
    monkeypatch.setattr(search, "topk_by_blocks", lambda x, k: x.topk(k, dim=-1))
    plain = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4)
    assert [[h.tokens for h in hyps] for hyps in ours] == [[h.tokens for h in hyps] for hyps in plain]
    assert [h.score for hyps in ours for h in hyps] == pytest.approx([h.score for hyps in plain for h in hyps])


def test_stable_slots_keep_first_children_in_place_and_fill_free_slots():
    """Against a per-sentence reference: every slot used once; a parent's first child (in score order)
    keeps the parent's slot; the other children take the childless parents' slots in order."""
    torch.manual_seed(0)
    parents = torch.randint(0, 5, (200, 5))
    slots = search._stable_slots(parents)
    for p_row, s_row in zip(parents.tolist(), slots.tolist(), strict=True):
        assert sorted(s_row) == list(range(5))
        free = iter(sorted(set(range(5)) - set(p_row)))
        seen = set()
        for p, s in zip(p_row, s_row, strict=True):
            assert s == (next(free) if p in seen else p)
            seen.add(p)
