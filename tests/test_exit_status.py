"""Exit statuses of the batch programs: a refused input ends in status 1 every time (never a signal, an abort or a
hang), and SIGINT or SIGTERM ends a run with 128 + the signal's number, one line, and what resumes it kept.

Each run is a child forked from a fork server that has imported the programs already (tests/exit_child.py): the
child calls the program's `main(argv)` and leaves the way the program would, through Python's exit handlers and
libc's `exit` (where a native thread still alive at exit aborts the process)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

import optuna
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from optuna.trial import TrialState

from streamrec import export as streamrec_export
from streamrec import score, tune
from translate import average, infer
from translate import export as translate_export

FIXTURES = Path(__file__).parent / "streamrec" / "fixtures"
CKPT = FIXTURES / "sasrec.ckpt"
# EXIT_STATUS_REPEATS=50: every refusal that many times, each through libc's exit (a measurement, not the suite's)
REPEATS = int(os.environ.get("EXIT_STATUS_REPEATS", "0"))
sys.path.insert(0, str(Path(__file__).parent))
import exit_child  # noqa: E402 (from a path the fork server inherits)
import forks  # noqa: E402 (by name: one fork server and its module list for this file and test_resume)

# A fresh interpreter that has imported the programs forks every child, whatever this worker ran before.
forks.preload("exit_child", "pandas", "streamrec.score", "streamrec.tune", "streamrec.export", "translate.average",
              "translate.infer", "translate.export")


def _start(main: Callable[[list[str]], object], argv: list[str], logs: Path, libc_exit: bool = True) -> BaseProcess:
    """A child, forked from the fork server, running `main(argv)` with its output in `logs`.out and `logs`.err."""
    child = forks.FORKS.Process(target=exit_child.run, args=(main, argv, str(logs), libc_exit))
    child.start()
    return child


def _wait(child: BaseProcess, seconds: float = 60) -> int:
    return forks.exit_status(child, seconds)


def _run(main: Callable[[list[str]], object], argv: list[str], logs: Path, libc_exit: bool = True) -> tuple[int, str]:
    return _wait(_start(main, argv, logs, libc_exit)), Path(f"{logs}.err").read_text()


def _log(path: Path, users: int, per_user: int = 5, bad_row: int | None = None, bad: str = "") -> Path:
    """A CSV log of the fixture checkpoint's items; row `bad_row` (from 0) replaced by `bad`."""
    lines = ["user_id,item_id,timestamp"]
    for u in range(users):
        lines += [f"u{u:06d},v{(u + k) % 40:04d},{1_700_000_000 + k}" for k in range(per_user)]
    if bad_row is not None:
        lines[bad_row + 1] = bad
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    rows = 30_000  # several blocks of arrow's reader: the bad row is met while it still reads ahead
    files = {
        "log": _log(d / "log.csv", 60),
        "extra_field": _log(d / "extra.csv", rows // 5, bad_row=25_000, bad="u1,v0001,1700000000,9"),
        "bad_time": _log(d / "time.csv", rows // 5, bad_row=25_000, bad="u1,v0001,yesterday"),
        "nul": _log(d / "nul.csv", rows // 5, bad_row=25_000, bad="u1,v00\0,1"),
        "latin1": d / "latin1.csv",
        "no_time": d / "no_time.csv",
        "garbage_ckpt": d / "garbage.ckpt",
        "truncated_ckpt": d / "truncated.ckpt",
        "truncated_parquet": d / "truncated.parquet",
        "parquet_no_item": d / "no_item.parquet",
        "parquet_null_user": d / "null_user.parquet",
        "users_binary": d / "users.bin",
        "users_empty": d / "users_empty.txt",
        "bad_key_yaml": d / "bad_key.yaml",
    }
    files["bad_key_yaml"].write_text(f"data: {{path: {d / 'log.csv'}}}\nmodel: {{evaluation: {{ks: [5]}}}}\n")
    files["latin1"].write_bytes(files["extra_field"].read_bytes().replace(b"u1,v0001,1700000000,9", b"u\xe9,v1,1"))
    files["no_time"].write_text("user_id,item_id\nu1,v0001\n")
    files["garbage_ckpt"].write_bytes(b"not a checkpoint\n" * 100)
    files["truncated_ckpt"].write_bytes(CKPT.read_bytes()[: CKPT.stat().st_size // 2])
    n = rows
    users = [f"u{i // 5:06d}" for i in range(n)]
    table = pa.table({"user_id": users, "item_id": [f"v{i % 40:04d}" for i in range(n)],
                      "timestamp": [1_700_000_000 + i for i in range(n)]})
    pq.write_table(table, files["truncated_parquet"], row_group_size=5_000)
    files["truncated_parquet"].write_bytes(files["truncated_parquet"].read_bytes()[:-100])
    pq.write_table(table.drop(["item_id"]), files["parquet_no_item"])
    users[25_000] = None
    pq.write_table(table.set_column(0, "user_id", pa.array(users)), files["parquet_null_user"], row_group_size=5_000)
    files["users_binary"].write_bytes(b"u1\n\0\0\n")
    files["users_empty"].write_text("\n\n")
    return files


def _score_argv(inputs: dict[str, Path], out: Path, **change: str) -> list[str]:
    args = {"--ckpt": str(CKPT), "--input": str(inputs["log"]), "--output": str(out), **change}
    return [x for kv in args.items() for x in kv]


SCORE_ERRORS = {  # name: (flags changed, runs): arrow's CSV and Parquet readers, with threads reading ahead, more
    "extra field far in": ({"--input": "extra_field"}, 2),
    "null user in parquet": ({"--input": "parquet_null_user"}, 2),
    "bad time far in": ({"--input": "bad_time"}, 2),
    "NUL far in": ({"--input": "nul"}, 2),
    "not UTF-8 far in": ({"--input": "latin1"}, 2),
    "truncated parquet": ({"--input": "truncated_parquet"}, 2),
    "missing column": ({"--input": "no_time"}, 1),
    "parquet without item column": ({"--input": "parquet_no_item"}, 1),
    "garbage checkpoint": ({"--ckpt": "garbage_ckpt"}, 1),
    "truncated checkpoint": ({"--ckpt": "truncated_ckpt"}, 1),
    "binary --users": ({"--users": "users_binary"}, 1),
    "empty --users": ({"--users": "users_empty"}, 1),
    "missing --users": ({"--users": "/nonexistent/users.txt"}, 1),
    "output folder missing": ({"--output": "/nonexistent/recs.csv"}, 1),
    "ray: empty --users": ({"--users": "users_empty", "--engine": "ray"}, 1),
    "ray: bad input far in": ({"--input": "extra_field", "--engine": "ray"}, 2),
}


@pytest.mark.parametrize("name", SCORE_ERRORS)
def test_a_refused_score_input_exits_1_every_time(name, inputs, tmp_path):
    change, runs = SCORE_ERRORS[name]
    change = {k: str(inputs.get(v, v)) for k, v in change.items()}
    argv = _score_argv(inputs, tmp_path / "recs.csv", **change)
    # The first run leaves through libc's exit, where a reader thread still alive would abort (the C++
    # destructors cost a second a run); the others check the status of every refusal. A race that is rare
    # here is EXIT_STATUS_REPEATS' to find.
    runs = REPEATS or runs
    codes = [_run(score.main, argv, tmp_path / f"run{i}", libc_exit=bool(REPEATS) or i == 0)[0] for i in range(runs)]
    err = (tmp_path / "run0.err").read_text()
    assert codes == [1] * runs, (codes, err)
    assert err.strip().splitlines()[-1].startswith("error: "), err
    assert "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("run")) == []


def test_refused_inputs_of_the_other_programs_exit_1(inputs, tmp_path):
    out = tmp_path / "out"
    cases = [
        (average.main, ["--ckpts", str(inputs["garbage_ckpt"]), "--output", str(out / "avg.ckpt")]),
        (average.main, ["--ckpts", str(inputs["truncated_ckpt"]), "--output", str(tmp_path / "avg.ckpt")]),
        (average.main, ["--ckpts", str(CKPT), "--output", str(tmp_path / "avg.ckpt")]),  # not a Translate one
        (average.main, ["--dir", str(tmp_path / "none"), "--output", str(tmp_path / "avg.ckpt")]),
        (streamrec_export.main, ["--ckpt", str(inputs["truncated_ckpt"]), "--format", "safetensors",
                                 "--output", str(out)]),
        (streamrec_export.main, ["--ckpt", str(CKPT), "--format", "safetensors", "--output", str(inputs["log"])]),
        (translate_export.main, ["--ckpt", str(CKPT), "--format", "safetensors", "--output", str(out)]),
        (translate_export.main, ["--ckpt", str(inputs["garbage_ckpt"]), "--format", "ctranslate2",
                                 "--output", str(out)]),
        (tune.main, ["--config", str(inputs["bad_key_yaml"]), "--out", str(tmp_path / "search"), "--budget", "1"]),
        (infer.main, ["--ckpt", str(CKPT), "-i", str(inputs["log"]), "-o", str(tmp_path / "out.de")]),
    ]
    for k, (main, argv) in enumerate(cases * (REPEATS or 1)):
        code, err = _run(main, argv, tmp_path / f"run{k}")
        assert code == 1 and err.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in err, (argv, err)
    assert not out.exists() and not list(tmp_path.glob("*avg*"))


def _stopped(signum: int, err: str) -> str:
    """The one line an interrupted run ends with (its status checked by the caller)."""
    lines = [line for line in err.splitlines() if line.startswith("interrupted: ")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]) and "Traceback" not in err, err
    return lines[0]


def _signal_when(child: BaseProcess, signum: int, ready: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline and child.exitcode is None, "the run ended before its signal"
        time.sleep(0.05)
    os.kill(child.pid, signum)


SCORE_IN_PARTS = {"--chunk-users": "1", "--threads": "1"}


@pytest.fixture(scope="module")
def scored_whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A log, and what one uninterrupted run scores from it: the reference each resumed run must equal."""
    d = tmp_path_factory.mktemp("whole")
    log, whole = _log(d / "log.csv", 80), d / "whole.csv"
    assert _run(score.main, _score_argv({"log": log}, whole, **SCORE_IN_PARTS), d / "whole")[0] == 0
    return log, whole.read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_scoring_with_its_parts_kept_and_a_rerun_resumes_them(signum, scored_whole, tmp_path):
    (log, whole), out = scored_whole, tmp_path / "recs.csv"
    argv = _score_argv({"log": log}, out, **SCORE_IN_PARTS)
    parts = tmp_path / "recs.csv.parts"
    child = _start(score.main, argv, tmp_path / "run")
    _signal_when(child, signum, lambda: len(list(parts.glob("part-*.parquet"))) >= 3)
    assert _wait(child) == 128 + signum
    assert "recs.csv.parts/" in _stopped(signum, (tmp_path / "run.err").read_text())
    kept = len(list(parts.glob("part-*.parquet")))
    assert kept >= 3 and not out.exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".lock"))]
    code, err = _run(score.main, argv, tmp_path / "resume")
    resumed = re.search(r"resuming: (\d+) users already scored", err)  # the kept parts' users with a history
    assert code == 0 and resumed and 0 < int(resumed.group(1)) <= 80, err
    assert sorted(out.read_text().splitlines()) == sorted(whole.splitlines())
    assert not parts.exists()


TUNE_CONFIG = """\
seed_everything: 0
trainer: {{max_epochs: 10, accelerator: cpu, logger: false, enable_progress_bar: false}}
data: {{path: {path}, max_len: 8, batch_size: 32}}
model: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, evaluation: {{popularity_baseline: false}}}}
"""


def test_a_signal_stops_tune_and_the_next_run_goes_on_with_the_study(tiny_log, tmp_path):
    config, out = tmp_path / "base.yaml", tmp_path / "search"
    config.write_text(TUNE_CONFIG.format(path=tiny_log))
    argv = ["--config", str(config), "--budget", "1", "--out", str(out), "--startup-trials", "2",
            "--params", "lr", "dropout"]
    db = out / "study.db"

    def epoch_reported(k: int) -> bool:  # this run's trial is inside Lightning's fit, past an epoch
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:  # never held open
                return bool(c.execute("SELECT COUNT(*) FROM trial_intermediate_values JOIN trials USING "
                                      "(trial_id) WHERE state = 'RUNNING' AND number = ?", (k,)).fetchone()[0])
        except sqlite3.Error:  # not created yet, or being written
            return False

    for k, signum in enumerate((signal.SIGTERM, signal.SIGINT)):
        child = _start(tune.main, argv, tmp_path / f"run{k}")
        _signal_when(child, signum, lambda: epoch_reported(k))  # noqa: B023 (called before k changes)
        assert _wait(child) == 128 + signum, (tmp_path / f"run{k}.err").read_text()[-3000:]
        assert "study.db" in _stopped(signum, (tmp_path / f"run{k}.err").read_text())
        assert not (out / "fit.lock").exists() and not list((out / "trials").glob("*"))
    assert _run(tune.main, argv, tmp_path / "last")[0] == 0
    study = optuna.load_study(study_name=tune.STUDY_NAME, storage=f"sqlite:///{db}")
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE], states
    assert study.trials[0].params == study.trials[1].params == study.trials[2].params  # the cut trial, run again
