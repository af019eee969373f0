"""`translate.infer` scaled out: shards that together translate every line once and merge back into the
single-process output, and a run that continues after an interruption (the Ray engine: tests/test_ray_engines.py)."""

from __future__ import annotations

import itertools
import json
import random
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.runtime.errors import InputError, Interrupted
from translate import infer, shards
from translate.shards import shard_runs

CHUNK = "4"


@pytest.fixture(scope="module")
def trained(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("scale_ckpt")
    path, _ = train_tiny_checkpoint(demo_dir, out, 32, n_decoder_layers=1)
    src = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:13]
    source = out / "src.en"
    source.write_text("\n".join([*src[:5], "", *src[5:]]) + "\n", encoding="utf-8")  # 14 lines, one blank
    whole = out / "whole.de"
    infer.main(_args(path, source, whole))
    return SimpleNamespace(ckpt=path, src=source, whole=whole.read_bytes())


def _args(ckpt: Path, src: Path, out: Path, *more: str) -> list[str]:
    return ["--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "--beam-size", "2", "--chunk-lines", CHUNK, *more]


def _naive_shard(n_lines: int, block: int, shard: tuple[int, int]) -> list[int]:
    return [n for n in range(1, n_lines + 1) if (n - 1) // block % shard[1] == shard[0]]


@pytest.mark.parametrize("seed", range(4))
def test_shard_runs_are_the_shards_lines_in_order_whatever_the_chunks(seed):
    rng = random.Random(seed)
    n_lines, block = rng.randint(0, 60), rng.randint(1, 7)
    lines = [f"line {n}" for n in range(1, n_lines + 1)]
    cuts = sorted(rng.sample(range(1, n_lines), min(n_lines - 1, rng.randint(0, 8)))) if n_lines > 1 else []
    chunks = [lines[a:b] for a, b in itertools.pairwise([0, *cuts, n_lines])] if n_lines else []
    n_shards = rng.randint(1, 4)
    for index in range(n_shards):
        want = _naive_shard(n_lines, block, (index, n_shards))
        for skip in (0, len(want) // 2):
            runs = list(shard_runs(chunks, block, (index, n_shards), skip))
            got = [first + k for first, run in runs for k in range(len(run))]
            assert got == want[skip:]
            assert all(line == f"line {first + k}" for first, run in runs for k, line in enumerate(run))
    assert [line for _, run in shard_runs(chunks, block, None, 3) for line in run] == lines[3:]


def test_shards_merge_into_the_single_process_output(trained, tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    for index in range(3):
        infer.main(_args(trained.ckpt, trained.src, parts / f"part-{index}.de", "--shard", f"{index}/3"))
    records = [json.loads((parts / f"part-{i}.de.shard.json").read_text()) for i in range(3)]
    assert [r["shard"] for r in records] == ["0/3", "1/3", "2/3"] and {r["input_lines"] for r in records} == {14}
    # 14 lines in blocks of 4: shard 0 holds lines 1-4 and 13-14, shard 1 lines 5-8, shard 2 lines 9-12
    assert [len((parts / f"part-{i}.de").read_bytes().splitlines()) for i in range(3)] == [6, 4, 4]
    shards.main(["merge", str(parts), "--output", str(tmp_path / "merged.de")])
    assert (tmp_path / "merged.de").read_bytes() == trained.whole


def _parts(tmp_path: Path, trained, n: int) -> Path:
    parts = tmp_path / "parts"
    parts.mkdir()
    for index in range(n):  # parts made by hand from the whole output: what merge checks is their layout
        lines = trained.whole.splitlines(keepends=True)
        mine = [lines[k - 1] for k in _naive_shard(len(lines), int(CHUNK), (index, n))]
        (parts / f"p{index}.de").write_bytes(b"".join(mine))
        record = {"input": ["src.en", 1], "block": int(CHUNK), "input_lines": len(lines), "shard": f"{index}/{n}"}
        (parts / f"p{index}.de.shard.json").write_text(json.dumps(record))
    return parts


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: (p / "p1.de.shard.json").unlink(), "missing shard 1 of 3"),
    (lambda p: (p / "p2.de").write_bytes(b"one line\n"), "p2.de: ends before block 2"),
    (lambda p: (p / "p0.de").write_bytes((p / "p0.de").read_bytes() + b"extra\n"), "p0.de: has more lines"),
    (lambda p: (p / "p1.de.shard.json").write_text(json.dumps(
        {**json.loads((p / "p1.de.shard.json").read_text()), "block": 5})), "p1.de: block is 5"),
])
def test_merge_refuses_parts_that_are_not_one_whole_run(trained, tmp_path, damage, message):
    parts = _parts(tmp_path, trained, 3)
    assert shards.merge(parts, tmp_path / "ok.de") == 14 and (tmp_path / "ok.de").read_bytes() == trained.whole
    damage(parts)
    with pytest.raises(InputError, match=message):
        shards.merge(parts, tmp_path / "out.de")
    assert not (tmp_path / "out.de").exists()


@pytest.mark.parametrize(("stop", "status"), [(KeyboardInterrupt, 130), (Interrupted(signal.SIGTERM), 143)])
def test_an_interrupted_run_keeps_its_lines_and_the_same_command_continues(trained, tmp_path, monkeypatch, capsys,
                                                                           stop, status):
    out = tmp_path / "out.de"
    real, calls = infer._local, []

    def stopped_after_two_chunks(*args):
        for k, result in enumerate(real(*args)):
            calls.append(result[0])
            if k == 2:
                raise stop
            yield result

    with monkeypatch.context() as m:
        m.setattr(infer, "_local", stopped_after_two_chunks)
        with pytest.raises(SystemExit) as stopped:
            infer.main(_args(trained.ckpt, trained.src, out))
    assert stopped.value.code == status and not out.exists()
    assert "8 translated lines" in capsys.readouterr().err
    partial = tmp_path / ".out.de.partial"
    assert partial.read_bytes() == b"".join(trained.whole.splitlines(keepends=True)[:8])
    with partial.open("ab") as f:
        f.write(b"half a li")  # a kill in the middle of a write
    monkeypatch.setattr(infer, "_local", lambda *args: (calls.append(r[0]) or r for r in real(*args)))
    infer.main(_args(trained.ckpt, trained.src, out))
    assert out.read_bytes() == trained.whole and calls == [1, 5, 9, 9, 13]  # continued at line 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.de"]

    calls.clear()
    (tmp_path / ".out.de.partial").write_bytes(b"a\n")
    (tmp_path / ".out.de.partial.json").write_text("{}")  # another run's settings: start over
    infer.main(_args(trained.ckpt, trained.src, out))
    assert out.read_bytes() == trained.whole and calls == [1, 5, 9, 13]

