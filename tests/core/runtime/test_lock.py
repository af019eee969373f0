"""core.runtime.lock: one writer per output, the holder named, a dead holder's lock taken over with a warning."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.runtime.errors import InputError, OutputLockedError
from core.runtime.lock import OutputLock, lock_path

REPO = Path(__file__).resolve().parents[3]
HOLD = "import sys, time; from core.runtime.lock import OutputLock; OutputLock(sys.argv[1], 'test').acquire(); " \
       "print('held', flush=True); time.sleep(60)"


def _holder(target: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lock_file_beside_a_file_and_inside_a_folder(tmp_path: Path) -> None:
    assert lock_path(tmp_path / "recs.parquet") == tmp_path / "recs.parquet.lock"
    assert lock_path(tmp_path) == tmp_path / "fit.lock"


def test_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    with OutputLock(target, "scoring"):
        with pytest.raises(OutputLockedError) as err:
            OutputLock(target).acquire()
        message = str(err.value)
        assert "\n" not in message
        assert f"pid {os.getpid()} on {socket.gethostname()}" in message and "scoring" in message
        assert str(tmp_path / "out.txt.lock") in message
    assert not (tmp_path / "out.txt.lock").exists()  # released: the file is gone
    with OutputLock(target):  # and the next writer gets it
        pass


def test_other_process_holds_it_until_killed_then_it_is_taken_over(tmp_path: Path, caplog) -> None:
    target = tmp_path / "recs.parquet"
    proc = _holder(target)
    try:
        with pytest.raises(OutputLockedError, match=rf"pid {proc.pid} on "):
            OutputLock(target).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert lock_path(target).exists()  # kill -9: no cleanup ran, the file stays...
    with caplog.at_level(logging.WARNING, logger="core.runtime.lock"), OutputLock(target):  # ...but the kernel freed it
        pass
    assert f"left by test, pid {proc.pid}" in caplog.text and "no longer running" in caplog.text


def test_missing_or_unwritable_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        OutputLock(tmp_path / "nope" / "out.txt").acquire()
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="not a folder|does not exist"):
        OutputLock(tmp_path / "file" / "out.txt").acquire()


@pytest.mark.slow
def test_many_processes_racing_get_exactly_one_lock(tmp_path: Path) -> None:
    """Eight processes try at once, each releasing (and deleting the file) as soon as it holds the lock."""
    target = tmp_path / "out.txt"
    code = ("import os, sys, time; from core.runtime.lock import OutputLock\n"
            "from core.runtime.errors import OutputLockedError\n"
            "print('ready', flush=True); os.read(0, 1)\n"  # every process has imported, and waits for the go
            "try:\n    l = OutputLock(sys.argv[1]).acquire()\nexcept OutputLockedError:\n    sys.exit(3)\n"
            "h = sys.argv[1] + '.holders'; open(h, 'a').write('+'); time.sleep(0.3); s = open(h).read()\n"
            "open(h, 'a').write('-'); l.release(); sys.exit(0 if s.count('+') - s.count('-') == 1 else 4)\n")
    go, start = os.pipe()  # one pipe read by all: closing its end wakes every process at the same instant
    try:
        procs = [subprocess.Popen([sys.executable, "-c", code, str(target)], cwd=REPO, stdin=go,
                                  stdout=subprocess.PIPE, text=True) for _ in range(8)]
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 8
    finally:
        os.close(go)
        os.close(start)
    codes = [p.wait(timeout=60) for p in procs]
    assert 4 not in codes, "two processes held the lock at once"
    assert codes.count(0) >= 1 and set(codes) <= {0, 3}


def test_refusal_names_a_holder_that_writes_its_record_just_after_locking(tmp_path: Path) -> None:
    # The holder takes the flock before it writes who it is; a contender arriving in between once
    # read an empty file and said "a process that recorded nothing".
    import fcntl
    import json
    import threading

    target = tmp_path / "out.txt"
    fd = os.open(lock_path(target), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    late = threading.Timer(0.2, os.pwrite, (fd, json.dumps({"pid": 4242, "host": "h", "what": "late"}).encode(), 0))
    late.start()
    try:
        with pytest.raises(OutputLockedError) as err:
            OutputLock(target).acquire()
    finally:
        late.join()
        os.close(fd)
    assert "late, pid 4242 on h" in str(err.value)
