"""Write a file under a temporary name and rename it into place, so no reader sees half of it: every output the
apps write goes through `atomic_path`, and an interrupted or failed write leaves the previous file as it was."""

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
    """Yield a temporary path beside `path`; rename it to `path` if the block succeeds, else delete it. The temporary
    file sits in the same folder, so the rename is atomic. Its name is not from `tempfile.mkstemp`, whose 0600 mode
    would stick to the result. A symbolic link is written through (the link stays); a path that exists but is no regular
    file (a FIFO, `/dev/stdout`) is yielded as it is."""
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


def atomic_write_text(path: str | Path, text: str) -> None:
    """`text` as the UTF-8 file `path`, written through `atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def atomic_folder_files(path: str | Path) -> Iterator[Path]:
    """Yield `path`'s name inside a new hidden folder beside it; when the block succeeds, move every file the
    block wrote there beside `path`, `path` itself last (never found without its companions), then delete the
    folder. For writers that name companion files after their output (an ONNX graph's `model.onnx.data`)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path}: the output folder {path.parent} does not exist")
    folder = path.with_name(f".{path.name}.{os.getpid()}.{next(_serial)}.tmpdir")
    folder.mkdir()
    try:
        yield folder / path.name
        for file in sorted(folder.iterdir(), key=lambda f: f.name == path.name):  # the main file last
            os.chmod(file, _umask_mode())
            os.replace(file, path.with_name(file.name))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _umask_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def stale_temporaries(path: str | Path) -> list[Path]:
    """The temporary files `atomic_path` left beside `path` when their writer was killed; only a caller holding
    the output's lock (`core.runtime.lock`) may delete them: then no live writer owns one."""
    path = Path(path)
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp")) if path.parent.is_dir() else []
