"""Write a file under a temporary name and rename it into place, so no reader sees half of it.

Every output the apps write (vocabularies, averaged checkpoints, translations, alignments,
recommendation tables, prepared corpora) goes through `atomic_path`: an interrupted or failed
write leaves the previous file, if any, exactly as it was.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_serial = itertools.count()  # distinct temporary names for several outputs of one process


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` if the block succeeds, else delete it.

    The temporary file sits in the same folder, so the rename is atomic on POSIX and Windows.
    Its name is not from `tempfile.mkstemp`, whose 0600 mode would stick to the result: files
    written here get the usual umask permissions. A symbolic link is written through (its target
    gets the new file, the link stays); a path that exists but is no regular file (a FIFO,
    `/dev/stdout`, a terminal) is a stream with nothing to replace, so it is yielded as it is.

    Raises:
        FileNotFoundError: the folder of `path` does not exist (named in the message).
        IsADirectoryError: `path` is a folder.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a folder; name a file to write")
    if path.exists() and not path.is_file():
        yield path
        return
    if path.is_symlink():  # replacing the link itself would cut it from the file it names
        path = Path(os.path.realpath(path))
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path}: the output folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_serial)}.tmp")
    try:
        yield tmp
        if tmp.is_file():
            os.chmod(tmp, _umask_mode())  # a writer's own temporary file (safetensors') may be 0600
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_folder_files(path: str | Path) -> Iterator[Path]:
    """Yield `path`'s name inside a new hidden folder beside it; when the block succeeds, move every file the
    block wrote there beside `path`, `path` itself last, then delete the folder (on failure too).

    For writers that name companion files after their output (an ONNX graph's `model.onnx.data`): written
    under the final name, the companions' names are right once moved. Each file is renamed into place
    atomically; `path` last, so a reader never finds it without its companions.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path}: the output folder {path.parent} does not exist")
    folder = path.with_name(f".{path.name}.{os.getpid()}.{next(_serial)}.tmpdir")
    folder.mkdir()
    try:
        yield folder / path.name
        files = sorted(folder.iterdir(), key=lambda f: f.name == path.name)  # the main file last
        for file in files:
            os.chmod(file, _umask_mode())
            os.replace(file, path.with_name(file.name))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _umask_mode() -> int:
    """The mode a new file gets from this process's umask (0644 under the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def stale_temporaries(path: str | Path) -> list[Path]:
    """The temporary files `atomic_path` left beside `path` when their writer was killed (`kill -9`, power loss).

    Only a caller that holds the output's lock (`core.runtime.lock`) may delete them: then no live writer owns one.
    """
    path = Path(path)
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp")) if path.parent.is_dir() else []
