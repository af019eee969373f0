"""Translate data layer: file reading errors, subword vocabulary and its cache, filtering,
the token-budget batch sampler, collate, and the LightningDataModule."""

from __future__ import annotations

import io
import logging
import os
import pickle
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import sentencepiece as spm
import torch
from jsonargparse import ArgumentParser
from torch import nn

from translate.data.corpus import (
    Batch,
    Example,
    SampledSegmentations,
    TokenBatchSampler,
    TranslationDataModule,
    collate,
    encode_split,
    read_lines,
    read_parallel,
    read_tsv,
    resolve_paths,
)
from translate.data.vocab import SubwordVocab, piece_word_index, train_vocab

TEXT = [
    "der große Hund sieht die Katze .",
    "ein großer Hund schläft .",
    "heute sieht der Mann den Hund .",
    "er ruft seine Mutter an .",
    "the big dog sees the cat .",
    "today the man sees the dog .",
] * 5


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, f"error spans several lines: {message!r}"
    return message


# ----------------------------------------------------------------------------- reading


def test_read_lines_splits_on_newline_only(tmp_path):
    path = tmp_path / "x.en"
    path.write_bytes("\ufeffone\r\ntwo \u2028 still two\n\nfour\n".encode())
    assert read_lines(path) == ["one", "two \u2028 still two", "", "four"]


def test_mismatched_line_counts_name_file_and_line(tmp_path):
    src = write(tmp_path / "train.en", ["a", "b", "c"])
    tgt = write(tmp_path / "train.de", ["x", "y"])
    with pytest.raises(ValueError) as excinfo:
        read_parallel(src, tgt)
    assert one_line_error(excinfo).startswith(f"{tgt}:3: line missing")
    assert str(src) in str(excinfo.value)


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = tmp_path / "train.en"
    src.write_bytes(b"fine\nalso fine\nbad \xe9 byte\nfine\n")
    write(tmp_path / "train.de", ["a", "b", "c", "d"])
    with pytest.raises(ValueError) as excinfo:
        TranslationDataModule(str(tmp_path / "train"), str(tmp_path / "train"), None, "en", "de", cache_dir=None)
    message = one_line_error(excinfo)
    assert message.startswith(f"{src}:3: invalid UTF-8 (byte 0xe9 at column 5)")


def test_empty_training_file_names_file_and_line(tmp_path):
    (tmp_path / "train.en").write_bytes(b"")
    write(tmp_path / "train.de", [])
    with pytest.raises(ValueError) as excinfo:
        TranslationDataModule(str(tmp_path / "train"), str(tmp_path / "train"), None, "en", "de", cache_dir=None)
    assert one_line_error(excinfo).startswith(f"{tmp_path / 'train.en'}:1: empty file")


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train\.en: no such file"):
        TranslationDataModule(str(tmp_path / "train"), str(tmp_path / "val"), None, "en", "de", cache_dir=None)


def test_blank_training_pairs_are_skipped_and_counted(tmp_path, caplog):
    write(tmp_path / "train.en", ["the dog sleeps .", "", "the cat sleeps .", "the man runs ."])
    write(tmp_path / "train.de", ["der Hund schläft .", "die Katze", "", "der Mann läuft ."])
    with caplog.at_level(logging.INFO, logger="translate.data.corpus"):
        dm = TranslationDataModule(str(tmp_path / "train"), str(tmp_path / "train"), None, cache_dir=None)
    assert f"{tmp_path / 'train.en'} / {tmp_path / 'train.de'}: skipped 2 of 4 pairs with a blank side" in caplog.text
    assert dm.dataset("train").refs == ["der Hund schläft .", "der Mann läuft ."]


def test_training_files_of_blank_lines_only_are_one_line_naming_them(tmp_path):
    write(tmp_path / "train.en", ["", "  ", ""])
    write(tmp_path / "train.de", ["", "", "\t"])
    with pytest.raises(ValueError) as excinfo:
        TranslationDataModule(str(tmp_path / "train"), str(tmp_path / "train"), None, cache_dir=None)
    assert one_line_error(excinfo) == (f"{tmp_path / 'train.en'} / {tmp_path / 'train.de'}: all 3 pairs (lines 1-3) "
                                       "have a blank side; nothing to train on")


