"""Reading options (`ReadOptions`), each checked as a user would: a small hand-written log, the events it must give.

ISO-8601 times, delimiters and files without a header, MovieLens' ratings.dat, exact duplicates, a filter on one
column's values, rare items and the k-core (against a brute-force reference on random logs), and the options
kept in a checkpoint.
"""

from __future__ import annotations

import json
import logging
import random

import lightning as L
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch.cli import LightningCLI

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.ingest import parse
from streamrec.data.ingest.options import ColumnFilter
from streamrec.data.readers import ReadOptions, read_interactions, read_options_from_checkpoint, sniff_format
from streamrec.model.module import StreamRecModule

CSV = "user_id,item_id,timestamp\n"
MAY_1 = 1714521600.0  # 2024-05-01T00:00:00Z in Unix seconds


def events(inter) -> dict[str, list[tuple[str, float | None]]]:
    """user -> [(item, time)] in the order read."""
    times = inter.timestamps
    return {u: list(zip(inter.items[u], times[u] if times is not None else [None] * len(inter.items[u]),
                        strict=True)) for u in inter.items}


def one_line_error(call, *parts: str) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


# ----------------------------------------------------------------------------- ISO-8601 times


def test_iso_dates_and_times_with_and_without_zones_sort_by_the_instant(write):
    text = CSV + ("u1,a,2024-05-02T10:00:00Z\n"
                  "u1,b,2024-05-01\n"                      # a date: midnight UTC
                  "u1,c,2024-05-02T11:30:00+02:00\n"       # 09:30 UTC: before a
                  "u2,d,2024-05-01 00:00:01\n"             # no zone: UTC
                  "u2,e,2024-05-01T00:00:00.500Z\n")
    assert events(read_interactions(write("log.csv", text))) == {
        "u1": [("b", MAY_1), ("c", MAY_1 + 86400 + 9.5 * 3600), ("a", MAY_1 + 86400 + 10 * 3600)],
        "u2": [("e", MAY_1 + 0.5), ("d", MAY_1 + 1)]}


def test_iso_times_in_every_block_keep_one_clock(write, monkeypatch):
    # 64-byte blocks: some blocks hold only dates (arrow's zone-less cast), others zoned times, one a mix.
    monkeypatch.setattr(parse, "BLOCK", 64)
    rows = [("u1", "a", "2024-05-03"), ("u1", "b", "2024-05-01"), ("u2", "c", "2024-05-02"),
            ("u2", "d", "2024-05-01T23:00:00-02:00"), ("u1", "e", "2024-05-02T12:00:00Z"),
            ("u2", "f", "2024-05-02 00:30:00")]
    text = CSV + "".join(f"{u},{i},{t}\n" for u, i, t in rows)
    day, hour = 86400, 3600
    assert events(read_interactions(write("log.csv", text))) == {
        "u1": [("b", MAY_1), ("e", MAY_1 + day + 12 * hour), ("a", MAY_1 + 2 * day)],
        "u2": [("c", MAY_1 + day), ("f", MAY_1 + day + 0.5 * hour), ("d", MAY_1 + day + hour)]}


def test_a_malformed_iso_time_names_file_line_and_column(write):
    path = write("log.csv", CSV + "u1,a,2024-05-01\nu1,b,2024-05-02T10:00:00Z\n\nu2,c,2024-13-01\n")
    one_line_error(lambda: read_interactions(path), "log.csv line 5", "column 'timestamp'", "'2024-13-01'",
                   "ISO-8601")
    path = write("when.csv", CSV + "u1,a,1714521600\nu1,b,2024-05-02\n")  # numbers first: the file is numeric
    one_line_error(lambda: read_interactions(path), "when.csv line 3", "'2024-05-02'", "numeric")


