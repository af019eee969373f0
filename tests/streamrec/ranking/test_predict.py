"""`python -m streamrec predict`: the Parquet it writes equals batch scoring's, on one process and under DDP."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from streamrec import score
from streamrec.cli import main

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "streamrec" / "predict_demo.yaml"


def _predict(ckpt, log, out, *extra):
    main(["predict", "--config", str(CONFIG), "--data.path", str(log), "--data.max_len", "8",
          "--ckpt_path", str(ckpt), "--trainer.callbacks.output", str(out), "--trainer.enable_progress_bar", "false",
          "--trainer.accelerator", "cpu", *extra])


def _assert_same_rows(got, want):
    assert got.column_names == want.column_names == ["user_id", "rank", "item_id", "score"]
    for name in ("user_id", "rank", "item_id"):
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert got.column("score").to_pylist() == pytest.approx(want.column("score").to_pylist(), abs=1e-5)


@pytest.mark.parametrize("exclude_seen, item_chunk", [(True, None), (False, None), (True, 7)])
def test_predict_writes_what_batch_scoring_writes(exclude_seen, item_chunk, tiny_ckpt, tiny_log, tmp_path,
                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    chunk = [] if item_chunk is None else ["--trainer.callbacks.item_chunk", str(item_chunk)]
    _predict(tiny_ckpt, tiny_log, tmp_path / "predict.parquet", "--trainer.devices", "1",
             "--trainer.callbacks.exclude_seen", str(exclude_seen).lower(), *chunk)
    score.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--output", str(tmp_path / "score.parquet"),
                "--top-k", "10", "--exclude-seen" if exclude_seen else "--no-exclude-seen",
                *[arg.replace("--trainer.callbacks.item_chunk", "--item-chunk") for arg in chunk]])
    _assert_same_rows(pq.read_table(tmp_path / "predict.parquet"), pq.read_table(tmp_path / "score.parquet"))
    assert sorted(p.name for p in tmp_path.glob("predict.parquet*")) == ["predict.parquet"]  # no part, lock, tmp


@pytest.mark.slow
def test_ddp_predict_merges_the_ranks_parts_into_the_single_process_output(tiny_ckpt, tiny_log, tmp_path, monkeypatch):
    """Two ranks (ddp_fork: ddp_spawn without importing torch again; `ddp` would relaunch pytest) on 81 users:
    each writes its part, rank 0 merges them."""
    monkeypatch.chdir(tmp_path)
    _predict(tiny_ckpt, tiny_log, tmp_path / "one.parquet", "--trainer.devices", "1")
    _predict(tiny_ckpt, tiny_log, tmp_path / "ddp.parquet", "--trainer.devices", "2", "--trainer.strategy", "ddp_fork")
    _assert_same_rows(pq.read_table(tmp_path / "ddp.parquet"), pq.read_table(tmp_path / "one.parquet"))
    assert sorted(p.name for p in tmp_path.glob("ddp.parquet*")) == ["ddp.parquet"]  # the parts are gone


def test_unmerged_part_holds_the_user_order(tiny_ckpt, tiny_log, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _predict(tiny_ckpt, tiny_log, tmp_path / "recs.parquet", "--trainer.devices", "1",
             "--trainer.callbacks.merge", "false", "--trainer.callbacks.top_k", "2")
    assert not (tmp_path / "recs.parquet").exists()
    part = pq.read_table(tmp_path / "recs.parquet.rank0.parquet")
    assert part.column_names == ["user_id", "rank", "item_id", "score", "row"]
    assert part.column("rank").to_pylist() == [1, 2] * 81
    assert part.column("row").to_pylist() == [r for r in range(81) for _ in range(2)]


def test_missing_output_folder_is_one_line(exit_line, tiny_ckpt, tiny_log, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = exit_line(lambda argv: _predict(*argv), [tiny_ckpt, tiny_log, tmp_path / "nope" / "recs.parquet"])
    assert "the folder" in message and "nope" in message and "does not exist" in message
