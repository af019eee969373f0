"""Dense item vectors (title embeddings from a sentence encoder, say) that initialise the item id table: an item then
starts near the items its text resembles instead of at a random point, which matters most for items seen a few times.

The file is a NumPy `.npz` of two arrays, `item_id` (M,) (strings or integers, the log's item ids) and `vector`
(M, E) floats, read without pickle; `write_item_vectors` writes one (data/prepare_title_vectors.py,
prepare_feature_vectors.py). Items of the file absent from the log are left out; items of the log absent from the
file keep their random start. Legend: N items (ids 1..N, 0 = padding), M items in the file, E its vector width."""

from __future__ import annotations

import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.runtime.atomic import atomic_path
from core.runtime.errors import InputError
from streamrec.data.vocab import ItemVocab

KEYS = ("item_id", "vector")
MAX_VECTORS_FILE_BYTES = 4 << 30  # 10M items of 100 floats; refuse a bigger file before reading it
MAX_WIDTH = 8192  # wider than any sentence encoder's output


def read_item_vectors(path: str | Path, vocab: ItemVocab) -> Tensor:
    """(N + 1, E) float32 vectors of `vocab`'s items, NaN in the rows of items the file does not give (and row 0)."""
    path = Path(path)
    size = path.stat().st_size
    if zipfile.is_zipfile(path):  # a compressed file's arrays take their unpacked size in memory
        with zipfile.ZipFile(path) as archive:
            size = max(size, sum(entry.file_size for entry in archive.infolist()))
    if size > MAX_VECTORS_FILE_BYTES:
        raise InputError(f"{path}: {size:,} bytes unpacked, over the {MAX_VECTORS_FILE_BYTES:,}-byte limit for an "
                         "item vectors file; keep fewer items or a narrower vector")
    try:
        with np.load(path, allow_pickle=False) as npz:
            names, arrays = npz.files, {k: npz[k] for k in KEYS if k in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile) as err:  # a pickled array, a file that is not an .npz
        raise InputError(f"{path}: not a NumPy .npz of `item_id` and `vector` arrays ({err}); write it with "
                         "numpy.savez, without object arrays") from None
    if missing := [k for k in KEYS if k not in arrays]:
        raise InputError(f"{path}: no array {missing[0]!r} (arrays: {', '.join(names) or 'none'}); an item vectors "
                         "file holds `item_id` (M,) and `vector` (M, E), as data/prepare_title_vectors.py writes it")
    ids, vectors = arrays["item_id"], arrays["vector"]
    if ids.ndim != 1 or vectors.ndim != 2 or len(ids) != len(vectors) or not len(ids):
        raise InputError(f"{path}: `item_id` {ids.shape} and `vector` {vectors.shape} must be (M,) and (M, E) with "
                         "one row per item, M > 0")
    if ids.dtype.kind not in "iuU" or vectors.dtype.kind != "f":
        raise InputError(f"{path}: `item_id` must hold integers or strings and `vector` floats, got {ids.dtype} "
                         f"and {vectors.dtype}")
    if not 0 < vectors.shape[1] <= MAX_WIDTH:
        raise InputError(f"{path}: vectors of width {vectors.shape[1]}; the width must be 1 to {MAX_WIDTH}")
    ids = [str(i) for i in ids.tolist()]
    if len(set(ids)) != len(ids):
        twice = next(i for i, n in Counter(ids).items() if n > 1)
        raise InputError(f"{path}: item {twice!r} has more than one vector; give each item one row")
    rows = vocab.lookup(ids)
    known = rows > 0
    if not known.any():
        raise InputError(f"{path}: none of its {len(ids)} items is in the log; its `item_id` must hold the log's "
                         "item ids")
    if (bad := np.flatnonzero(known & ~np.isfinite(vectors).all(axis=1))).size:
        raise InputError(f"{path}: the vector of item {ids[int(bad[0])]!r} holds NaN or infinity; give every item "
                         "finite values")
    out = torch.full((vocab.num_items + 1, vectors.shape[1]), float("nan"))
    out[torch.from_numpy(rows[known])] = torch.from_numpy(vectors[known].astype(np.float32))
    return out


def write_item_vectors(path: str | Path, ids: np.ndarray, vectors: np.ndarray) -> None:
    """The file `read_item_vectors` reads, compressed (indicator rows are mostly zeros), written under a temporary name
    and renamed, so a stopped run leaves no half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        np.savez_compressed(f, item_id=np.asarray(ids), vector=np.asarray(vectors, dtype=np.float32))