def test_split_path_forms(tmp_path):
    assert resolve_paths("data/demo/train", "en", "de") == (Path("data/demo/train.en"), Path("data/demo/train.de"))
    assert resolve_paths("c/{lang}/train.txt", "en", "de") == (Path("c/en/train.txt"), Path("c/de/train.txt"))
    assert resolve_paths(("a.src", "b.tgt"), "en", "de") == (Path("a.src"), Path("b.tgt"))
    assert resolve_paths("corpus/train.tsv", "en", "de") == (Path("corpus/train.tsv"),)


def test_tsv_reads_as_the_line_readers_do(tmp_path):
    """A BOM, CRLF endings and a tab-free blank side are accepted; an empty file or invalid UTF-8 names the line."""
    path = tmp_path / "train.tsv"
    path.write_bytes("\ufeffa dog\tein Hund\r\n\tnur Ziel\r\n".encode())
    assert read_tsv(path) == (["a dog", ""], ["ein Hund", "nur Ziel"])
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"train\.tsv:1: empty file"):
        read_tsv(path)
    path.write_bytes(b"ok\tgut\nbad \xe9\tschlecht\n")
    with pytest.raises(ValueError, match=r"train\.tsv:2: invalid UTF-8"):
        read_tsv(path)


# ----------------------------------------------------------------------------- vocabulary


def test_vocab_cache_is_hit_on_second_call(tmp_path, monkeypatch):
    first = train_vocab(TEXT, vocab_size=60, cache_dir=tmp_path)
    (model,) = tmp_path.glob("*.model")
    os.utime(model, (1_000_000, 1_000_000))  # an old mtime: a rewrite would be visible

    def no_training(*args, **kwargs):
        raise AssertionError("sentencepiece retrained although the cache holds the model")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
    second = train_vocab(TEXT, vocab_size=60, cache_dir=tmp_path)
    assert second == first
    assert list(tmp_path.glob("*.model")) == [model] and model.stat().st_mtime == 1_000_000


def test_vocab_cache_key_depends_on_text_and_options(tmp_path):
    train_vocab(TEXT, vocab_size=60, cache_dir=tmp_path)
    train_vocab(TEXT, vocab_size=50, cache_dir=tmp_path)
    train_vocab(TEXT, vocab_size=60, model_type="unigram", cache_dir=tmp_path)
    train_vocab(TEXT[:-1], vocab_size=60, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.model"))) == 4


def test_training_is_deterministic():
    # DDP ranks train independently on a cold cache and must agree on every piece.
    assert train_vocab(TEXT, 60, cache_dir=None).to_bytes() == train_vocab(TEXT, 60, cache_dir=None).to_bytes()


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_from_bytes_round_trips_encode_and_decode(model_type):
    vocab = train_vocab(TEXT, vocab_size=60, model_type=model_type, cache_dir=None)
    restored = SubwordVocab.from_bytes(vocab.to_bytes())
    unpickled = pickle.loads(pickle.dumps(vocab))
    for text in ("der große Hund sieht den Mann .", "er ruft die Katze an ."):
        ids = vocab.encode(text)
        assert restored.encode(text) == unpickled.encode(text) == ids
        assert restored.decode(ids) == text
    assert (vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2, 3)
    assert vocab.pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert restored.vocab_size == vocab.vocab_size <= 60


def test_bpe_dropout_extremes_are_the_deterministic_and_the_character_segmentations():
    vocab = train_vocab(TEXT, vocab_size=60, cache_dir=None)
    texts = ["der große Hund sieht die Katze .", "today the man sees the dog ."]
    assert vocab.sample_batch(texts, alpha=0.0) == vocab.encode_batch(texts)
    # Every merge dropped: one piece per character, spaces as '▁', as sentencepiece writes them.
    chars = [vocab.pieces(ids) for ids in vocab.sample_batch(texts, alpha=1.0)]
    assert chars == [["▁" if c == " " else c for c in "▁" + text] for text in texts]


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sampled_segmentations_vary_decode_to_the_text_and_replay_with_the_seed(model_type):
    vocab = train_vocab(TEXT, vocab_size=60, model_type=model_type, cache_dir=None)
    texts = TEXT[:6] * 4
    spm.set_random_generator_seed(5)
    first = vocab.sample_batch(texts, alpha=0.3)
    again = vocab.sample_batch(texts, alpha=0.3)
    spm.set_random_generator_seed(5)
    assert vocab.sample_batch(texts, alpha=0.3) == first
    assert [vocab.decode(ids) for ids in first + again] == texts + texts
    assert first != again and first != vocab.encode_batch(texts)


def test_decode_stops_at_eos_and_skips_specials():
    vocab = train_vocab(TEXT, vocab_size=60, cache_dir=None)
    ids = vocab.encode("der Hund schläft .")
    assert vocab.decode([2, *ids, 3, *vocab.encode("die Katze"), 0, 0]) == "der Hund schläft ."
    assert vocab.decode(torch.tensor([2, *ids, 0])) == "der Hund schläft ."


def test_small_corpus_caps_vocab_size_instead_of_failing():
    assert train_vocab(TEXT, vocab_size=8000, cache_dir=None).vocab_size < 200


def test_model_with_other_special_ids_is_rejected():
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT), model_writer=proto, vocab_size=40, minloglevel=2)
    with pytest.raises(ValueError, match=r"expected \(0, 1, 2, 3\)"):
        SubwordVocab.from_bytes(proto.getvalue())