def test_a_strptime_pattern_and_a_parquet_column_of_iso_text(write, tmp_path):
    path = write("log.csv", CSV + "u1,a,02/05/2024 10:00\nu1,b,01/05/2024 00:00\n")
    inter = read_interactions(path, options=ReadOptions(time_format="%d/%m/%Y %H:%M"))
    assert events(inter) == {"u1": [("b", MAY_1), ("a", MAY_1 + 86400 + 10 * 3600)]}
    one_line_error(lambda: read_interactions(path, options=ReadOptions(time_format="iso")), "line 2",
                   "'02/05/2024 10:00'")
    table = pa.table({"user_id": ["u1", "u1"], "item_id": ["a", "b"], "timestamp": ["2024-05-02", "2024-05-01"]})
    pq.write_table(table, tmp_path / "log.parquet")
    assert events(read_interactions(tmp_path / "log.parquet")) == {"u1": [("b", MAY_1), ("a", MAY_1 + 86400)]}
    pq.write_table(table.set_column(2, "timestamp", pa.array(["2024-05-02", "soon"])), tmp_path / "bad.parquet")
    one_line_error(lambda: read_interactions(tmp_path / "bad.parquet"), "bad.parquet row 2", "'timestamp'", "'soon'")


# ----------------------------------------------------------------------------- delimiters and headers

EXPECTED = {"u1": [("b", 1.0), ("a", 3.0)], "u2": [("c", 2.0)]}


@pytest.mark.parametrize("delimiter", [";", "\t", ",", "|", "tab"])
def test_each_delimiter_reads_the_same_log(write, delimiter):
    sep = "\t" if delimiter == "tab" else delimiter
    text = sep.join(["user_id", "item_id", "timestamp"]) + "\n" + "".join(
        sep.join(row) + "\n" for row in (["u1", "a", "3"], ["u2", "c", "2"], ["u1", "b", "1"]))
    assert events(read_interactions(write("log.csv", text), options=ReadOptions(delimiter=delimiter))) == EXPECTED


def test_a_semicolon_file_read_with_the_defaults_says_to_set_the_delimiter(write):
    text = "user_id;item_id;timestamp\nu1;a;3\nu2;c;2\n"
    for name in ("log.csv", "log.txt"):
        one_line_error(lambda n=name: read_interactions(write(n, text)), name, "';'", "delimiter=';'",
                       "--data.delimiter ';'")
    one_line_error(lambda: read_interactions(write("forced.csv", text), format="csv"), "no column 'user_id'",
                   "delimiter=';'")


def test_a_file_without_header_by_names_or_by_positions(write):
    path = write("log.csv", "u1,a,3\nu2,c,2\nu1,b,1\n")
    by_names = ReadOptions(header=False, columns=("user_id", "item_id", "timestamp"))
    assert events(read_interactions(path, options=by_names)) == EXPECTED
    by_positions = ReadOptions(header=False, user_col="0", item_col="1", time_col="2")
    assert events(read_interactions(path, options=by_positions)) == EXPECTED
    one_line_error(lambda: read_interactions(path), "no column 'user_id'", "header=false")
    one_line_error(lambda: read_interactions(path, options=ReadOptions(header=False)), "no column 'user_id'",
                   "positions 0, 1")
    one_line_error(lambda: read_interactions(write("short.csv", "u1,a,3\nu2,c\n"), options=by_positions),
                   "short.csv line 2", "2 fields but line 1 has 3")


# ----------------------------------------------------------------------------- MovieLens ratings.dat

RATINGS = ("1::1193::5::978300760\n1::661::3::978302109\n2::1357::5::978298709\n"
           "2::3068::4::978299000\n1::914::3::978301968\n")
ML_EXPECTED = {"1": [("1193", 978300760.0), ("914", 978301968.0), ("661", 978302109.0)],
               "2": [("1357", 978298709.0), ("3068", 978299000.0)]}


def test_movielens_ratings_dat_by_its_shape_or_by_format(write):
    assert events(read_interactions(write("ratings.dat", RATINGS))) == ML_EXPECTED
    assert events(read_interactions(write("ml.txt", RATINGS), format="movielens")) == ML_EXPECTED
    liked = read_interactions(write("ratings.dat", RATINGS), options=ReadOptions(filter="rating >= 4"))
    assert events(liked) == {"1": [("1193", 978300760.0)], "2": [("1357", 978298709.0), ("3068", 978299000.0)]}


