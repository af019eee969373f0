"""Both programs' `--engine ray` against their local engines, on one local Ray instance: starting an instance and
its workers costs more CPU than the scoring itself, and a program reuses a running instance
(`core.runtime.ray_session.ray_instance`; that it stops the one it starts is its unit test's, with a fake Ray)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from streamrec import score, shards
from translate import infer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_running() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def _score(ckpt: Path, log: Path, out: Path, *extra: str) -> None:
    score.main(["--ckpt", str(ckpt), "--input", str(log), "--output", str(out), "--top-k", "5", *extra])


def _scored_rows(path: Path) -> dict[tuple[str, int], tuple[str, float]]:
    rows = pq.read_table(path).to_pylist()
    table = {(r["user_id"], r["rank"]): (r["item_id"], r["score"]) for r in rows}
    assert len(table) == len(rows)  # one row per user and rank
    return table


def test_streamrec_scoring_on_ray_equals_the_local_scorer(ray_running, tiny_ckpt, tiny_log, tmp_path):
    """Two replicas on small blocks score shard 1/2 as the local engine does (rows in any order)."""
    sharded, local = tmp_path / "ray-shard.parquet", tmp_path / "local-shard.parquet"
    _score(tiny_ckpt, tiny_log, sharded, "--engine", "ray", "--workers", "2", "--cpus-per-worker", "0.5",
           "--chunk-users", "20", "--shard", "1/2")
    _score(tiny_ckpt, tiny_log, local, "--shard", "1/2")
    got, want = _scored_rows(sharded), _scored_rows(local)
    assert got.keys() == want.keys()
    assert [got[k][0] for k in want] == [want[k][0] for k in want]
    assert [got[k][1] for k in want] == pytest.approx([want[k][1] for k in want], abs=1e-5)
    provenance = shards.read_provenance(sharded)
    assert provenance["shard"] == "1/2"
    assert provenance["checkpoint_sha256"] == shards.checkpoint_sha256(tiny_ckpt)
    assert not list(tmp_path.glob(".*"))  # Ray's parts folder is gone


def test_translation_on_ray_writes_the_local_engines_output(ray_running, demo_dir, train_tiny_checkpoint, tmp_path):
    ckpt, _ = train_tiny_checkpoint(demo_dir, tmp_path / "ckpt", 32, n_decoder_layers=1)
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:13]
    source = tmp_path / "src.en"
    source.write_text("\n".join([*lines[:5], "", *lines[5:]]) + "\n", encoding="utf-8")  # 14 lines, one blank
    local, ray_out = tmp_path / "local.de", tmp_path / "ray.de"
    common = ["--ckpt", str(ckpt), "-i", str(source), "--beam-size", "2", "--chunk-lines", "4"]
    infer.main([*common, "-o", str(local)])
    infer.main([*common, "-o", str(ray_out), "--engine", "ray", "--workers", "2"])
    assert ray_out.read_bytes() == local.read_bytes()
    assert len(local.read_text(encoding="utf-8").splitlines()) == 14
    with pytest.raises(SystemExit, match="--engine ray writes the translations only"):
        infer.main([*common, "-o", str(ray_out), "--engine", "ray", "--html", str(tmp_path / "a.html")])