def test_piece_word_index_hand_written():
    assert piece_word_index(["▁der", "▁Hund", "e", "▁", ",", "▁schlafen"]) == [0, 1, 1, 2, 2, 3]
    assert piece_word_index(["ab", "▁c"]) == [0, 1]


def test_word_index_matches_whitespace_words():
    vocab = train_vocab(TEXT, vocab_size=40, cache_dir=None)  # small: words split into several pieces
    text = "der große Hund sieht den Mann ."
    ids = vocab.encode(text)
    index = vocab.word_index([2, *ids, 3, 0])
    assert index[0] == index[-2] == index[-1] == -1
    pieces = vocab.pieces(ids)
    assert len(pieces) > len(text.split())
    rebuilt = ["".join(p for p, w in zip(pieces, index[1:-2], strict=True) if w == k).lstrip("▁") for k in range(7)]
    assert rebuilt == text.split()


# ----------------------------------------------------------------------------- filtering


class WordVocab:
    """Stand-in vocabulary: one id per whitespace word, so lengths are known by hand."""

    def encode_batch(self, texts):
        return [[10 + len(w) for w in t.split()] for t in texts]


def test_training_filters_by_length_and_ratio_and_logs_counts(caplog):
    sources = ["a b c", "a b c d e f g h", "a", "a b c d", "a b"]
    refs = ["x y z", "x y", "x y z w", "x y z w v", "x"]
    # max_len 5: pair 1 has 8 source words (too long); pair 3's target needs 5 + 1 positions (too long).
    # max_ratio 3: pair 2 is 1 vs 4 words (ratio 4) -> dropped; pair 4 is 2 vs 1 (ratio 2) -> kept.
    with caplog.at_level(logging.INFO, logger="translate.data.corpus"):
        ds = encode_split(sources, refs, WordVocab(), WordVocab(), max_len=5, max_ratio=3.0, train=True)
    assert ds.sources == ["a b c", "a b"] and ds.refs == ["x y z", "x"]
    expected = "train: kept 2 of 5 pairs; dropped 2 longer than max_len=5 subwords, 1 with length ratio > 3.0"
    assert expected in caplog.text


def test_evaluation_truncates_but_keeps_every_reference(caplog):
    sources, refs = ["a b c d e f g h", "a"], ["x y z w v u", "x y z w"]
    with caplog.at_level(logging.WARNING, logger="translate.data.corpus"):
        ds = encode_split(sources, refs, WordVocab(), WordVocab(), max_len=5, train=False, name="val")
    assert ds.refs == refs and ds.sources == sources
    assert [len(s) for s in ds.src_ids] == [5, 1] and [len(t) for t in ds.tgt_ids] == [4, 4]
    assert max(ds.widths) == 5
    assert "val: truncated 1 of 2 pairs to max_len=5" in caplog.text


