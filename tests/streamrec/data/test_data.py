"""StreamRec's data pipeline (readers, vocabulary, splits, datasets, DataModule) against independent references:
brute-force splits, hand-written batches, a leakage check, and one test per bad-input error (each must name the
file and row or column)."""

from __future__ import annotations

import json
import logging
import pickle
import random
import re

import lightning as L
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch.cli import LightningCLI

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.datasets import (
    EvalDataset,
    TrainDataset,
    collate_eval,
    collate_train,
    item_counts,
    training_windows,
)
from streamrec.data.interactions import Interactions
from streamrec.data.readers import read_interactions, sniff_format
from streamrec.data.splits import EvalCase, leave_one_out_split, temporal_split, time_quantiles
from streamrec.data.vocab import ItemVocab
from streamrec.model.metrics import RankingMetrics, most_popular_scores

CSV = "user_id,item_id,timestamp\n"


# ----------------------------------------------------------------------------- reading


def test_csv_groups_by_user_sorts_by_time_and_keeps_file_order_on_ties(write):
    path = write("log.csv", CSV + "u2,a,5\nu1,b,3\nu2,c,1\nu1,d,3\nu1,e,2\nu2,007,5\n")
    inter = read_interactions(path)
    assert list(inter.items) == ["u2", "u1"]  # first appearance
    # u1: e(2), then b and d tie at 3 and keep file order; u2: c(1), then a and 007 tie at 5.
    assert inter.items == {"u2": ["c", "a", "007"], "u1": ["e", "b", "d"]}
    assert inter.timestamps == {"u2": [1.0, 5.0, 5.0], "u1": [2.0, 3.0, 3.0]}
    assert inter.num_interactions == 6