def test_a_malformed_movielens_line_names_its_line(write):
    for bad in ("3::5::4", "3:5:4:1:2:3:4"):
        path = write("ratings.dat", RATINGS + bad + "\n")
        one_line_error(lambda p=path: read_interactions(p, format="movielens"), "ratings.dat line 6",
                       "'user::item::rating::timestamp'")


# ----------------------------------------------------------------------------- duplicates

DUPLICATED = CSV + "u1,a,1\nu1,a,1\nu1,b,1\nu1,a,2\nu2,a,1\nu1,b,1\n"


def test_exact_duplicates_kept_dropped_or_refused_and_always_counted(write, caplog):
    path = write("log.csv", DUPLICATED)
    with caplog.at_level(logging.INFO, logger="streamrec"):
        kept = read_interactions(path)
    assert "2 exact duplicate events (same user, item and time), kept" in caplog.text
    assert events(kept)["u1"] == [("a", 1.0), ("a", 1.0), ("b", 1.0), ("b", 1.0), ("a", 2.0)]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="streamrec"):
        dropped = read_interactions(path, options=ReadOptions(duplicates="drop"))
    assert "2 exact duplicate events (same user, item and time), dropped" in caplog.text
    assert events(dropped) == {"u1": [("a", 1.0), ("b", 1.0), ("a", 2.0)], "u2": [("a", 1.0)]}
    one_line_error(lambda: read_interactions(path, options=ReadOptions(duplicates="error")), "log.csv",
                   "2 exact duplicate events", "user 'u1', item 'a' at time 1", "duplicates: keep or drop")
    untimed = ReadOptions(time_col=None, duplicates="drop")  # without times: the same item twice in a row
    assert read_interactions(path, options=untimed).items == {"u1": ["a", "b", "a", "b"], "u2": ["a"]}


# ----------------------------------------------------------------------------- a filter on one column

LOG = ("user_id,item_id,timestamp,rating,event_type\n"
       "u1,a,1,5,view\nu1,b,2,2,click\nu1,c,3,4,buy\nu2,a,1,3.5,buy\nu2,d,2,4.0,click\n")


@pytest.mark.parametrize(("rule", "expected"), [
    ("rating >= 4", {"u1": ["a", "c"], "u2": ["d"]}),
    ("rating < 4", {"u1": ["b"], "u2": ["a"]}),
    ("rating == 4", {"u1": ["c"], "u2": ["d"]}),
    ("event_type in [view, buy]", {"u1": ["a", "c"], "u2": ["a"]}),
    ("event_type not in [view, buy]", {"u1": ["b"], "u2": ["d"]}),
    ("event_type != click", {"u1": ["a", "c"], "u2": ["a"]}),
    ("event_type == buy", {"u1": ["c"], "u2": ["a"]}),
])
def test_a_column_filter_keeps_the_events_that_pass(write, tmp_path, rule, expected):
    path = write("log.csv", LOG)
    assert read_interactions(path, options=ReadOptions(filter=rule)).items == expected
    rows = [line.split(",") for line in LOG.splitlines()[1:]]
    pq.write_table(pa.table({"user_id": [r[0] for r in rows], "item_id": [r[1] for r in rows],
                             "timestamp": [int(r[2]) for r in rows], "rating": [float(r[3]) for r in rows],
                             "event_type": [r[4] for r in rows]}), tmp_path / "log.parquet")
    assert read_interactions(tmp_path / "log.parquet", options=ReadOptions(filter=rule)).items == expected


def test_filter_mistakes_are_one_line_errors(write):
    path = write("log.csv", LOG + "u3,e,4,good,view\n")
    one_line_error(lambda: read_interactions(path, options=ReadOptions(filter="rating >= 4")), "log.csv line 7",
                   "column 'rating'", "'good' is not a number")
    one_line_error(lambda: read_interactions(path, options=ReadOptions(filter="score >= 4")), "no column 'score'")
    one_line_error(lambda: read_interactions(path, options=ReadOptions(filter="event_type == none")),
                   "no event passes the filter event_type == none")
    one_line_error(lambda: ReadOptions(filter="rating ~ 4"), "expected 'column op value'")
    one_line_error(lambda: ReadOptions(filter="event_type >= buy"), "needs a number")