# ----------------------------------------------------------------------------- collate


def test_collate_exact_batch():
    batch = collate([Example(7, [5, 6, 7], [8, 9]), Example(2, [10], [11, 12, 13])])
    assert isinstance(batch, Batch)
    assert batch.src.tolist() == [[5, 6, 7], [10, 0, 0]]
    assert batch.tgt_in.tolist() == [[2, 8, 9, 0], [2, 11, 12, 13]]
    assert batch.tgt_out.tolist() == [[8, 9, 3, 0], [11, 12, 13, 3]]
    assert batch.index.tolist() == [7, 2]
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long


def test_collate_blank_source_keeps_one_column():
    batch = collate([Example(0, [], [4])])
    assert batch.src.tolist() == [[0]] and batch.tgt_in.tolist() == [[2, 4]] and batch.tgt_out.tolist() == [[4, 3]]


# ----------------------------------------------------------------------------- batch sampler


def random_widths(n: int = 500, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(1, 40, size=n).tolist()


def epochs(sampler: TokenBatchSampler, n: int) -> list[list[list[int]]]:
    return [list(sampler) for _ in range(n)]


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_fit_budget_and_cover_every_example_once(shuffle):
    widths = random_widths()
    sampler = TokenBatchSampler(widths, max_tokens=100, shuffle=shuffle, seed=3)
    for batches in epochs(sampler, 3):
        assert len(batches) == len(sampler)
        for batch in batches:
            assert len(batch) * max(widths[i] for i in batch) <= 100
        assert sorted(i for batch in batches for i in batch) == list(range(len(widths)))


def test_batches_are_length_buckets():
    widths = random_widths()
    batches = list(TokenBatchSampler(widths, max_tokens=100, shuffle=True, seed=3))
    spans = sorted((min(widths[i] for i in b), max(widths[i] for i in b)) for b in batches)
    # Sorted then cut: the width ranges of different batches overlap at most at one shared width.
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:], strict=False))


def test_sampler_is_deterministic_per_seed_and_reshuffles_each_epoch():
    widths = random_widths()
    a = epochs(TokenBatchSampler(widths, 100, shuffle=True, seed=1), 2)
    b = epochs(TokenBatchSampler(widths, 100, shuffle=True, seed=1), 2)
    c = epochs(TokenBatchSampler(widths, 100, shuffle=True, seed=2), 1)
    assert a == b
    assert a[0] != a[1] and a[0] != c[0]
    pinned = TokenBatchSampler(widths, 100, shuffle=True, seed=1)
    pinned.set_epoch(1)
    assert list(pinned) == a[1]


def test_unshuffled_sampler_is_fixed_and_sorted():
    widths = random_widths()
    sampler = TokenBatchSampler(widths, 100)
    first, second = epochs(sampler, 2)
    assert first == second
    flat = [widths[i] for b in first for i in b]
    assert flat == sorted(flat)


