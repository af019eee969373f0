"""streamrec.score under concurrent writers, kills and bad input: one writer per output, every user exactly
once after a resume, one-line errors, nothing half-written or left behind, earlier outputs untouched."""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import signal
import sys
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from core.runtime.lock import OutputLock
from streamrec import score

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import exit_child  # noqa: E402 (from a path the fork server inherits)
import forks  # noqa: E402 (by name: the fork server test_exit_status and test_resume use too)

forks.preload("exit_child", "streamrec.score")


@pytest.fixture(scope="module")
def big_log(demo, tmp_path_factory) -> Path:
    """400 users over the tiny checkpoint's 40 items: 20 parts of 20 users, so a kill lands mid-run."""
    path = tmp_path_factory.mktemp("big") / "interactions.csv"
    demo.write_csv(demo.generate(users=400, items=40, seed=1, min_len=5, max_len=15), path)
    return path


def _scorer_args(ckpt: Path, log: Path, out: Path, *extra: str) -> list[str]:
    """`python -m streamrec.score ARGS`'s ARGS."""
    return ["--ckpt", str(ckpt), "--input", str(log), "--output", str(out), "--top-k", "5", "--explain",
            "--chunk-users", "20", "--batch-size", "16", *extra]


_RUNS = itertools.count()


def _scorer(ckpt: Path, log: Path, out: Path, *extra: str) -> BaseProcess:
    """A scorer as a process of its own (forked from the tests' fork server, tests/forks.py), leaving as the
    program would (tests/exit_child.py); its stderr in `out`'s folder, `scorer-N.err` (its `err`)."""
    logs = out.parent / f"scorer-{next(_RUNS)}"
    child = forks.FORKS.Process(target=exit_child.run, args=(score.main, _scorer_args(ckpt, log, out, *extra),
                                                               str(logs), True))
    child.start()
    child.err = Path(f"{logs}.err")
    return child


def _wait_for(condition, procs: list[BaseProcess], seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not condition() and any(p.exitcode is None for p in procs) and time.time() < deadline:
        time.sleep(0.01)


def _users_once(out: Path, n_users: int, k: int = 5) -> None:
    table = pq.read_table(out, columns=["user_id", "rank"]).to_pylist()
    pairs = [(r["user_id"], r["rank"]) for r in table]
    assert len(pairs) == len(set(pairs)) == n_users * k  # every user, every rank, exactly once


@pytest.mark.slow
def test_two_scorers_on_one_output_exactly_one_succeeds(tiny_ckpt, big_log, tmp_path):
    """Both start at once; the holder is paused (SIGSTOP) once it has written a part, so the other one meets
    a live holder however the two are scheduled, then resumed to finish."""
    out = tmp_path / "recs.parquet"
    procs = [_scorer(tiny_ckpt, big_log, out) for _ in range(2)]
    part = tmp_path / "recs.parquet.parts" / "part-00000.parquet"
    _wait_for(part.exists, procs)
    holder = json.loads((tmp_path / "recs.parquet.lock").read_text())["pid"]
    os.kill(holder, signal.SIGSTOP)
    try:
        winner = next(p for p in procs if p.pid == holder)
        loser = next(p for p in procs if p.pid != holder)
        assert forks.exit_status(loser, 300) != 0
    finally:
        os.kill(holder, signal.SIGCONT)
    assert forks.exit_status(winner, 300) == 0, winner.err.read_text()
    message = loser.err.read_text().strip().splitlines()[-1]
    assert "another run is writing it (streamrec.score, pid" in message and f"lock file {out}.lock" in message
    assert f"pid {holder} " in message
    _users_once(out, 400)
    assert not (tmp_path / "recs.parquet.parts").exists() and not (tmp_path / "recs.parquet.lock").exists()


@pytest.mark.slow
def test_scorer_killed_with_sigkill_resumes_every_user_once(tiny_ckpt, big_log, tmp_path, monkeypatch, caplog):
    out = tmp_path / "recs.parquet"
    proc = _scorer(tiny_ckpt, big_log, out)
    parts = tmp_path / "recs.parquet.parts"
    _wait_for(lambda: (parts / "part-00001.parquet").exists(), [proc])
    proc.kill()
    assert forks.exit_status(proc, 300) == 128 + signal.SIGKILL, \
        "the scorer finished before it could be killed: use a bigger log"
    assert not out.exists() and (tmp_path / "recs.parquet.lock").exists()
    # The resumed run in this process (the same arguments as _scorer's): it returns normally and logs the
    # takeover and the resume.
    monkeypatch.chdir(REPO)
    caplog.set_level(logging.INFO)
    score.main(_scorer_args(tiny_ckpt, big_log, out))
    assert "took over the lock file" in caplog.text and "resuming:" in caplog.text
    _users_once(out, 400)
    assert not parts.exists() and not list(tmp_path.glob(".*.tmp"))


def _args(ckpt: Path, log: Path, out: Path, *extra: str) -> list[str]:
    return ["--ckpt", str(ckpt), "--input", str(log), "--output", str(out), "--top-k", "3", "--chunk-users", "30",
            *extra]


def _fails(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        score.main(argv)
    assert exit_.value.code not in (0, None)
    message = str(exit_.value.code)
    assert "\n" not in message, message
    return message


def _left_behind(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".tmp", ".parts", ".lock", ".json")))


