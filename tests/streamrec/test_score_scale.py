"""Scoring at scale: chunked ranking in the CLI, shards and their merge, provenance, the Ray engine."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from core.runtime.errors import InputError
from core.runtime.precision import cpu_has_fast_bf16
from streamrec import score, shards
from streamrec.ray_engine import RayOptions, ray_instance

item_table = score.item_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows(path):
    """The output as a set of (user, rank, item) rows."""
    return {(r["user_id"], r["rank"], r["item_id"]) for r in pq.read_table(path).to_pylist()}


def _assert_same_rows(a, b):
    """The same rows in any order (one per user and rank), scores equal to float rounding."""
    ta, tb = pq.read_table(a).to_pylist(), pq.read_table(b).to_pylist()
    assert len(ta) == len(tb) and _rows(a) == _rows(b)
    scores = {(r["user_id"], r["rank"]): r["score"] for r in tb}
    assert [r["score"] for r in ta] == pytest.approx([scores[r["user_id"], r["rank"]] for r in ta], abs=1e-5)


def _score(ckpt, log, out, *extra):
    score.main(["--ckpt", str(ckpt), "--input", str(log), "--output", str(out), "--top-k", "5", *extra])


@pytest.fixture(scope="module")
def whole(tiny_ckpt, tiny_log, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "recs.parquet"
    _score(tiny_ckpt, tiny_log, out, "--precision", "fp32")
    return out


def test_shard_of_is_a_stable_partition():
    users = [f"u{i:05d}" for i in range(2000)]
    parts = [shards.shard_users(users, (i, 7)) for i in range(7)]
    assert sorted(u for p in parts for u in p) == users  # disjoint and covering
    assert min(map(len, parts)) > 200  # spread, not all in one shard
    # The same assignment in a fresh interpreter with another hash seed: not Python's salted hash().
    code = "from streamrec.shards import shard_of; print([shard_of(f'u{i:05d}', 7) for i in range(50)])"
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == [shards.shard_of(f"u{i:05d}", 7) for i in range(50)]


@pytest.mark.parametrize("text", ["3/3", "1", "a/4", "-1/4", "2/0"])
def test_bad_shard_is_one_line(text):
    with pytest.raises(InputError, match=r"write I/N with 0 <= I < N"):
        shards.parse_shard(text)


def test_small_item_chunks_give_the_same_rows_and_provenance(tiny_ckpt, tiny_log, whole, tmp_path):
    out = tmp_path / "chunked.parquet"
    _score(tiny_ckpt, tiny_log, out, "--item-chunk", "7")  # 40 items: chunks that do not divide N
    _assert_same_rows(out, whole)
    prov = shards.read_provenance(out)
    assert prov["checkpoint_sha256"] == shards.checkpoint_sha256(tiny_ckpt) and len(prov["checkpoint_sha256"]) == 64
    assert prov["top_k"] == 5 and prov["exclude_seen"] is True and prov["shard"] is None
    assert prov["created"] and prov["version"]


def test_bf16_precision_is_recorded_and_gives_the_fp32_rows(tiny_ckpt, tiny_log, whole, tmp_path):
    out = tmp_path / "bf16.parquet"
    _score(tiny_ckpt, tiny_log, out, "--precision", "bf16")  # exact: fp32 re-scoring
    _assert_same_rows(out, whole)
    assert shards.read_provenance(out)["precision"] == "bf16" and shards.read_provenance(whole)["precision"] == "fp32"


def test_the_default_precision_is_bf16_where_bf16_is_fast_and_gives_the_fp32_rows(tiny_ckpt, tiny_log, whole,
                                                                                   tmp_path):
    out = tmp_path / "default.parquet"
    _score(tiny_ckpt, tiny_log, out)
    _assert_same_rows(out, whole)
    assert shards.read_provenance(out)["precision"] == ("bf16" if cpu_has_fast_bf16() else "fp32")
    assert score.scan_precision("auto", "cuda") == "fp32" and score.scan_precision("bf16", "cuda") == "bf16"


def _brute_force_rows(ckpt, log, k):
    """Every user's top-k the plain way: in-memory model, dict vocabulary, full score matrix, stable sort."""
    import torch

    from streamrec.api import Recommender
    from streamrec.data.readers import read_interactions

    rec = Recommender.load(ckpt)
    items = rec.vocab.to_dict()["items"]
    index = {item: n + 1 for n, item in enumerate(items)}
    rows = set()
    t = rec.model.max_len
    for user, history in read_interactions(log).items.items():
        ids = [index[i] for i in history if i in index]
        x = torch.tensor([[0] * (t - len(ids[-t:])) + ids[-t:]])  # (1, T) left-padded
        with torch.no_grad():
            full = rec.model.score(rec.model.last_hidden(x))[0].tolist()
        ranked = sorted((i for i in range(1, len(full)) if i not in ids), key=lambda i: (-full[i], i))
        rows |= {(user, rank + 1, items[i - 1]) for rank, i in enumerate(ranked[:k])}
    return rows


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_cli_reads_the_item_table_from_the_checkpoint_file_and_ranks_as_brute_force(
        tiny_ckpt, tiny_log, tmp_path, monkeypatch, precision):
    import torch

    from streamrec.ranking.topk import FileRows

    built = []
    monkeypatch.setattr(score, "item_table", lambda *a: built.append(item_table(*a)) or built[-1])
    out = tmp_path / "recs.parquet"
    _score(tiny_ckpt, tiny_log, out, "--precision", precision, "--item-chunk", "7")
    assert _rows(out) == _brute_force_rows(tiny_ckpt, tiny_log, 5)
    (vectors, scan), = built
    if os.path.exists("/proc/self/maps"):  # Linux: the rows are read from the file, never mapped whole
        assert isinstance(vectors, FileRows) and vectors.path == tiny_ckpt
    model_table = score.Recommender.load(tiny_ckpt).model.item_vectors
    assert torch.equal(vectors[0 : model_table.shape[0]], model_table)
    if precision == "bf16":
        assert torch.equal(scan.values, model_table.bfloat16()) and torch.allclose(scan.norms, model_table.norm(dim=1))
    else:
        assert scan is None


