"""MovieLens-1M genres keyed by the SASRec item ids that `configs/streamrec/ml1m.yaml`'s log uses.

    python data/prepare_ml1m_features.py                 # writes data/ml1m/genres.csv
    python data/prepare_ml1m_features.py --ml1m ../shared/data/ml-1m --out data/ml1m/genres.csv

The SASRec file numbers movies 1..3,416 in its own order; `movies.dat` (MovieID::Title::Genres) uses
GroupLens' MovieIDs, and `sas_mapping/sas_to_original_items.txt` (`sas_id movie_id` per line) joins
the two. Reading `movies.dat` directly against the SASRec log would give every item another movie's
genres, so this writes `item_id,title,genres` with the SASRec ids (genres separated by "|"), which
`--data.item_features` reads. The file is written under a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from core.runtime.atomic import atomic_path

ML1M = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-1m"
OUT = Path(__file__).resolve().parent / "ml1m" / "genres.csv"


def read_movies(path: Path) -> dict[str, tuple[str, str]]:
    """MovieID -> (title, genres) from movies.dat (Latin-1, as GroupLens ships it)."""
    movies = {}
    for n, line in enumerate(path.read_text(encoding="latin-1").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("::")
        if len(parts) != 3:
            sys.exit(f"error: {path}:{n}: expected MovieID::Title::Genres, got {line[:80]!r}")
        movies[parts[0]] = (parts[1], parts[2])
    return movies


def read_mapping(path: Path) -> list[tuple[str, str]]:
    """(sas_id, movie_id) pairs from `sas_to_original_items.txt`."""
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            sys.exit(f"error: {path}:{n}: expected `sas_id movie_id`, got {line[:80]!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ml1m", type=Path, default=ML1M, help="folder holding movies.dat and sas_mapping/")
    p.add_argument("--out", type=Path, default=OUT, help="the CSV to write")
    args = p.parse_args(argv)
    movies_file, mapping_file = args.ml1m / "movies.dat", args.ml1m / "sas_mapping" / "sas_to_original_items.txt"
    for f in (movies_file, mapping_file):
        if not f.is_file():
            sys.exit(f"error: {f} not found; pass --ml1m, the folder that holds movies.dat and sas_mapping/")
    movies = read_movies(movies_file)
    pairs = read_mapping(mapping_file)
    missing = [movie for _, movie in pairs if movie not in movies]
    if missing:
        sys.exit(f"error: {mapping_file}: MovieID {missing[0]} (and {len(missing) - 1} more) not in {movies_file}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["item_id", "title", "genres"])
        writer.writerows([sas, *movies[movie]] for sas, movie in pairs)
    print(f"wrote {args.out}: {len(pairs)} items")


if __name__ == "__main__":
    main()