def test_ranks_share_the_batches_evenly():
    widths = random_widths(n=101)
    full = list(TokenBatchSampler(widths, 60, shuffle=True, seed=0))
    ranks = [list(TokenBatchSampler(widths, 60, shuffle=True, seed=0, rank=r, world_size=3)) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1  # DDP ranks must run equally many steps
    seen = [i for r in ranks for b in r for i in b]
    assert set(seen) == set(range(101))
    assert ranks[0] == full[0::3][: len(ranks[0])]


def test_example_wider_than_budget_is_an_error():
    with pytest.raises(ValueError, match=r"example 1 is 50 tokens wide but `max_tokens` is 40"):
        TokenBatchSampler([3, 50, 2], max_tokens=40)


# ----------------------------------------------------------------------------- data module


def make_module(demo_dir: Path, tmp_path: Path, **kwargs) -> TranslationDataModule:
    return TranslationDataModule(
        str(demo_dir / "train"), str(demo_dir / "val"), str(demo_dir / "test"), "en", "de",
        vocab_size=kwargs.pop("vocab_size", 200), max_tokens=kwargs.pop("max_tokens", 256),
        cache_dir=str(tmp_path / "spm"), **kwargs,
    )


def test_vocab_sizes_exist_right_after_construction(demo_dir, tmp_path):
    dm = make_module(demo_dir, tmp_path)
    assert dm.src_vocab_size == dm.tgt_vocab_size == dm.src_vocab.vocab_size <= 200
    assert dm.src_vocab is dm.tgt_vocab and (dm.pad_id, dm.bos_id, dm.eos_id) == (0, 2, 3)
    separate = make_module(demo_dir, tmp_path, joint_vocab=False, model_type="unigram")
    assert separate.src_vocab != separate.tgt_vocab
    assert "▁Hund" in separate.tgt_vocab.pieces(range(separate.tgt_vocab_size))
    assert "▁dog" not in separate.tgt_vocab.pieces(range(separate.tgt_vocab_size))


def test_dataloaders_give_padded_batches_and_raw_references(demo_dir, tmp_path):
    dm = make_module(demo_dir, tmp_path)
    dm.setup("fit")
    dm.setup("test")
    train = list(dm.train_dataloader())
    assert sorted(i for b in train for i in b.index.tolist()) == list(range(300))
    for b in train:
        assert b.src.numel() <= 256 and b.tgt_in.numel() <= 256
        assert (b.tgt_in[:, 0] == 2).all() and ((b.tgt_out == 3).sum(1) == 1).all()
    val_refs = (demo_dir / "val.de").read_text(encoding="utf-8").splitlines()
    val = dm.dataset("val")
    assert val.refs == val_refs
    for b in dm.val_dataloader():
        for row, i in zip(b.tgt_out, b.index.tolist(), strict=True):
            assert dm.tgt_vocab.decode(row) == val_refs[i]
    assert len(dm.dataset("test")) == 30


def test_missing_test_split_is_a_clear_error(demo_dir, tmp_path):
    dm = TranslationDataModule(str(demo_dir / "train"), str(demo_dir / "val"), None, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"no `test` files configured"):
        dm.test_dataloader()


def test_state_dict_restores_vocab_without_files(demo_dir, tmp_path):
    dm = make_module(demo_dir, tmp_path)
    state = dm.state_dict()
    other = make_module(demo_dir, tmp_path, vocab_size=120)
    assert other.src_vocab != dm.src_vocab
    other.load_state_dict(state)
    assert other.src_vocab == dm.src_vocab and other.src_vocab_size == dm.src_vocab_size


def test_cli_parses_prefix_and_explicit_paths():
    parser = ArgumentParser()
    parser.add_class_arguments(TranslationDataModule, "data", instantiate=False)
    cfg = parser.parse_args(["--data.train=[a.en, b.de]", "--data.val=data/v", "--data.test=null"])
    assert tuple(cfg.data.train) == ("a.en", "b.de") and cfg.data.val == "data/v" and cfg.data.test is None


class _Recorder(L.LightningModule):
    """A minimal model that records which examples each training step saw."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 8)
        self.seen: list[list[int]] = []

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch.index.tolist())
        logits = self.emb(batch.tgt_in) @ self.emb.weight.T  # (B, T, V)
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.log("val_tokens", (batch.tgt_out != 0).sum().float())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_uses_the_sampler_and_reshuffles(demo_dir, tmp_path):
    dm = make_module(demo_dir, tmp_path, max_tokens=512)
    model = _Recorder(dm.tgt_vocab_size)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    per_epoch = len(model.seen) // 2
    first, second = model.seen[:per_epoch], model.seen[per_epoch:]
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(300))
    assert first != second


# ----------------------------------------------------------------------------- subword sampling


def test_subword_sampling_draws_new_training_segmentations_of_the_same_text(demo_dir, tmp_path):
    dm = make_module(demo_dir, tmp_path, subword_sampling=0.2, max_len=40)
    plain = make_module(demo_dir, tmp_path, max_len=40)
    dm.setup("fit")
    plain.setup("fit")
    train = dm.dataset("train")
    epochs_seen, loader = [], dm.train_dataloader()
    for _ in range(2):
        seen = {}
        for b in loader:
            assert b.src.shape[1] <= 40 and b.tgt_in.shape[1] <= 40
            for row, src, i in zip(b.tgt_out, b.src, b.index.tolist(), strict=True):
                assert dm.tgt_vocab.decode(row) == train.refs[i]
                assert dm.src_vocab.decode(src) == train.sources[i]
                seen[i] = row[row != 0].tolist()
        epochs_seen.append(seen)
    assert sorted(epochs_seen[0]) == list(range(len(train)))
    deterministic = {i: [*ids, 3] for i, ids in enumerate(train.tgt_ids)}
    changed = [sum(seen[i] != deterministic[i] for i in seen) for seen in epochs_seen]
    assert min(changed) > len(train) // 4  # most pairs get a new segmentation ...
    assert epochs_seen[0] != epochs_seen[1]  # ... and a different one each epoch
    # Sampled segmentations are longer; the batches are planned on the deterministic ones.
    assert sum(map(len, epochs_seen[0].values())) > sum(map(len, deterministic.values()))
    assert len(dm.train_dataloader()) == len(plain.train_dataloader())
    # Validation keeps the deterministic segmentation.
    for b, p in zip(dm.val_dataloader(), plain.val_dataloader(), strict=True):
        assert torch.equal(b.src, p.src) and torch.equal(b.tgt_out, p.tgt_out)


def test_subword_sampling_in_dataloader_workers(demo_dir, tmp_path):
    # Workers get the dataset pickled and reseed from (seed, rank, worker) as they start.
    dm = make_module(demo_dir, tmp_path, subword_sampling=0.2, num_workers=2)
    train = dm.dataset("train")
    loader = dm.train_dataloader()
    assert loader.worker_init_fn is not None
    rows = [(i, row) for b in loader for i, row in zip(b.index.tolist(), b.tgt_out, strict=True)]
    assert sorted(i for i, _ in rows) == list(range(len(train)))
    assert all(dm.tgt_vocab.decode(row) == train.refs[i] for i, row in rows)
    assert sum(row[row != 0].tolist() != [*train.tgt_ids[i], 3] for i, row in rows) > len(train) // 4


def test_a_sample_longer_than_max_len_falls_back_to_the_deterministic_ids(demo_dir, tmp_path):
    dm = make_module(demo_dir, tmp_path, max_len=30)
    dm.setup("fit")
    train = dm.dataset("train")
    # alpha 1 splits into characters, longer than 30 for every demo sentence.
    chars = SampledSegmentations(train, dm.src_vocab, dm.tgt_vocab, alpha=1.0, max_len=30)
    assert chars[5] == Example(5, train.src_ids[5], train.tgt_ids[5])
    long_enough = SampledSegmentations(train, dm.src_vocab, dm.tgt_vocab, alpha=1.0, max_len=1000)
    assert dm.src_vocab.pieces(long_enough[5].src) == ["▁" if c == " " else c for c in "▁" + train.sources[5]]


def test_reseeding_replays_the_draws_and_ranks_and_workers_differ(demo_dir, tmp_path):
    dm = make_module(demo_dir, tmp_path)
    train = dm.dataset("train")
    indices = list(range(40))

    def draw(rank: int, worker: int) -> list[Example]:
        ds = SampledSegmentations(train, dm.src_vocab, dm.tgt_vocab, alpha=0.3, max_len=128, seed=3, rank=rank)
        ds.reseed(worker)
        return ds.__getitems__(indices)

    assert draw(0, -1) == draw(0, -1)
    assert draw(0, -1) != draw(1, -1) and draw(0, -1) != draw(0, 0) and draw(0, 0) != draw(0, 1)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_bad_subword_sampling_is_a_one_line_error(demo_dir, tmp_path, value):
    with pytest.raises(ValueError, match=r"`data.subword_sampling`") as excinfo:
        make_module(demo_dir, tmp_path, subword_sampling=value)
    one_line_error(excinfo)
    make_module(demo_dir, tmp_path, subword_sampling=1.5, model_type="unigram")  # an exponent there, not a probability