def test_shards_merge_to_the_unsharded_output(tiny_ckpt, tiny_log, whole, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    for i in range(3):
        _score(tiny_ckpt, tiny_log, folder / f"part-{i}.parquet", "--shard", f"{i}/3")
        assert shards.read_provenance(folder / f"part-{i}.parquet")["shard"] == f"{i}/3"
    users = [set(pq.read_table(folder / f"part-{i}.parquet").column("user_id").to_pylist()) for i in range(3)]
    assert not (users[0] & users[1]) and not (users[1] & users[2]) and all(users)
    merged = tmp_path / "merged.parquet"
    shards.main(["merge", str(folder), "--output", str(merged)])
    _assert_same_rows(merged, whole)
    assert shards.read_provenance(merged)["merged_shards"] == 3


def _merge_error(folder):
    with pytest.raises(SystemExit) as exit_:
        shards.main(["merge", str(folder), "--output", str(folder.parent / "m.parquet")])
    assert not list(folder.parent.glob("*m.parquet*"))  # nothing written, no temporary left
    err = str(exit_.value.code)
    assert "\n" not in err
    return err


def test_merge_refuses_missing_mixed_and_duplicated_shards(tiny_ckpt, tiny_log, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    for i in (0, 2):
        _score(tiny_ckpt, tiny_log, folder / f"p{i}.parquet", "--shard", f"{i}/4")
    assert "missing shards 1, 3 of 4" in _merge_error(folder)
    _score(tiny_ckpt, tiny_log, folder / "p1.parquet", "--shard", "1/4")
    _score(tiny_ckpt, tiny_log, folder / "p3.parquet", "--shard", "3/4", "--top-k", "3")
    assert "top_k is 3 but p0.parquet has 5" in _merge_error(folder)
    _score(tiny_ckpt, tiny_log, folder / "p3.parquet", "--shard", "3/4")
    (folder / "again.parquet").write_bytes((folder / "p1.parquet").read_bytes())
    assert "shard 1/4 twice: again.parquet and p1.parquet" in _merge_error(folder)
    (folder / "again.parquet").unlink()
    table = pq.read_table(folder / "p3.parquet")
    other = pq.read_table(folder / "p0.parquet")
    pq.write_table(pa.concat_tables([table, other]), folder / "p3.parquet")  # p0's users twice
    assert "is in both p0.parquet and p3.parquet" in _merge_error(folder)
    moved = other.column("user_id")[0].as_py()
    keep = pc.not_equal(other.column("user_id"), moved)
    pq.write_table(other.filter(keep), folder / "p0.parquet")  # one of p0's users moved to p3
    pq.write_table(pa.concat_tables([table, other.filter(pc.invert(keep))]), folder / "p3.parquet")
    assert f"p3.parquet: user '{moved}' belongs to shard 0/4, not 3/4" in _merge_error(folder)


def test_merge_refuses_another_checkpoint(tiny_ckpt, tiny_log, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    other = tmp_path / "other.ckpt"
    other.write_bytes(tiny_ckpt.read_bytes())
    _score(tiny_ckpt, tiny_log, folder / "a.parquet", "--shard", "0/2")
    _score(other, tiny_log, folder / "b.parquet", "--shard", "1/2")  # same bytes: same sha256, merge accepted
    shards.main(["merge", str(folder), "--output", str(tmp_path / "ok.parquet")])
    import torch

    state = torch.load(other, weights_only=True)
    state["epoch"] = 99
    torch.save(state, other)
    _score(other, tiny_log, folder / "b.parquet", "--shard", "1/2", "--fresh")
    err = _merge_error(folder)
    assert err.startswith("error: b.parquet: checkpoint_sha256 is") and "a.parquet has" in err


class _FakeRay:
    """What `ray_instance` calls of `ray`, recorded."""

    def __init__(self, running: bool):
        self.running, self.calls = running, []

    def is_initialized(self) -> bool:
        return self.running

    def init(self, **kwargs) -> None:
        self.calls.append(("init", kwargs))
        self.running = True

    def shutdown(self) -> None:
        self.calls.append(("shutdown", {}))
        self.running = False


@pytest.mark.parametrize("address", [None, "ray://head:10001"])
def test_ray_instance_starts_and_stops_its_own_only(address):
    """A running instance (the user's) is used and left running; otherwise one is started with the CPUs the
    replicas reserve plus one for the driver (a cluster's address: joined, with its own CPUs) and shut down,
    also when the work fails."""
    options = RayOptions(workers=3, cpus_per_worker=0.5, address=address)
    users = _FakeRay(running=True)
    with ray_instance(users, options):
        pass
    assert users.calls == [] and users.running
    own = _FakeRay(running=False)
    with pytest.raises(RuntimeError, match="boom"), ray_instance(own, options):
        raise RuntimeError("boom")
    (init, kwargs), (shutdown, _) = own.calls
    assert (init, shutdown) == ("init", "shutdown") and kwargs["address"] == address and not own.running
    assert kwargs.get("num_cpus") == (None if address else 3)  # ceil(3 x 0.5) + 1


@pytest.mark.parametrize("argv", [["-h"], ["merge", "-h"]])
def test_shards_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        shards.main(argv)
    assert exit_.value.code == 0 and "usage: python -m streamrec.shards" in capsys.readouterr().out


def test_score_help_lists_the_scale_options(capsys):
    with pytest.raises(SystemExit):
        score.main(["--help"])
    out = capsys.readouterr().out
    for option in ("--item-chunk", "--shard", "--engine", "--workers", "--precision", "streamrec.shards merge"):
        assert option in out
