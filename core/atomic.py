"""Write a file under a temporary name and rename it into place, so no reader sees half of it.

Every output the apps write (vocabularies, averaged checkpoints, translations, alignments,
recommendation tables, prepared corpora) goes through `atomic_path`: an interrupted or failed
write leaves the previous file, if any, exactly as it was.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_serial = itertools.count()  # distinct temporary names for several outputs of one process


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` if the block succeeds, else delete it.

    The temporary file sits in the same folder, so the rename is atomic on POSIX and Windows.
    Its name is not from `tempfile.mkstemp`, whose 0600 mode would stick to the result: files
    written here get the usual umask permissions.

    Raises:
        FileNotFoundError: the folder of `path` does not exist (named in the message).
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path}: the output folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_serial)}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