def test_filter_text_parses_to_typed_rules():
    assert ColumnFilter.parse("rating >= 4") == ColumnFilter("rating", ">=", 4.0)
    assert ColumnFilter.parse(" event_type in [view, 'buy'] ") == ColumnFilter("event_type", "in", ("view", "buy"))
    assert ColumnFilter.parse("kind not in [a]") == ColumnFilter("kind", "not in", ("a",))
    assert str(ColumnFilter.parse("rating>=4")) == "rating >= 4"


# ----------------------------------------------------------------------------- rare items and the k-core


def brute_force(rows: list[tuple[str, str, int]], min_user: int, min_item: int, iterate: bool) -> dict:
    """user -> items (stably by time) of the rows left by counting and dropping, once or until nothing changes."""
    while True:
        users, items = {}, {}
        for u, i, _ in rows:
            users[u] = users.get(u, 0) + 1
            items[i] = items.get(i, 0) + 1
        kept = [r for r in rows if users[r[0]] >= min_user and items[r[1]] >= min_item]
        if not iterate or len(kept) == len(rows):
            rows = kept
            break
        rows = kept
    out: dict[str, list[tuple[int, str]]] = {}
    for u, i, t in rows:
        out.setdefault(u, []).append((t, i))
    return {u: [i for _, i in sorted(ev, key=lambda e: e[0])] for u, ev in out.items()}