def test_tsv_parquet_and_custom_columns_read_like_csv(write, tmp_path):
    rows = [("u2", "a", 5), ("u1", "b", 3), ("u2", "c", 1), ("u1", "d", 3)]
    csv_path = write("log.csv", CSV + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    tsv_path = write("log.tsv", "who\twhat\twhen\textra\n" + "".join(f"{u}\t{i}\t{t}\tx\n" for u, i, t in rows))
    pq_path = tmp_path / "log.parquet"
    # Integer ids in Parquet must come back as strings.
    pq.write_table(pa.table({"user_id": [u for u, _, _ in rows], "item_id": [10, 11, 12, 13],
                             "timestamp": [t for _, _, t in rows]}), pq_path)
    expected = read_interactions(csv_path)
    assert read_interactions(tsv_path, user_col="who", item_col="what", time_col="when") == expected
    from_parquet = read_interactions(pq_path)
    assert from_parquet.items == {"u2": ["12", "10"], "u1": ["11", "13"]}
    assert from_parquet.timestamps == expected.timestamps


def test_parquet_timestamp_type_is_read_as_numbers(tmp_path):
    path = tmp_path / "log.parquet"
    stamps = pa.array([30, 10, 20], type=pa.timestamp("s"))
    pq.write_table(pa.table({"user_id": ["u", "u", "u"], "item_id": ["a", "b", "c"], "timestamp": stamps}), path)
    inter = read_interactions(path)
    assert inter.items == {"u": ["b", "c", "a"]}
    assert inter.timestamps == {"u": [10.0, 20.0, 30.0]}


def test_sasrec_and_lines_formats(write):
    sasrec = write("seq.txt", "1 5\n1 3\n2 5\n\n1 9\n")  # blank lines are skipped
    assert read_interactions(sasrec, format="sasrec") == Interactions.from_dict({"1": ["5", "3", "9"], "2": ["5"]})
    # .txt defaults to the per-user format, which also reads SASRec files the same way.
    assert read_interactions(sasrec) == read_interactions(sasrec, format="sasrec")
    lines = write("users.dat", "u1 a b c\nu2 b\n")
    assert read_interactions(lines) == Interactions.from_dict({"u1": ["a", "b", "c"], "u2": ["b"]})


@pytest.mark.parametrize("name", ["log.txt", "log.dat", "log", "log.bin"])
def test_auto_format_reads_the_content_whatever_the_name(write, name, tmp_path):
    """CSV, TSV, Parquet and per-user lines are recognised by their content; the name only breaks ties."""
    rows = [("u2", "12", 5), ("u1", "11", 1), ("u2", "10", 3), ("u1", "13", 2)]
    expected = read_interactions(write("ref.csv", CSV + "".join(f"{u},{i},{t}\n" for u, i, t in rows)))
    csv_file = write("csv_" + name, CSV + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    tsv_file = write("tsv_" + name, CSV.replace(",", "\t") + "".join(f"{u}\t{i}\t{t}\n" for u, i, t in rows))
    pq_file = tmp_path / ("pq_" + name)
    pq.write_table(pa.table({"user_id": [r[0] for r in rows], "item_id": [r[1] for r in rows],
                             "timestamp": [r[2] for r in rows]}), pq_file)
    for path in (csv_file, tsv_file, pq_file):
        assert read_interactions(path) == expected, path.name
    lines_file = write("lines_" + name, "u1 a b c\nu2 b\n")
    assert read_interactions(lines_file) == Interactions.from_dict({"u1": ["a", "b", "c"], "u2": ["b"]})


def test_sniff_format_against_the_format_each_file_was_written_in(write, tmp_path):
    cases = {"a.x": (CSV + "u,a,1\n", "csv"), "b.x": ("user_id\titem_id\nu\ta\n", "tsv"),
             "c.x": ("1 2\n1 3\n", "lines"), "d.x": ("u1 a b c\nu2 d\n", "lines"), "e.x": ("justone\n", None),
             "f.x": ("", None), "g.x": (b"\x00\x01\x02", None)}
    for name, (content, fmt) in cases.items():
        assert sniff_format(write(name, content)) == fmt, name
    pq.write_table(pa.table({"a": [1]}), tmp_path / "h.x")
    assert sniff_format(tmp_path / "h.x") == "parquet"


def test_no_time_column_keeps_file_order(write):
    path = write("log.csv", "user_id,item_id\nu,b\nu,a\n")
    assert read_interactions(path, time_col=None) == Interactions.from_dict({"u": ["b", "a"]}, None)


BAD_INPUTS = [
    # (file name, content, format, substrings the one-line message must contain)
    ("missing.csv", CSV.replace("item_id", "item") + "u,a,1\n", "auto",
     ["'item_id'", "columns: user_id, item", "item_col="]),
    ("empty.csv", "", "auto", ["empty", "header"]),
    ("header_only.csv", CSV, "auto", ["no interactions"]),
    ("when.csv", CSV + "u,a,1\nu,b,yesterday\n", "auto", ["line 3", "'timestamp'", "'yesterday'", "numeric"]),
    ("nan.csv", CSV + "u,a,nan\n", "auto", ["line 2", "'timestamp'"]),
    ("short.csv", CSV + "u,a,1\nu,b\n", "auto", ["line 3", "2 fields", "header has 3"]),
    ("noid.csv", CSV + "u,,1\n", "auto", ["line 2", "'item_id'", "empty id"]),
    ("commas.tsv", CSV + "u,a,1\n", "tsv", ["no column 'user_id'", "user_col=", "looks like CSV", "--data.format csv"]),
    ("latin.csv", (CSV + "u,caf\xe9,1\n").encode("latin-1"), "auto", ["not UTF-8", "format="]),
    ("seq.txt", "1 2\n1 3 4\n", "sasrec", ["line 2", "'user item'", "3", "format='lines'"]),
    ("users.txt", "u1 a b\nu2\n", "auto", ["line 2", "'u2'"]),
    ("blank.txt", "\n \n", "auto", ["no interactions"]),
    ("log.json", "{}", "auto", ["'.json'", "format="]),
    ("log.csv", CSV + "u,a,1\n", "xml", ["`format`", "'xml'"]),
    ("fake.parquet", CSV + "u,a,1\n", "parquet", ["Parquet", "looks like CSV", "--data.format csv"]),
    ("log.txt", CSV + "u,a,1\n", "lines", ["line 1", "looks like CSV", "--data.format csv"]),
    ("seqs.csv", "u1 a b\nu2 b c\n", "csv", ["no column 'user_id'", "looks like one line per user",
                                              "--data.format lines"]),
    ("binary.csv", b"PAR1\0\0", "csv", ["NUL byte", "looks like Parquet", "--data.format parquet"]),
]


@pytest.mark.parametrize(("name", "content", "fmt", "expected"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gives_one_line_error_naming_file_and_place(write, name, content, fmt, expected):
    path = write(name, content)
    with pytest.raises(ValueError) as info:
        read_interactions(path, format=fmt)
    message = str(info.value)
    assert "\n" not in message
    for part in [name] * (fmt != "xml") + expected:
        assert part in message, f"{part!r} not in {message!r}"


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"user_id": ["u"], "item": ["a"], "timestamp": [1]}, ["no column 'item_id'", "item_col="]),
        ({"user_id": ["u", None], "item_id": ["a", "b"], "timestamp": [1, 2]}, ["row 2", "'user_id'", "missing"]),
        ({"user_id": ["u", "u"], "item_id": ["a", "b"], "timestamp": ["1", "x"]}, ["row 2", "'timestamp'", "'x'"]),
        ({"user_id": pa.array([], pa.string()), "item_id": pa.array([], pa.string()),
          "timestamp": pa.array([], pa.int64())}, ["no rows"]),
    ],
    ids=["missing-column", "null", "non-numeric-time", "empty"],
)
def test_bad_parquet_errors_name_file_and_row_or_column(tmp_path, table, expected):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(table), path)
    with pytest.raises(ValueError) as info:
        read_interactions(path)
    message = str(info.value)
    assert "\n" not in message and "bad.parquet" in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.csv.*does not exist; check `path`"):
        read_interactions(tmp_path / "nope.csv")
    with pytest.raises(FileNotFoundError, match=r"nope\.csv"):
        StreamRecDataModule(str(tmp_path / "nope.csv"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"empty: the folder holds no files"):
        read_interactions(empty)


# ----------------------------------------------------------------------------- vocabulary


def test_vocab_numeric_ids_keep_their_order_and_strings_sort():
    assert ItemVocab.build(["10", "2", "1", "2"]).items == ["1", "2", "10"]  # SASRec ids 1..N stay 1..N
    vocab = ItemVocab.build(["v2", "v10", "a"])
    assert vocab.items == ["a", "v10", "v2"] and vocab.num_items == len(vocab) == 3
    assert vocab.encode(["a", "v2"]) == [1, 3] and vocab.decode([3, 1]) == ["v2", "a"]
    assert vocab.decode(torch.tensor([2])) == ["v10"] and "a" in vocab and "b" not in vocab


def test_vocab_round_trips_through_a_json_checkpoint():
    vocab = ItemVocab.build(["x", "007", "y"])
    restored = ItemVocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored.items == vocab.items and restored.encode(["007", "y"]) == vocab.encode(["007", "y"])
    with pytest.raises(ValueError, match="'items' list"):
        ItemVocab.from_dict({"tokens": []})


def test_vocab_unknown_ids_raise_or_are_skipped_and_counted(caplog):
    vocab = ItemVocab(["a", "b"])
    with pytest.raises(ValueError, match=r"unknown item ids 'zz', 'yy' \(vocabulary has 2 items\).*skip_unknown=True"):
        vocab.encode(["a", "zz", "yy"])
    with caplog.at_level(logging.WARNING, logger="streamrec"):
        assert vocab.encode(["a", "zz", "b", "yy"], skip_unknown=True) == [1, 2]
    assert "skipped 2 unknown item ids" in caplog.text
    with pytest.raises(ValueError, match="0 is padding"):
        vocab.decode([0])
    with pytest.raises(ValueError, match="appears twice"):
        ItemVocab(["a", "a"])


# ----------------------------------------------------------------------------- splits


def _random_sequences(num_users: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {f"u{u}": [rng.randint(1, 9) for _ in range(rng.randint(1, 12))] for u in range(num_users)}


def test_leave_one_out_matches_brute_force(caplog):
    sequences = _random_sequences(40, seed=1)
    with caplog.at_level(logging.INFO, logger="streamrec"):
        split = leave_one_out_split(sequences)
    short = [u for u, s in sequences.items() if len(s) < 3]
    assert f"{len(short)} users with fewer than 3 interactions are used for training only" in caplog.text
    for user, seq in sequences.items():
        n = len(seq)
        assert split.train[user] == (seq if n < 3 else seq[: n - 2])
    expected_valid = [(u, s[: len(s) - 2], s[len(s) - 2]) for u, s in sequences.items() if len(s) >= 3]
    expected_test = [(u, s[: len(s) - 1], s[len(s) - 1]) for u, s in sequences.items() if len(s) >= 3]
    assert [(c.user, list(c.history), c.target) for c in split.valid] == expected_valid
    assert [(c.user, list(c.history), c.target) for c in split.test] == expected_test


@pytest.mark.parametrize("sliding_window", [False, True])
def test_leave_one_out_never_leaks_held_out_positions_into_training(sliding_window):
    # Every event gets its own item "user:position", so a training batch can be traced back to
    # positions; the held-out positions (n-1 test, n-2 validation) must never appear in it.
    rng = random.Random(0)
    raw = {f"u{u}": [f"u{u}:{p}" for p in range(rng.randint(1, 14))] for u in range(30)}
    vocab = ItemVocab.build(i for seq in raw.values() for i in seq)
    split = leave_one_out_split({u: vocab.encode(seq) for u, seq in raw.items()})
    max_len = 4
    dataset = TrainDataset(split.train.values(), max_len, sliding_window)
    batch = collate_train([dataset[i] for i in range(len(dataset))], max_len)
    used: dict[str, set[int]] = {}
    for ids in (batch.inputs, batch.targets):
        for item in vocab.decode(ids[ids != 0]):
            user, pos = item.split(":")
            used.setdefault(user, set()).add(int(pos))
    for case in split.test + split.valid:
        assert case.position not in used.get(case.user, set())
    held_out = {(c.user, c.position) for c in split.test + split.valid}
    assert all((u, p) not in held_out for u, ps in used.items() for p in ps)
    for user, seq in raw.items():  # the test target is the last event, the validation one the one before
        if len(seq) >= 3:
            assert {c.position for c in split.test if c.user == user} == {len(seq) - 1}
            if sliding_window and len(seq) > 3:  # and with windows every earlier event is trained on
                assert used[user] == set(range(len(seq) - 2))


def test_temporal_split_matches_brute_force_and_never_leaks(write, caplog):
    rng = random.Random(3)
    rows = [(f"u{rng.randint(0, 7)}", n, rng.randint(0, 30)) for n in range(120)]  # item n = row n
    path = write("log.csv", CSV + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    inter = read_interactions(path)
    vocab = ItemVocab.build(i for s in inter.items.values() for i in s)
    sequences = {u: vocab.encode(s) for u, s in inter.items.items()}
    valid_cutoff, test_cutoff = 12, 21
    with caplog.at_level(logging.INFO, logger="streamrec"):
        split = temporal_split(sequences, inter.timestamps, valid_cutoff, test_cutoff)

    # Brute force from the raw rows: a user's events ordered by (time, row number).
    ordered = {u: sorted((t, n) for uu, n, t in rows if uu == u) for u in inter.items}
    expected_valid, expected_test, cold = [], [], 0
    for user, events in ordered.items():
        items = [str(n) for _, n in events]
        train = [i for (t, _), i in zip(events, items, strict=True) if t <= valid_cutoff]
        assert vocab.decode(split.train.get(user, [])) == train
        for pos, (t, _) in enumerate(events):
            if t > valid_cutoff:
                if pos == 0:
                    cold += 1
                    continue
                case = (user, items[:pos], items[pos])
                (expected_valid if t <= test_cutoff else expected_test).append(case)
    decoded = lambda cases: sorted((c.user, vocab.decode(c.history), vocab.decode([c.target])[0]) for c in cases)  # noqa: E731
    assert decoded(split.valid) == sorted(expected_valid)
    assert decoded(split.test) == sorted(expected_test)
    assert (f"skipped {cold} evaluation targets" in caplog.text) == (cold > 0)

    # No training example contains an event after the validation cutoff.
    time_of = {str(n): t for _, n, t in rows}
    windows = TrainDataset(split.train.values(), max_len=3, sliding_window=True).windows
    assert windows and all(time_of[i] <= valid_cutoff for w in windows for i in vocab.decode(w))


def test_time_quantiles_and_bad_cutoffs():
    timestamps = {"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0]}
    assert time_quantiles(timestamps, [0.0, 0.5, 1.0]) == [1.0, 3.0, 5.0]
    with pytest.raises(ValueError, match="must lie in"):
        time_quantiles(timestamps, [1.5])
    with pytest.raises(ValueError, match="must not exceed"):
        temporal_split({"a": [1, 2, 3]}, {"a": [1.0, 2.0, 3.0]}, 3.0, 2.0)


# ----------------------------------------------------------------------------- examples and batches


def test_training_windows_default_keeps_last_and_sliding_covers_every_transition_once():
    history = list(range(1, 12))  # 11 items, 10 transitions
    assert training_windows(history, 4) == [[7, 8, 9, 10, 11]]
    assert training_windows([5], 4) == [] and training_windows([5, 6], 4) == [[5, 6]]
    for max_len in (1, 2, 3, 4, 10, 20):
        windows = training_windows(history, max_len, sliding_window=True)
        assert all(2 <= len(w) <= max_len + 1 for w in windows)
        pairs = [(a, b) for w in windows for a, b in zip(w, w[1:], strict=False)]
        assert sorted(pairs) == [(i, i + 1) for i in range(1, 11)]  # each transition exactly once


def test_collate_train_builds_the_hand_written_batch():
    batch = collate_train([[1, 2, 3, 4, 5], [7, 8], [3, 1, 3]], max_len=4)
    assert torch.equal(batch.inputs, torch.tensor([
        [1, 2, 3, 4],
        [0, 0, 0, 7],
        [0, 0, 3, 1],
    ]))
    assert torch.equal(batch.targets, torch.tensor([
        [2, 3, 4, 5],
        [0, 0, 0, 8],  # 0 = ignore
        [0, 0, 1, 3],
    ]))


def test_collate_eval_builds_the_hand_written_batch():
    cases = [EvalCase("a", [5, 6, 7, 6, 9], 4), EvalCase("b", [2, 4, 8], 1)]
    dataset = EvalDataset(cases)
    batch = collate_eval([dataset[0], dataset[1]], max_len=3)
    assert torch.equal(batch.rows, torch.tensor([0, 1]))
    assert torch.equal(batch.inputs, torch.tensor([[6, 7, 6], [0, 0, 2]]))  # last 3 of the history, left-padded
    assert torch.equal(batch.targets, torch.tensor([9, 4]))
    assert torch.equal(batch.seen, torch.tensor([[5, 6, 7], [2, 0, 0]]))  # distinct, whole history, right-padded


def test_item_counts():
    assert torch.equal(item_counts([[1, 3, 3], [3]], num_items=4), torch.tensor([0, 1, 0, 3, 0]))


# ----------------------------------------------------------------------------- data module


def test_datamodule_knows_num_items_before_setup_and_serves_batches(write, caplog):
    rows = "u1,a,1\nu1,b,2\nu1,c,3\nu1,d,4\nu2,b,1\nu2,e,2\nu2,a,3\nu3,z,9\nu4,a,1\nu4,c,2\n"
    path = write("log.csv", CSV + rows)
    with caplog.at_level(logging.INFO, logger="streamrec"):
        dm = StreamRecDataModule(str(path), max_len=3, batch_size=8)
        assert dm.num_items == 5  # u3's only item 'z' is dropped with u3
    assert "skipped 1 of 4 users with fewer than 2 interactions" in caplog.text
    assert dm.vocab.items == ["a", "b", "c", "d", "e"]
    dm.setup("fit")
    (train,) = list(dm.train_dataloader())
    # u1 trains on a b and u4 (2 events: training only) on a c; u2's training history is just b: no example.
    assert sorted(map(tuple, train.inputs.tolist())) == [(0, 0, 1), (0, 0, 1)]
    assert sorted(map(tuple, train.targets.tolist())) == [(0, 0, 2), (0, 0, 3)]
    (valid,) = list(dm.val_dataloader())
    (test,) = list(dm.test_dataloader())
    assert valid.targets.tolist() == [3, 5] and test.targets.tolist() == [4, 1]  # u1: c then d; u2: e then a
    assert test.inputs.tolist() == [[1, 2, 3], [0, 2, 5]]
    assert dm.train_item_counts().tolist() == [0, 2, 2, 1, 0, 0]
    for loader in (dm.train_dataloader(), dm.test_dataloader()):  # worker processes need to pickle these
        pickle.loads(pickle.dumps((loader.dataset, loader.collate_fn)))
    dm.load_state_dict(json.loads(json.dumps(dm.state_dict())))  # checkpoints carry the vocabulary
    with pytest.raises(ValueError, match=r"log\.csv: its 5 items map to different ids than the checkpoint's 2"):
        dm.load_state_dict({"vocab": {"items": ["a", "b"]}})


def test_datamodule_temporal_split_and_its_errors(write):
    path = write("log.csv", CSV + "u1,a,1\nu1,b,2\nu1,c,3\nu2,a,1\nu2,c,4\n")
    dm = StreamRecDataModule(str(path), split="temporal", temporal_cutoffs=(2, 3), max_len=2)
    dm.setup("fit")
    assert [(c.user, c.target) for c in dm.splits.valid] == [("u1", 3)]
    assert [(c.user, c.target) for c in dm.splits.test] == [("u2", 3)]
    seq = write("seq.txt", "1 1\n1 2\n")
    with pytest.raises(ValueError, match=r"seq\.txt: split='temporal' needs timestamps.*leave_one_out"):
        _ = StreamRecDataModule(str(seq), split="temporal").num_items
    with pytest.raises(ValueError, match="`max_len` must be at least 1, got 0"):
        StreamRecDataModule(str(path), max_len=0)
    with pytest.raises(ValueError, match="no user has 9 or more interactions.*min_interactions"):
        _ = StreamRecDataModule(str(path), min_interactions=9).vocab


class _NeedsNumItems(L.LightningModule):
    """Stand-in model whose item table size comes from the data module.

    Args:
        num_items: N.
    """

    def __init__(self, num_items: int = 0):
        super().__init__()
        self.items = torch.nn.Embedding(num_items + 1, 2)


class _LinkingCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.num_items", "model.num_items", apply_on="instantiate")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # jsonargparse deprecations raised inside LightningCLI
def test_num_items_links_into_the_model_through_lightning_cli(write, monkeypatch):
    path = write("log.csv", CSV + "u1,a,1\nu1,b,2\nu2,c,1\nu2,a,2\n")
    monkeypatch.setattr("sys.argv", ["streamrec"])  # pytest's own arguments are not for the CLI
    args = ["--data.path", str(path), "--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    cli = _LinkingCLI(_NeedsNumItems, StreamRecDataModule, run=False, args=args, seed_everything_default=False)
    assert cli.model.items.num_embeddings == 3 + 1


# ----------------------------------------------------------------------------- demo data


def test_demo_is_deterministic_and_well_formed(demo):
    rows = demo.generate(users=60, items=80, seed=0)
    assert rows == demo.generate(users=60, items=80, seed=0) != demo.generate(users=60, items=80, seed=1)
    assert all(re.fullmatch(r"u\d{4}", u) and re.fullmatch(r"v\d{4}", i) for u, i, _ in rows)
    assert [t for _, _, t in rows] == sorted(t for _, _, t in rows)
    per_user: dict[str, list[int]] = {}
    for u, _, t in rows:
        per_user.setdefault(u, []).append(t)
    assert len(per_user) == 60 and all(20 <= len(ts) <= 60 for ts in per_user.values())
    assert all(a < b for ts in per_user.values() for a, b in zip(ts, ts[1:], strict=False))


def test_demo_plants_a_series_successor_pattern_that_beats_popularity(demo, tmp_path):
    path = demo.write_csv(demo.generate(users=300, items=200, seed=0), tmp_path / "demo.csv")
    catalogue = {it.item_id: it for it in demo.make_catalogue(200, seed=0)}
    inter = read_interactions(path)
    pairs = [(catalogue[a], catalogue[b]) for s in inter.items.values() for a, b in zip(s, s[1:], strict=False)]
    follows = sum(b.series == a.series and b.episode == a.episode + 1 for a, b in pairs) / len(pairs)
    assert follows > 0.45

    dm = StreamRecDataModule(str(path), batch_size=64)
    dm.setup("test")
    n = dm.num_items
    bigram = torch.zeros(n + 1, n + 1)  # a first-order Markov chain stands in for a sequential model
    for h in dm.splits.train.values():
        for a, b in zip(h, h[1:], strict=False):
            bigram[a, b] += 1
    popular, markov = RankingMetrics(ks=(10,)), RankingMetrics(ks=(10,))
    for batch in dm.test_dataloader():
        pop = most_popular_scores(dm.train_item_counts(), len(batch.targets))
        popular.update(pop, batch.targets, batch.seen)
        markov.update(bigram[batch.inputs[:, -1]] + pop / (n + 1), batch.targets, batch.seen)
    assert markov.compute()["hr@10"] > 1.5 * popular.compute()["hr@10"]


def test_demo_default_size_is_as_documented(demo):
    rows = demo.generate()
    assert 2000 * 20 <= len(rows) <= 2000 * 60
