"""One writer per output: an exclusive lock file beside what a run writes (`with OutputLock("recs.parquet"):`).

The lock is `fcntl.flock` on `NAME.lock`, which the kernel releases when the holder dies, however it dies
(even `kill -9`); the file records the holder so a second writer is told who holds it. A lock file whose
holder is gone is taken over with a one-line warning."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from types import TracebackType

from core.runtime.errors import InputError, Interrupted, OutputLockedError, describe_os_error

log = logging.getLogger("core.runtime.lock")


def lock_path(target: str | Path) -> Path:
    """The lock file of an output: `OUTPUT.lock` beside a file, `FOLDER/fit.lock` inside a run folder."""
    target = Path(target)
    return target / "fit.lock" if target.is_dir() else target.with_name(target.name + ".lock")


class OutputLock:
    """An exclusive, non-blocking lock on one output file or run folder for the life of a run; `what` the holder
    does ("scoring", "fit") is told to a second writer."""

    def __init__(self, target: str | Path, what: str = "writing"):
        self.target, self.what, self.path = Path(target), what, lock_path(target)
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        """Take the lock or raise `OutputLockedError` naming the holder and the lock file."""
        if not self.path.parent.is_dir():
            raise InputError(f"{self.target}: the output folder {self.path.parent} does not exist; create it first")
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise InputError(describe_os_error(err, self.path)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_wait_for_record(fd))
                os.close(fd)
                raise OutputLockedError(
                    f"{self.target}: another run is writing it ({holder}; lock file {self.path}); "
                    "wait for it to finish or stop it") from None
            # The holder we waited on may have deleted the file between our open and our lock:
            # then we hold a lock on a name nobody else sees, so start again on the current file.
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    break
            os.close(fd)
        if previous := _read_holder(fd):
            log.warning("%s: took over the lock file %s left by %s, which is no longer running",
                        self.target, self.path, _describe(previous))
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S"), "what": self.what}).encode()
        os.pwrite(fd, record, 0)  # write, then cut what a longer earlier record left: never an empty file
        os.ftruncate(fd, len(record))
        self._fd = fd
        atexit.register(self.release)
        return self

    def release(self) -> None:
        """Delete the lock file and release the lock; safe to call again."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                self.path.unlink()  # while still holding it, so no one locks a file we then delete
        os.close(fd)
        atexit.unregister(self.release)

    def __getstate__(self) -> dict[str, object]:
        # A copy in another process (ddp_spawn pickles what the trainer references) holds nothing: a file
        # descriptor number means another file there.
        return {**self.__dict__, "_fd": None}

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {"pid": "?"}
    return holder if isinstance(holder, dict) else {"pid": "?"}


def _wait_for_record(fd: int, seconds: float = 1.0) -> dict[str, object]:
    """The holder's record; a holder that has just taken the lock may not have written it yet."""
    deadline = time.monotonic() + seconds
    while not (holder := _read_holder(fd)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return holder


def _describe(holder: dict[str, object]) -> str:
    if not holder:
        return "a process that recorded nothing"
    what = f"{holder['what']}, " if holder.get("what") else ""
    return f"{what}pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"


def interrupt_on_sigterm() -> None:
    """Make SIGTERM (`kill`, a job scheduler's stop) raise KeyboardInterrupt (`Interrupted`), as Ctrl-C does. Python's
    default for SIGTERM ends the process at once, skipping `finally` blocks: temporary files and lock files would stay.
    A CLI calls this first and treats both signals as an interruption."""
    def _raise(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    if threading.current_thread() is threading.main_thread():  # the only thread Python lets set handlers
        signal.signal(signal.SIGTERM, _raise)
