"""A model trained on a log with its own column names (and numeric item ids, like Amazon Beauty's) scores and
explains logs written the same way with no reading flag; integer ids are their string form; cold users are
named, or get the most popular items."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from streamrec import Recommender, explain, score

COLUMNS = ("user", "item", "ts")


def _own_columns(source: Path, target: Path) -> Path:
    """`source` (user_id,item_id,timestamp; items v0010) as 'user;item;ts' with numeric items (10)."""
    with source.open() as f:
        rows = list(csv.DictReader(f))
    with target.open("w", newline="") as f:
        writer = csv.writer(f, delimiter=";")
        writer.writerow(COLUMNS)
        writer.writerows((r["user_id"], int(r["item_id"][1:]), r["timestamp"]) for r in rows)
    return target


@pytest.fixture(scope="module")
def events(tiny_log, tmp_path_factory) -> Path:
    return _own_columns(tiny_log, tmp_path_factory.mktemp("own") / "events.csv")


@pytest.fixture(scope="module")
def ckpt(events) -> Path:
    """What `python -m streamrec fit --data.user_col user --data.item_col item --data.time_col ts
    --data.delimiter ';'` writes (one epoch)."""
    import lightning as L

    from streamrec.data.datamodule import StreamRecDataModule
    from streamrec.model.module import StreamRecModule

    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(events), max_len=8, batch_size=32, user_col="user", item_col="item",
                               time_col="ts", delimiter=";")
    module = StreamRecModule(num_items=data.num_items, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, data)
    path = events.parent / "own.ckpt"
    trainer.save_checkpoint(path)
    return path


def _users(path: Path) -> list[str]:
    return list(dict.fromkeys(pq.read_table(path).column("user_id").to_pylist()))


def test_score_reads_the_log_as_training_read_it(ckpt, events, tmp_path):
    out = tmp_path / "recs.parquet"
    score.main(["--ckpt", str(ckpt), "--input", str(events), "--output", str(out), "--top-k", "3"])
    log = Recommender.load(ckpt).read_log(events)
    assert _users(out) == list(log.items)
    assert not (tmp_path / "recs.parquet.skipped.txt").exists()  # nobody skipped, so no list


def test_reading_flags_override_the_checkpoints(ckpt, events, tmp_path):
    renamed = tmp_path / "renamed.csv"
    renamed.write_text(events.read_text().replace("user;item;ts", "uid,iid,ts").replace(";", ","))
    out = tmp_path / "recs.csv"
    score.main(["--ckpt", str(ckpt), "--input", str(renamed), "--output", str(out), "--top-k", "2",
                "--user-col", "uid", "--item-col", "iid", "--delimiter", ","])
    assert len(out.read_text().splitlines()) == 1 + 2 * len(Recommender.load(ckpt).read_log(events).items)
    rec = Recommender.load(ckpt)
    assert rec.read_log(renamed, user_col="uid", item_col="iid", delimiter=",").items == rec.read_log(events).items


def test_explain_reads_the_log_as_training_read_it(ckpt, events, tmp_path, capsys):
    user = next(iter(Recommender.load(ckpt).read_log(events).items))
    page = tmp_path / "why.html"
    explain.main(["--ckpt", str(ckpt), "--input", str(events), "--user", user, "--html", str(page), "--top-k", "2"])
    assert f"recommendations for user {user}" in capsys.readouterr().out
    assert page.is_file()


def test_integer_ids_are_their_string_form(ckpt, events):
    rec = Recommender.load(ckpt)
    history = next(iter(rec.read_log(events).items.values()))  # numeric strings: "10", "12", ...
    as_ints = rec.recommend([[int(i) for i in history]], top_k=3)
    assert as_ints.items == rec.recommend([history], top_k=3).items
    assert as_ints[0] and not as_ints.cold
    assert rec.similar_items([int(history[0])], top_k=2).items == rec.similar_items([history[0]], top_k=2).items


@pytest.mark.parametrize("bad", [[1.5], [True], [None]])
def test_other_id_types_are_refused_in_one_line(ckpt, bad):
    with pytest.raises(ValueError, match=r"^`histories\[0\]\[0\]` must be an item id \(a string or an integer\)"):
        Recommender.load(ckpt).recommend([bad])


def _with_cold_users(events: Path, tmp_path: Path) -> Path:
    """`events` plus two users whose every item is unknown to the checkpoint."""
    path = tmp_path / "with_cold.csv"
    path.write_text(events.read_text() + "newbie;99999;1800000000\nnewbie;99998;1800000001\nghost;99997;1800000002\n")
    return path


def test_cold_users_are_named_beside_the_output(ckpt, events, tmp_path, caplog):
    out = tmp_path / "recs.parquet"
    with caplog.at_level(logging.WARNING):
        score.main(["--ckpt", str(ckpt), "--input", str(_with_cold_users(events, tmp_path)), "--output", str(out)])
    assert (tmp_path / "recs.parquet.skipped.txt").read_text() == "newbie\nghost\n"
    assert "'newbie', 'ghost'" in caplog.text and "recs.parquet.skipped.txt" in caplog.text
    assert not {"newbie", "ghost"} & set(_users(out))


def test_cold_users_popular_gives_them_the_logs_most_popular_items(ckpt, events, tmp_path):
    log = _with_cold_users(events, tmp_path)
    out = tmp_path / "recs.parquet"
    users = tmp_path / "users.txt"
    users.write_text("newbie\nnobody\n")  # nobody is not in the log at all: cold too
    score.main(["--ckpt", str(ckpt), "--input", str(log), "--output", str(out), "--top-k", "3", "--users",
                str(users), "--cold-users", "popular"])
    rows = pq.read_table(out).to_pylist()
    counts: dict[str, int] = {}
    for history in Recommender.load(ckpt).read_log(events).items.values():
        for item in history:
            counts[item] = counts.get(item, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    for user in ("newbie", "nobody"):
        mine = [(r["item_id"], r["score"]) for r in rows if r["user_id"] == user]
        assert [s for _, s in mine] == [float(c) for _, c in top]  # ties may order items either way
        assert {i for i, _ in mine} <= {i for i, c in counts.items() if c >= top[-1][1]}
    assert not (tmp_path / "recs.parquet.skipped.txt").exists()


def test_an_export_folder_reads_new_logs_as_its_checkpoint_did(ckpt, events, tmp_path):
    from streamrec.export import export_safetensors

    folder = export_safetensors(ckpt, tmp_path / "export")
    from_folder = Recommender.load(folder).read_log(events)
    from_ckpt = Recommender.load(ckpt).read_log(events)
    assert from_folder.items == from_ckpt.items and len(from_folder.items) > 0