@pytest.mark.parametrize("content", [b"user_id,item_id,timestamp\nu1,i\x001,1\n", b"\x00\x01\x02binary"])
def test_nul_bytes_in_the_input_are_refused(content, tiny_ckpt, tmp_path):
    log = tmp_path / "log.csv"
    log.write_bytes(content)
    message = _fails(_args(tiny_ckpt, log, tmp_path / "recs.parquet"))
    assert f"{log}:" in message and "NUL byte" in message
    users = tmp_path / "users.txt"
    users.write_bytes(b"u0001\n\x00\n")
    message = _fails(_args(tiny_ckpt, tiny_ckpt.parent / "none.csv", tmp_path / "r.parquet", "--users", str(users)))
    assert "none.csv" in message or "NUL byte" in message
    assert _left_behind(tmp_path) == []


def test_missing_output_folder_is_refused_not_created(tiny_ckpt, tiny_log, tmp_path):
    message = _fails(_args(tiny_ckpt, tiny_log, tmp_path / "no" / "such" / "recs.parquet"))
    assert "does not exist; create it first" in message
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("fail_at", [1, 2, 4])  # the first part, a later part, the final file (3 parts + 1)
def test_full_disk_at_any_write_is_one_line_and_leaves_nothing(fail_at, tiny_ckpt, tiny_log, tmp_path, monkeypatch):
    out = tmp_path / "recs.parquet"
    out.write_bytes(b"an earlier run's output")
    real, calls = pq.write_table, {"n": 0}

    def full_disk(where):
        calls["n"] += 1
        if calls["n"] == fail_at:
            Path(where).write_bytes(b"PAR1 half a file")
            raise OSError(errno.ENOSPC, "No space left on device", str(where))

    def write_table(table, where, **kw):  # the parts
        full_disk(where)
        return real(table, where, **kw)

    class Writer(pq.ParquetWriter):  # the final file, streamed a part at a time
        def __init__(self, where, *a, **kw):
            super().__init__(where, *a, **kw)
            self.where = where

        def write_table(self, table, *a, **kw):
            full_disk(self.where)
            return super().write_table(table, *a, **kw)

    monkeypatch.setattr(score.pq, "write_table", write_table)
    monkeypatch.setattr(score.pq, "ParquetWriter", Writer)
    message = _fails(_args(tiny_ckpt, tiny_log, out))
    assert "no space left on the device; free some space and rerun" in message
    assert out.read_bytes() == b"an earlier run's output"
    assert _left_behind(tmp_path) == []


def test_unwritable_folder_is_one_line(tiny_ckpt, tiny_log, tmp_path, monkeypatch):
    import core.runtime.lock

    def refuse(path, *a, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    # root ignores chmod, so deny where the first write happens
    monkeypatch.setattr(core.runtime.lock.os, "open", refuse)
    message = _fails(_args(tiny_ckpt, tiny_log, tmp_path / "recs.parquet"))
    assert "recs.parquet.lock: permission denied; choose a folder you can write to" in message


def test_no_user_scorable_leaves_no_parts(tiny_ckpt, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("user_id,item_id,timestamp\nu1,unknown1,1\nu2,unknown2,2\n")
    message = _fails(_args(tiny_ckpt, log, tmp_path / "recs.parquet"))
    assert "no user could be scored" in message
    assert _left_behind(tmp_path) == []


def test_a_killed_final_write_leaves_a_temporary_the_next_run_removes(tiny_ckpt, tiny_log, tmp_path):
    out = tmp_path / "recs.parquet"
    stale = tmp_path / ".recs.parquet.99999.0.tmp"
    stale.write_bytes(b"PAR1 cut short")
    score.main(_args(tiny_ckpt, tiny_log, out))
    assert not stale.exists() and _left_behind(tmp_path) == []
    assert pq.read_table(out).num_rows == 81 * 3


def test_fresh_starts_over_and_a_locked_output_is_refused(tiny_ckpt, tiny_log, tmp_path):
    out = tmp_path / "recs.parquet"
    parts = tmp_path / "recs.parquet.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text('{"top_k": 99}')
    assert "--fresh" in _fails(_args(tiny_ckpt, tiny_log, out))
    score.main(_args(tiny_ckpt, tiny_log, out, "--fresh"))
    assert pq.read_table(out).num_rows == 81 * 3 and not parts.exists()
    with OutputLock(out, "another scorer"):
        message = _fails(_args(tiny_ckpt, tiny_log, out))
    assert "another run is writing it (another scorer, pid" in message


def test_help_documents_resume_and_fresh(capsys):
    with pytest.raises(SystemExit):
        score.main(["--help"])
    text = capsys.readouterr().out
    assert "--fresh" in text and "kill -9" in text and "OUTPUT.lock" in text
