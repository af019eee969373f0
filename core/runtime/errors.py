"""The one error type for a user's bad input, and one-line wording for the OS errors of writing.

`InputError` is a `ValueError`, so older `except ValueError` code still catches it; the CLIs print its
one line and exit non-zero, and anything else that escapes a reader is a bug."""

from __future__ import annotations

import atexit
import errno
import gc
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class InputError(ValueError):
    """A file, line, key or value the product cannot use; the message is one line with the fix."""


class UnsafeCheckpointError(InputError):
    """A checkpoint whose pickle names a global outside our allow-list (it could run code if unpickled)."""


class OutputLockedError(InputError):
    """Another live process is writing the same output."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM as Ctrl-C's exception, which remembers its signal: the command then exits with 128 + its number, as
    a shell reports a process the signal killed, not as a refused input's 1."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


class Stopped(SystemExit):
    """The exit of an interrupted command, whose text is its one line (what a caller in the process reads)."""

    def __init__(self, status: int, line: str):
        super().__init__(status)
        self.line = line

    def __str__(self) -> str:
        return self.line


_FIXES = {
    errno.ENOSPC: "no space left on the device; free some space and rerun",
    errno.EDQUOT: "disk quota exceeded; free some space and rerun",
    errno.EACCES: "permission denied; choose a folder you can write to",
    errno.EPERM: "operation not permitted; choose a folder you can write to",
    errno.EROFS: "the file system is read-only; choose a writable folder",
    errno.ENOENT: "no such file or folder; create the folder first or fix the path",
    errno.EISDIR: "is a folder; name a file",
    errno.ENOTDIR: "a part of the path is not a folder; fix the path",
}


def describe_os_error(err: OSError, path: str | Path | None = None) -> str:
    """One line for an OSError: the file it concerns and what to do (not Python's `[Errno N]` wording)."""
    where = err.filename if err.filename is not None else path
    fix = _FIXES.get(err.errno or -1, err.strerror or type(err).__name__)
    return f"{where}: {fix}" if where is not None else fix


@contextmanager
def exit_on_error(output: str | Path | None = None, not_written: bool = False,
                  interrupted: str | None = None) -> Iterator[None]:
    """A user's mistake (a bad value or file, an unwritable folder, a full disk) ends the command with one line
    on stderr and exit status 1, not a traceback. `output`: the file an OSError without a file name concerns
    (`not_written`: say it was not written); `interrupted`: the line after "interrupted: " for Ctrl-C or
    SIGTERM, which end it with 130 or 143 (None: let the interruption through). Lightning's fit ends an
    interrupted fit with `exit(1)`, the interruption its context: that is one too."""
    skip_exit_collection()
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as err:
        cause = err.__context__ if isinstance(err, SystemExit) else err
        if interrupted is None or not isinstance(cause, KeyboardInterrupt):
            raise
        print(line := f"interrupted: {interrupted}", file=sys.stderr, flush=True)
        raise Stopped(128 + getattr(cause, "signum", signal.SIGINT), line) from None
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    except OSError as err:
        sys.exit(f"error: {describe_os_error(err, output)}" + (f"; {output} was not written" if not_written else ""))


def skip_exit_collection() -> None:
    """Programs only (a library's user may count on it): the interpreter's last garbage collection walks every
    object torch and Lightning created, a second or more of each command's exit, to free what the process's end
    frees anyway. Objects frozen at exit are not walked."""
    atexit.unregister(gc.freeze)  # once, however many commands a process runs
    atexit.register(gc.freeze)


def check_output_file(path: Path, flag: str, kind: str) -> None:
    """Refuse, naming `flag`, an output `path` that is a folder (name `kind` instead) or whose folder is missing."""
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a folder; name {kind}")
    if not path.parent.is_dir():
        raise InputError(f"{flag} {path}: the folder {path.parent} does not exist; create it first")


def check_text(data: bytes, name: str | Path, offset_line: int = 1) -> None:
    """Refuse binary input: a NUL byte never occurs in text, so say where the first one is (`offset_line`: the
    line number of `data`'s first line in the file `name`)."""
    at = data.find(b"\0")
    if at >= 0:
        line = offset_line + data.count(b"\n", 0, at)
        column = at - (data.rfind(b"\n", 0, at) + 1) + 1
        raise InputError(f"{name}:{line}: NUL byte at column {column}: this is a binary file, not text; "
                         "pass the text file (UTF-8), or Parquet with a .parquet name")


def check_text_file(path: str | Path, block: int = 1 << 20) -> None:
    """`check_text` over a whole file, a block at a time (a C-speed scan)."""
    with open(path, "rb") as f:
        line = 1
        while data := f.read(block):
            check_text(data, path, line)
            line += data.count(b"\n")
