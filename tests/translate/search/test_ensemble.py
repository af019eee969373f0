"""Ensembles: search over the mean of the members' probabilities, against uncached references and brute force;
loading several checkpoints; the CLI."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from translate import api, infer
from translate import serve as translate_serve
from translate.model.transformer import TransformerTranslator
from translate.search.decoding import beam_search, greedy_search, length_penalty
from translate.search.ensemble import Ensemble
from translate.search.options import SearchOptions

BOS, EOS, PAD = 2, 3, 0


def _member(vocab: int = 8, seed: int = 0, d_model: int = 16, eos_scale: float = 1.0) -> TransformerTranslator:
    torch.manual_seed(seed)
    model = TransformerTranslator(vocab, vocab, d_model=d_model, n_heads=2, n_encoder_layers=1, n_decoder_layers=2,
                       d_ff=32, max_len=16, dropout=0.0).eval()
    g = torch.Generator().manual_seed(seed)  # random init is near-uniform: make the members disagree
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
        model.tgt_embed.embedding.weight[EOS] *= eos_scale
    return model


def _ensemble(vocab: int = 8, eos_scale: float = 1.0) -> Ensemble:
    """Three members of two widths."""
    return Ensemble([_member(vocab, 1, 16, eos_scale), _member(vocab, 2, 24, eos_scale),
                     _member(vocab, 3, 16, eos_scale)]).eval()


@torch.no_grad()
def _naive_log_probs(members: list[TransformerTranslator], src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    """log(mean_m softmax(member m's uncached logits)) (B, T, V), in float64."""
    probs = torch.stack([m(src, tgt_in).double().softmax(-1) for m in members]).mean(0)
    return probs.log()


def _sequence_log_prob(members: list[TransformerTranslator], src: torch.Tensor, ids: list[int]) -> float:
    logp = _naive_log_probs(members, src, torch.tensor([[BOS, *ids[:-1]]]))[0]
    return float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum())


def test_decode_is_the_log_of_the_mean_probability() -> None:
    ens = _ensemble()
    src = torch.tensor([[4, 5, 6, 7], [6, 4, PAD, PAD]])
    tgt = torch.tensor([[BOS, 4, 5], [BOS, 6, 6]])
    with torch.no_grad():
        memory, mask = ens.encode(src)
        got = ens.decode(tgt, memory, mask)
    torch.testing.assert_close(got.double(), _naive_log_probs(list(ens.members), src, tgt), atol=1e-5, rtol=1e-5)


def test_an_ensemble_of_one_searches_like_its_member() -> None:
    member = _member(seed=4)
    src = torch.tensor([[4, 5, 6, 7], [7, 4, PAD, PAD]])
    alone = beam_search(member, src, BOS, EOS, beam_size=3, n_best=3)
    wrapped = beam_search(Ensemble([member]), src, BOS, EOS, beam_size=3, n_best=3)
    assert [[h.tokens for h in s] for s in alone] == [[h.tokens for h in s] for s in wrapped]


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_large_beam_finds_the_exhaustive_best(alpha: float) -> None:
    """Every output of up to 3 tokens, scored without a cache by the naive mean of probabilities."""
    vocab, limit = 6, 3
    ens = _ensemble(vocab, eos_scale=0.2)
    src = torch.tensor([[4, 5, 4]])
    best_score, best = -math.inf, None
    for n in range(limit + 1):
        for body in itertools.product(range(vocab), repeat=n):
            if {EOS, PAD, BOS} & set(body):
                continue
            ids = [*body, EOS]
            score = _sequence_log_prob(list(ens.members), src, ids) / length_penalty(len(ids), alpha)
            if score > best_score:
                best_score, best = score, list(body)
    hyp = beam_search(ens, src, BOS, EOS, beam_size=vocab * vocab, alpha=alpha, max_len_a=0, max_len_b=limit)[0][0]
    assert hyp.tokens == best
    assert hyp.score == pytest.approx(best_score, abs=1e-4)


def test_output_does_not_depend_on_the_rest_of_the_batch() -> None:
    """Sentences finishing at different steps leave the batch (the members' caches drop their rows together)."""
    ens = _ensemble(eos_scale=1.5)
    rows = [[4, 5, 6, 7, 4], [6, 4, PAD, PAD, PAD], [5, PAD, PAD, PAD, PAD], [7, 7, 6, PAD, PAD]]
    together = beam_search(ens, torch.tensor(rows), BOS, EOS, beam_size=3)
    for row, hyps in zip(rows, together, strict=True):
        alone = beam_search(ens, torch.tensor([[t for t in row if t != PAD]]), BOS, EOS, beam_size=3)[0]
        assert hyps[0].tokens == alone[0].tokens
        assert hyps[0].score == pytest.approx(alone[0].score, abs=1e-4)
    greedy = greedy_search(ens, torch.tensor(rows), BOS, EOS)
    beam1 = beam_search(ens, torch.tensor(rows), BOS, EOS, beam_size=1, alpha=0.0)
    assert [g.tokens for g in greedy] == [b[0].tokens for b in beam1]


def test_members_must_share_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="share a vocabulary"):
        Ensemble([_member(vocab=8), _member(vocab=9)])


