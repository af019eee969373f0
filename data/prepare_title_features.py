"""Item titles as hashed n-gram features (and, optionally, S3Rec's attribute ids beside them), in a features file
that `--data.item_features` reads: text features without downloaded weights.

    python data/prepare_title_features.py --items ../shared/data/amazon-beauty/items.csv \\
        --attributes ../shared/data/amazon-beauty/Beauty_item2attributes.json --out data/beauty/title_features.csv
    python -m streamrec fit --config configs/streamrec/beauty.yaml \\
        --data.item_features data/beauty/title_features.csv --data.feature_columns '[words, attributes]'

Each title is lowercased and split into words (runs of letters and digits); its features are the word unigrams and
bigrams, and with `--char-ngrams N` the character N-grams of each word (padded with "#" at both ends, fastText's
subwords), each hashed (blake2b, the same on every machine and run) into one of `--buckets` ids, distinct ids kept in
order. The output is `item_id,words[,attributes]`, values separated by "|" as the features reader expects; the
file is written under a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import sys
from pathlib import Path

from core.runtime.atomic import atomic_path

WORD = re.compile(r"[^\W_]+")  # letters and digits, any script


def title_ngrams(title: str, buckets: int, char_ngrams: int = 0) -> list[str]:
    """The title's hashed features as `w<id>` strings, distinct, in order of first occurrence."""
    words = WORD.findall(title.lower())
    grams = [*words, *(f"{a} {b}" for a, b in zip(words, words[1:], strict=False))]
    if char_ngrams:
        for word in words:
            padded = f"#{word}#"
            grams += [f"#c{padded[i : i + char_ngrams]}" for i in range(max(1, len(padded) - char_ngrams + 1))]
    ids = (int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "little") % buckets for g in grams)
    return list(dict.fromkeys(f"w{i}" for i in ids))


def read_titles(path: Path, column: str) -> dict[str, str]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or "item_id" not in reader.fieldnames or column not in reader.fieldnames:
            sys.exit(f"error: {path}: needs an item_id column and a {column!r} column; found {reader.fieldnames}")
        return {row["item_id"]: row[column] or "" for row in reader}


def read_attributes(path: Path) -> dict[str, list[int]]:
    try:
        mapping = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        sys.exit(f"error: {path}: not a JSON object of item id -> attribute ids ({err})")
    if not isinstance(mapping, dict):
        sys.exit(f"error: {path}: not a JSON object of item id -> attribute ids")
    return {str(k): v for k, v in mapping.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=Path, required=True, help="CSV with item_id and a title column")
    p.add_argument("--title-column", default="title", help="the column holding the text (default title)")
    p.add_argument("--attributes", type=Path, help="S3Rec's item2attributes JSON: an `attributes` column beside")
    p.add_argument("--buckets", type=int, default=1 << 14, help="hash buckets (default 16,384)")
    p.add_argument("--char-ngrams", type=int, default=0, metavar="N", help="add each word's character N-grams")
    p.add_argument("--out", type=Path, required=True, help="the features CSV to write")
    args = p.parse_args(argv)
    if args.buckets < 1 or args.char_ngrams < 0:
        p.error("--buckets must be >= 1 and --char-ngrams >= 0")
    titles = read_titles(args.items, args.title_column)
    attributes = read_attributes(args.attributes) if args.attributes else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["item_id", "words", *(["attributes"] if attributes is not None else [])])
        for item, title in titles.items():
            row = [item, "|".join(title_ngrams(title, args.buckets, args.char_ngrams))]
            if attributes is not None:
                row.append("|".join(str(a) for a in attributes.get(item, [])))
            writer.writerow(row)
    print(f"wrote {len(titles)} items to {args.out}")


if __name__ == "__main__":
    main()
