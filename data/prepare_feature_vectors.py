"""Items' categorical features (an S3Rec attributes JSON, genres, brands) as dense vectors in the `.npz` that
`--data.item_vectors` reads: the item id table then starts at the features' principal components, so items that
share rare attributes start close. For sets without titles (Sports, Yelp) this is the start `prepare_title_vectors.py`
gives Beauty from its titles.

    python data/prepare_feature_vectors.py --columns attributes --out data/sports/attributes.npz \
        --items ../shared/data/amazon-sports/Sports_and_Outdoors_item2attributes.json
    python -m streamrec fit --config configs/streamrec/beauty.yaml \
        --data.path ../shared/data/amazon-sports/Sports_and_Outdoors.txt --data.item_vectors data/sports/attributes.npz

An item's vector is its features' indicators weighted by inverse document frequency, log(items / items with it),
scaled to unit length: a feature every item has says nothing and weighs 0; one that a few items share weighs most.
The features are read as `--data.item_features` reads them (`streamrec.data.features`); the widest files keep their
most frequent features up to the reader's width limit. The output is written under a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from core.runtime.errors import InputError
from streamrec.data.features import read_item_features
from streamrec.data.vectors import MAX_WIDTH, write_item_vectors


def feature_vectors(features: dict[str, list[str]], width: int = MAX_WIDTH) -> tuple[np.ndarray, np.ndarray]:
    """(ids, (M, F) float32 vectors), F the number of distinct features (the `width` most frequent); an item whose
    features every item has (weight 0) gets no row, so the model starts it at random."""
    counts = Counter(f for found in features.values() for f in found)
    kept = sorted(counts, key=lambda f: (-counts[f], f))[:width]
    column = {f: k for k, f in enumerate(kept)}
    idf = np.array([math.log(len(features) / counts[f]) for f in kept], dtype=np.float32)
    ids = list(features)
    vectors = np.zeros((len(ids), len(kept)), dtype=np.float32)
    for row, item in enumerate(ids):
        cols = [column[f] for f in features[item] if f in column]
        vectors[row, cols] = idf[cols]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    some = norms[:, 0] > 0
    return np.asarray(ids)[some], vectors[some] / norms[some]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=Path, required=True,
                   help="items file with item_id and categorical columns (an attributes JSON, CSV, movies.dat)")
    p.add_argument("--columns", nargs="+", required=True, help="the feature columns, as --data.feature_columns")
    p.add_argument("--out", type=Path, required=True, help="the .npz to write")
    args = p.parse_args(argv)
    if args.out.suffix != ".npz":
        p.error(f"--out {args.out}: name a .npz file")
    try:
        features = read_item_features(args.items, args.columns)  # its errors name the file
    except (InputError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    ids, vectors = feature_vectors(features)
    write_item_vectors(args.out, ids, vectors)
    print(f"wrote {len(ids)} of {len(features)} items' feature vectors ({vectors.shape[1]} features wide) to "
          f"{args.out}")


if __name__ == "__main__":
    main()
