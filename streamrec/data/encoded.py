"""The encoded log: model item ids grouped by user, cached as .npy files that every process memory-maps, so a
node's DDP ranks and DataLoader workers share one copy of the items through the page cache."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.runtime.atomic import atomic_path, atomic_write_text
from streamrec.data.interactions import Interactions
from streamrec.data.vocab import ItemVocab, encode_codes

_VERSION = 1  # bump when the arrays' meaning changes, so old caches are not read


@dataclass
class EncodedLog:
    """Every user's chronological model item ids: user k's are items[offsets[k] : offsets[k + 1]] (int32)."""

    users: list[str]
    vocab: ItemVocab
    items: np.ndarray
    offsets: np.ndarray
    times: np.ndarray | None

    @classmethod
    def from_interactions(cls, inter: Interactions) -> EncodedLog:
        vocab, items = encode_codes(inter.item_ids, inter.codes)
        return cls(inter.users, vocab, items, inter.offsets, inter.times)

    def sequences(self) -> dict[str, np.ndarray]:
        """user -> that user's items (views of `items`, nothing copied)."""
        # Views of the plain ndarray over the map, not of the np.memmap: a memmap view carries a __dict__
        # (~490 bytes against ~120), and every DDP rank holds a few views per user (the split's histories, cases).
        items, o = np.asarray(self.items), self.offsets.tolist()
        return {u: items[o[k] : o[k + 1]] for k, u in enumerate(self.users)}

    def timestamps(self) -> dict[str, np.ndarray] | None:
        if self.times is None:
            return None
        times, o = np.asarray(self.times), self.offsets.tolist()  # plain views, as in `sequences`
        return {u: times[o[k] : o[k + 1]] for k, u in enumerate(self.users)}

    def save(self, folder: str | Path, key: str) -> None:
        """Write the arrays, then `key.json` last: a reader that finds the json finds whole arrays."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"items": self.items, "offsets": self.offsets} | ({} if self.times is None else {"times": self.times})
        for name, array in arrays.items():
            with atomic_path(folder / f"{key}.{name}.npy") as tmp, open(tmp, "wb") as f:
                np.save(f, array)
        atomic_write_text(folder / f"{key}.json", json.dumps({"users": self.users, "vocab": self.vocab.to_dict(),
                                                                "timed": self.times is not None}))

    @classmethod
    def load(cls, folder: str | Path, key: str) -> EncodedLog | None:
        """The cached log memory-mapped read-only, or None when there is none under `key`."""
        folder = Path(folder)
        meta_path = folder / f"{key}.json"
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        arrays = {name: np.load(folder / f"{key}.{name}.npy", mmap_mode="r")
                  for name in ("items", "offsets", *(("times",) if meta["timed"] else ()))}
        return cls(meta["users"], ItemVocab.from_dict(meta["vocab"]), arrays["items"], arrays["offsets"],
                   arrays.get("times"))


def cache_key(path: str | Path, **settings: object) -> str:
    """A name for `path` (a file or a folder's files) read with `settings`; a file's size or modification time
    changing changes it, so an edited log is read again."""
    path = Path(path).resolve()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    blob = json.dumps({"version": _VERSION, "files": stats, "settings": settings}, sort_keys=True, default=str)
    return f"{path.name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
