"""Cross-attention word alignments: subword-to-word pooling, AER, and recovery of the demo generator's
known alignment by a freshly trained model."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from translate.alignment_page import write_html
from translate.api import pad_batch
from translate.data.corpus import TranslationDataModule
from translate.data.vocab import train_vocab
from translate.model.module import TranslationModule
from translate.model.transformer import TransformerTranslator
from translate.search.align import DEFAULT_LAYER, align_batch, cross_attention, to_word_matrix, word_alignment, words_of


def parse_pharaoh(text: str) -> set[tuple[int, int]]:
    """ "0-0 1-2" -> {(0, 0), (1, 2)}; a "p" link ("1-2p", possible) is read as sure."""
    return {(int(i), int(j.rstrip("p"))) for i, j in (link.split("-") for link in text.split())}


def alignment_error_rate(predicted: Iterable[set[tuple[int, int]]], sure: Iterable[set[tuple[int, int]]]) -> float:
    """Corpus AER with sure links only: 1 - 2 |A & S| / (|A| + |S|), counts summed over sentences."""
    hits = size_a = size_s = 0
    for a, s in zip(predicted, sure, strict=True):
        hits += len(a & s)
        size_a += len(a)
        size_s += len(s)
    return 1.0 - 2.0 * hits / max(size_a + size_s, 1)


def test_word_matrix_sums_source_pieces_and_averages_target_pieces():
    # target pieces: word 0 = pieces 0, 1; word 1 = piece 2. source pieces: word 0 = 0; word 1 = 1, 2; column 3 = pad.
    weights = torch.tensor([[0.1, 0.2, 0.3, 0.4],
                            [0.5, 0.25, 0.25, 0.0],
                            [0.0, 0.0, 1.0, 0.0]])
    got = to_word_matrix(weights, [0, 0, 1], [0, 1, 1])
    expected = torch.tensor([[(0.1 + 0.5) / 2, (0.2 + 0.3 + 0.25 + 0.25) / 2],
                             [0.0, 1.0]])
    assert torch.allclose(got, expected)


def test_word_alignment_links_each_target_word_to_its_argmax():
    vocab = train_vocab(["der Hund schläft .", "the dog sleeps ."] * 10, 60, cache_dir=None)
    src, tgt = vocab.encode("the dog sleeps ."), vocab.encode("der Hund schläft .")
    # a diagonal attention over subwords: each target piece attends to "its" source word's first piece
    src_words = vocab.word_index(src)
    first_piece = {w: s for s, w in reversed(list(enumerate(src_words)))}
    weights = torch.zeros(len(tgt), len(src))
    for t, w in enumerate(vocab.word_index(tgt)):
        weights[t, first_piece[w]] = 1.0
    a = word_alignment(weights, vocab, src, vocab, tgt)
    assert a.src_words == ["the", "dog", "sleeps", "."] and a.tgt_words == ["der", "Hund", "schläft", "."]
    assert a.pharaoh() == "0-0 1-1 2-2 3-3"
    assert torch.allclose(torch.tensor(a.matrix), torch.eye(4))


def test_words_read_as_the_lines_even_with_characters_the_vocabulary_lacks():
    vocab = train_vocab(["the dog sleeps .", "der Hund schläft ."] * 20, 40, cache_dir=None)
    line = "the Zürich dog sleeps ."  # "Z" and "ü" were never seen: their pieces are <unk>
    ids = vocab.encode(line)
    assert "<unk>" in vocab.pieces(ids)
    words, index = words_of(vocab, ids, line)
    assert words == line.split()
    assert sorted(set(index)) == list(range(len(words)))
    # without the line, the decoded ids give the words; a truncated line falls back to the pieces
    assert words_of(vocab, vocab.encode("der Hund schläft ."))[0] == ["der", "Hund", "schläft", "."]
    truncated = ids[: ids.index(vocab.encode("dog")[0])]
    fallback = words_of(vocab, truncated, line)[0]  # two words, not the line's five
    assert len(fallback) == 2 and fallback[0] == "the" and "<unk>" in fallback[1]


def test_aer_hand_computed():
    sure = [{(0, 0), (1, 1)}, {(0, 1)}]
    predicted = [{(0, 0), (1, 0)}, {(0, 1)}]
    # |A & S| = 2, |A| = 3, |S| = 3
    assert alignment_error_rate(predicted, sure) == pytest.approx(1 - 4 / 6)
    assert alignment_error_rate(sure, sure) == 0.0
    assert parse_pharaoh("0-0 2-1p 1-3") == {(0, 0), (2, 1), (1, 3)}


def test_cross_attention_rows_are_distributions_over_real_source_tokens():
    torch.manual_seed(0)
    model = TransformerTranslator(20, 20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=32,
                       dropout=0.0, max_len=16).eval()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    targets = [[11, 12, 13], [14]]
    weights = cross_attention(model, src, targets, layer="mean")
    assert [tuple(w.shape) for w in weights] == [(3, 4), (1, 4)]
    assert torch.allclose(weights[0].sum(-1), torch.ones(3), atol=1e-5)
    assert torch.all(weights[1][:, 2:] == 0)  # padding gets exactly zero weight
    # the row of target position t comes from the decoder input [BOS] + y_<t: y_t itself must not matter
    changed = cross_attention(model, src, [[11, 12, 4], [14]], layer=-1)
    assert torch.allclose(cross_attention(model, src, targets, layer=-1)[0], changed[0])
    with pytest.raises(ValueError, match="layer"):
        cross_attention(model, src, targets, layer=2)


def test_html_page_is_self_contained(tmp_path):
    vocab = train_vocab(["der Hund <schläft> .", "the dog sleeps ."] * 10, 60, cache_dir=None)
    src, tgt = vocab.encode("the dog sleeps ."), vocab.encode("der Hund <schläft> .")
    a = word_alignment(torch.full((len(tgt), len(src)), 1 / len(src)), vocab, src, vocab, tgt)
    write_html(tmp_path / "a.html", [a])
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    assert "&lt;schläft&gt;" in page and "<schläft>" not in page  # words are escaped
    assert "http" not in page and "<script" not in page


def test_align_batch_on_an_untrained_model_gives_one_link_per_target_word():
    vocab = train_vocab(["der Hund schläft .", "the dog sleeps ."] * 10, 60, cache_dir=None)
    model = TransformerTranslator(vocab.vocab_size, vocab.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
                       n_decoder_layers=1, d_ff=32, dropout=0.0, max_len=16).eval()
    src = [vocab.encode("the dog sleeps ."), vocab.encode("the dog .")]
    padded = torch.tensor([s + [0] * (4 - len(s)) for s in src])
    out = align_batch(model, padded, [vocab.encode("der Hund schläft ."), []], vocab, vocab, layer=0)
    assert sorted(j for _, j in out[0].links) == [0, 1, 2, 3]
    assert out[1].tgt_words == [] and out[1].links == [] and out[1].src_words == ["the", "dog", "."]


# ----------------------------------------------------------------------------- recovery of a known alignment

AER_THRESHOLD = 0.15


@pytest.fixture(scope="module")
def trained(demo, tmp_path_factory) -> SimpleNamespace:
    """A small translator (d_model 64, 1 encoder + 2 decoder layers, no dropout) trained for 240 steps on 2,000
    fresh demo pairs, on one thread (`_one_thread`: deterministic, and on a busy 2-core machine much faster)."""
    out = tmp_path_factory.mktemp("align_corpus")
    demo.write_corpus(demo.generate(train_size=2000, val_size=10, test_size=200, seed=3), out)
    L.seed_everything(0, verbose=False)
    dm = TranslationDataModule(str(out / "train"), str(out / "val"), str(out / "test"), max_len=48,
                               max_tokens=1024, cache_dir=None)
    module = TranslationModule(dm.src_vocab_size, dm.tgt_vocab_size, pad_id=dm.pad_id, max_len=48,
                               d_model=64, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=128, dropout=0.0,
                               lr=6e-3, optimizer={"warmup_steps": 30})
    trainer = L.Trainer(max_steps=240, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, use_distributed_sampler=False,
                        gradient_clip_val=1.0)
    trainer.fit(module, dm)
    gold = [parse_pharaoh(line) for line in (out / "test.align").read_text(encoding="utf-8").splitlines()]
    return SimpleNamespace(model=module.model.eval(), dm=dm, gold=gold)


def _aer(trained: SimpleNamespace, layer) -> float:
    test, dm = trained.dm.dataset("test"), trained.dm
    predicted = []
    for start in range(0, len(test), 100):
        src = pad_batch(test.src_ids[start : start + 100])
        refs = test.tgt_ids[start : start + 100]
        predicted += [set(a.links) for a in align_batch(trained.model, src, refs, dm.src_vocab, dm.tgt_vocab, layer)]
    return alignment_error_rate(predicted, trained.gold)


@pytest.mark.slow
def test_attention_recovers_the_generators_word_alignment(trained):
    """Forced alignment of the 200 test references (so word positions match the gold `test.align`),
    default layer (the mean of the decoder layers), AER with the gold links as sure links.

    The threshold (0.15) leaves room above what this fixture's model reaches with the layer mean, and
    below what layer 0 alone gives (docs/results.md has the demo model's). Every German comma is unaligned
    in the gold data but gets a link here, which alone costs a few points.
    """
    aer = _aer(trained, DEFAULT_LAYER)
    assert aer < AER_THRESHOLD, f"AER {aer:.3f}"
    assert aer < _aer(trained, 0)  # the mean over layers beats the first layer