@pytest.mark.parametrize("seed", range(6))
def test_k_core_and_min_item_count_equal_a_brute_force_reference(write, seed):
    rng = random.Random(seed)
    rows = [(f"u{rng.randint(0, 14)}", f"i{int(rng.paretovariate(1.2)) % 25}", rng.randint(0, 9)) for _ in range(150)]
    path = write("log.csv", CSV + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    k = rng.choice([2, 3, 4])
    assert read_interactions(path, options=ReadOptions(k_core=k)).items == brute_force(rows, k, k, iterate=True)
    inter = read_interactions(path, options=ReadOptions(min_item_count=k))
    assert inter.items == brute_force(rows, 1, k, iterate=False)
    core = read_interactions(path, options=ReadOptions(k_core=k))
    assert all(n >= k for n in core.lengths) and min(
        sum(i == item for s in core.items.values() for i in s) for item in {i for s in core.items.values() for i in s}
    ) >= k


def test_a_k_core_that_leaves_nothing_says_so(write):
    path = write("log.csv", CSV + "u1,a,1\nu2,b,1\n")
    one_line_error(lambda: read_interactions(path, options=ReadOptions(k_core=2)), "no interactions are left",
                   "k_core")


# ----------------------------------------------------------------------------- the options object


def test_options_are_checked_when_built():
    one_line_error(lambda: ReadOptions(delimiter="::"), "`delimiter` must be one character")
    one_line_error(lambda: ReadOptions(columns=("a", "b")), "header: false")
    one_line_error(lambda: ReadOptions(time_format="yyyy-mm-dd"), "`time_format`")
    one_line_error(lambda: ReadOptions(duplicates="merge"), "`duplicates` must be keep, drop or error")
    one_line_error(lambda: ReadOptions(k_core=0), "`k_core` must be at least 1")
    one_line_error(lambda: ReadOptions(format="parquet", delimiter=";"), "applies to csv/tsv")


def test_options_round_trip_as_plain_values():
    options = ReadOptions(format="csv", delimiter=";", header=False, columns=("who", "what", "when", "stars"),
                          user_col="who", item_col="what", time_col="when", time_format="iso",
                          filter="stars in [4, 5]", duplicates="drop", min_item_count=3, k_core=5)
    plain = json.loads(json.dumps(options.to_dict()))
    assert ReadOptions.from_dict(plain) == options
    assert plain["filter"] == {"column": "stars", "op": "in", "value": [4.0, 5.0]}
    assert options.for_new_logs() == ReadOptions.from_dict({**plain, "min_item_count": 1, "k_core": None})
    one_line_error(lambda: ReadOptions.from_dict({**plain, "sheet": 1}), "unknown key(s) sheet")


def test_read_options_from_an_old_checkpoint_use_its_datamodule_settings():
    old = {"datamodule_hyper_parameters": {"path": "x.csv", "format": "tsv", "user_col": "who", "batch_size": 4}}
    assert read_options_from_checkpoint(old) == ReadOptions(format="tsv", user_col="who")
    assert read_options_from_checkpoint({}) == ReadOptions()


# ----------------------------------------------------------------------------- the DataModule and checkpoints


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
def test_the_options_as_command_line_flags(write, monkeypatch):
    path = write("log.txt", "u1;a;2024-05-02;5\nu1;b;2024-05-01;4\nu2;c;2024-05-01;1\nu2;a;2024-05-03;5\n")
    monkeypatch.setattr("sys.argv", ["streamrec"])
    args = ["--data.path", str(path), "--data.delimiter", ";", "--data.header", "false",
            "--data.columns", "[who, what, when, stars]", "--data.user_col", "who", "--data.item_col", "what",
            "--data.time_col", "when", "--data.time_format", "iso", "--data.filter", "stars >= 4",
            "--data.duplicates", "drop", "--data.min_item_count", "1", "--data.k_core", "1",
            "--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    cli = _LinkingCLI(_NeedsNumItems, StreamRecDataModule, run=False, args=args, seed_everything_default=False)
    assert cli.datamodule.read_options == ReadOptions(
        delimiter=";", header=False, columns=("who", "what", "when", "stars"), user_col="who", item_col="what",
        time_col="when", time_format="iso", filter="stars >= 4", duplicates="drop", k_core=1)
    assert cli.model.items.num_embeddings == 2 + 1  # a and b: c's only event has 1 star
    assert cli.datamodule.vocab.items == ["a", "b"]
    assert read_interactions(path, options=cli.datamodule.read_options).items == {"u1": ["b", "a"], "u2": ["a"]}


def test_a_fit_on_a_log_with_custom_columns_keeps_them_in_the_checkpoint(write, tmp_path):
    rows = "".join(f"u{k % 5}|i{k % 7}|2024-05-{1 + k % 28:02d}\n" for k in range(60))
    path = write("log.psv", "who|what|when\n" + rows)
    data = StreamRecDataModule(str(path), delimiter="|", user_col="who", item_col="what", time_col="when",
                               max_len=8, batch_size=8, duplicates="drop")
    model = StreamRecModule(data.num_items, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=8)
    trainer = L.Trainer(max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, data)
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    checkpoint = torch.load(tmp_path / "model.ckpt", map_location="cpu", weights_only=False)
    options = read_options_from_checkpoint(checkpoint)
    assert (options.delimiter, options.user_col, options.item_col, options.time_col) == ("|", "who", "what", "when")
    assert options == data.read_options and options.duplicates == "drop"
    again = read_interactions(path, options=options.for_new_logs())  # a new log read the way training read it
    assert again.items == read_interactions(path, options=data.read_options).items


def test_movielens_and_other_delimiters_are_told_apart_by_their_content(write):
    assert sniff_format(write("a.x", RATINGS)) == "movielens"
    assert sniff_format(write("b.x", "user_id;item_id\nu;a\n")) is None  # ';' is not assumed: the reader says so


def test_the_encoded_cache_tells_reading_options_apart(write, tmp_path):
    path = write("log.csv", LOG)
    cache = str(tmp_path / "cache")
    liked = StreamRecDataModule(str(path), cache_dir=cache, filter="rating >= 4", min_interactions=1)
    every = StreamRecDataModule(str(path), cache_dir=cache, min_interactions=1)
    assert liked.vocab.items == ["a", "c", "d"] and every.vocab.items == ["a", "b", "c", "d"]
    again = StreamRecDataModule(str(path), cache_dir=cache, filter="rating >= 4", min_interactions=1)
    assert again.vocab.items == ["a", "c", "d"]