# ------------------------------------------------------------------ checkpoints and the CLI


@pytest.fixture(scope="module")
def two_ckpts(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory, train_tiny_checkpoint) -> list[Path]:
    """Two tiny checkpoints trained on one corpus with one sentencepiece model (2 and 1 decoder layers)."""
    out = tmp_path_factory.mktemp("ensemble")
    (out / "a").mkdir()
    (out / "b").mkdir()
    first, _ = train_tiny_checkpoint(demo_dir, out / "a", 32, n_decoder_layers=2)
    second, _ = train_tiny_checkpoint(demo_dir, out / "b", 32, n_decoder_layers=1)
    return [first, second]


def test_cli_translates_with_an_ensemble_and_aligns_with_its_first_member(two_ckpts, demo_dir, tmp_path) -> None:
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:8]
    src = tmp_path / "in.en"
    src.write_text("\n".join([*lines[:4], "", *lines[4:]]) + "\n", encoding="utf-8")
    out, align = tmp_path / "out.de", tmp_path / "align.jsonl"
    infer.main(["--ckpt", *map(str, two_ckpts), "-i", str(src), "-o", str(out), "--beam-size", "3",
                "--alignments", str(align), "--align-layer", "-1"])
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(got) == 9 and got[4] == ""
    # the same translations as searching the ensemble directly
    t = api.Translator.load(two_ckpts)
    assert isinstance(t.model, Ensemble) and len(t.model.members) == 2
    sources = [t.src_vocab.encode(line) for line in lines]
    hyps, _ = t.translate_ids(sources, SearchOptions(beam_size=3))
    assert [g for i, g in enumerate(got) if i != 4] == [t.tgt_vocab.decode(h[0].tokens) for h in hyps]
    # alignments come from the first member: its last decoder layer (the second has one layer only)
    assert len(align.read_text(encoding="utf-8").splitlines()) == 9


def test_checkpoints_with_other_vocabularies_are_a_one_line_error(two_ckpts, demo, tmp_path, train_tiny_checkpoint):
    other_dir = tmp_path / "other_corpus"
    demo.write_corpus(demo.generate(train_size=200, val_size=10, test_size=10, seed=7), other_dir)
    (tmp_path / "other").mkdir()
    other, _ = train_tiny_checkpoint(other_dir, tmp_path / "other", 32)
    src = tmp_path / "in.en"
    src.write_text("the dog sleeps .\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=rf"^error: {other}: its vocabularies differ from {two_ckpts[0]}'s"):
        infer.main(["--ckpt", str(two_ckpts[0]), str(other), "-i", str(src), "-o", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_the_server_loads_several_checkpoints_as_one_ensemble(two_ckpts) -> None:
    paths = [str(p) for p in two_ckpts]
    assert translate_serve.build_parser().parse_args(["--ckpt", *paths]).ckpt == paths
    server = translate_serve.TranslateAPI(paths)
    server.load("cpu")
    assert isinstance(server.translator.model, Ensemble) and len(server.translator.model.members) == 2
