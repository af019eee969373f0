"""A cold-item slice of a sequence log: a seeded share of its items taken out of every history and kept as targets.

Trained on the log this writes, with a features file that lists every item, a model meets the held-out items only
through their features: they are cold items (docs/streamrec.md, "Item features and cold items"). Each case is a user
whose history reaches a held-out item after some warm ones; `benchmarks/streamrec_protocols.py --cold FILE` ranks
the case's held-out item among all held-out items (the cold shelf) and over the whole catalogue.

    python data/hold_out_items.py --log ../shared/data/amazon-beauty/Beauty.txt --out data/beauty/cold
    python -m streamrec fit --config configs/streamrec/beauty.yaml --data.path data/beauty/cold/warm.txt \\
        --data.item_features ../shared/data/amazon-beauty/Beauty_item2attributes.json \\
        --data.feature_columns '[attributes]' --trainer.default_root_dir runs/beauty_cold
    python benchmarks/streamrec_protocols.py --ckpt runs/beauty_cold/checkpoints/best.ckpt \\
        --cold data/beauty/cold/cold.json

Input: one user per line, `user item item ...`, oldest first (S3Rec's files). `--share` of the distinct items are
drawn uniformly (seeded). Output, in `--out`: `warm.txt`, the log with the held-out items removed (users left with
none dropped), and `cold.json`: {"held_out": [item, ...], "cases": [{"user", "history", "target"}, ...]}, a case's
target the user's last held-out item that follows a warm one, its history the warm items before it. Both files are
written under temporary names and renamed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from core.runtime.atomic import atomic_path

MAX_LINE = 1 << 20  # characters in one line of the log


def read_log(path: Path) -> dict[str, list[str]]:
    sequences: dict[str, list[str]] = {}
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if len(line) > MAX_LINE:
                sys.exit(f"error: {path}:{number}: a line over {MAX_LINE:,} characters; one user per line expected")
            fields = line.split()
            if len(fields) < 2:
                sys.exit(f"error: {path}:{number}: expected `user item [item ...]`, got {line.strip()!r}")
            if fields[0] in sequences:
                sys.exit(f"error: {path}:{number}: user {fields[0]!r} appears twice; one line per user expected")
            sequences[fields[0]] = fields[1:]
    return sequences


def draw(sequences: dict[str, list[str]], share: float, seed: int) -> list[str]:
    """`share` of the log's distinct items, uniformly, in the order they first occur."""
    items = list(dict.fromkeys(i for seq in sequences.values() for i in seq))
    held = set(random.Random(seed).sample(items, round(share * len(items))))
    return [i for i in items if i in held]


def hold_out(sequences: dict[str, list[str]], held: set[str]) -> tuple[dict[str, list[str]], list[dict]]:
    """The warm log and the cases."""
    warm, cases = {}, []
    for user, seq in sequences.items():
        kept = [i for i in seq if i not in held]
        if kept:
            warm[user] = kept
        first_warm = next((p for p, i in enumerate(seq) if i not in held), len(seq))
        last = max((p for p in range(first_warm + 1, len(seq)) if seq[p] in held), default=None)
        if last is not None:
            cases.append({"user": user, "history": [i for i in seq[:last] if i not in held], "target": seq[last]})
    return warm, cases


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", type=Path, required=True, help="the sequence log, one `user item ...` line per user")
    p.add_argument("--share", type=float, default=0.1, help="the share of distinct items to hold out (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    p.add_argument("--out", type=Path, required=True, help="the folder to write warm.txt and cold.json into")
    args = p.parse_args(argv)
    if not 0.0 < args.share < 1.0:
        p.error(f"--share must lie strictly between 0 and 1, got {args.share}")
    sequences = read_log(args.log)
    held = draw(sequences, args.share, args.seed)
    warm, cases = hold_out(sequences, set(held))
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out / "warm.txt") as tmp:
        tmp.write_text("".join(f"{u} {' '.join(seq)}\n" for u, seq in warm.items()), encoding="utf-8")
    with atomic_path(args.out / "cold.json") as tmp:
        tmp.write_text(json.dumps({"held_out": held, "cases": cases}), encoding="utf-8")
    print(f"held out {len(held):,} items; {len(warm):,} users in {args.out / 'warm.txt'}, "
          f"{len(cases):,} cold cases in {args.out / 'cold.json'}")


if __name__ == "__main__":
    main()
