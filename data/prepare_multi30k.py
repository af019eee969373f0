"""Lowercase, punctuation-normalise and Moses-tokenise Multi30k, as the published systems were trained.

    python data/prepare_multi30k.py --out runs/multi30k_lctok/data
    python data/prepare_multi30k.py --data ../shared/data/multi30k --out DIR --langs en de \\
        --splits train val test_2016_flickr

The Multi30k literature (e.g. 41.0 BLEU for a 4-layer d_model-128 Transformer on En->De
test_2016_flickr) trains on the official `tok/*.lc.norm.tok.*` text and scores lowercased
tokenised output. The corpus folder ships those files for val and test only, so this script
rebuilds them from the raw text for every split, checks that it reproduces the official
tokenised files it can compare against (the match count is printed), and writes
`DIR/{split}.{lang}`: the layout `python -m translate fit --data.train DIR/train` reads.
Each file is written to a temporary name and renamed, so an interrupted run leaves no half file.

sacremoses is a benchmark-only dependency: `pip install -c constraints.txt -e ".[bench]"`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.runtime.atomic import atomic_path

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def moses_lc_tok(lines: list[str], lang: str) -> list[str]:
    """Lowercase, normalise punctuation and Moses-tokenise, as the official Multi30k tok/ files were made."""
    try:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
    except ImportError:
        sys.exit('error: sacremoses is not installed; `pip install -c constraints.txt -e ".[bench]"`')
    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tok.tokenize(norm.normalize(s.lower()), escape=True, return_str=True) for s in lines]


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, or a one-line exit naming the file."""
    if not path.is_file():
        sys.exit(f"error: {path} not found; check the path or the Multi30k folder given with --data")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        sys.exit(f"error: {path} is not UTF-8 (byte {e.start}); Multi30k's raw files are UTF-8")


def write_atomic(path: Path, lines: list[str]) -> None:
    """Write `lines` to `path` via a temporary file, so readers never see a half-written file."""
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(MULTI30K), help=f"raw Multi30k folder (default {MULTI30K})")
    p.add_argument("--out", required=True, help="output folder for SPLIT.LANG files (created)")
    p.add_argument("--langs", nargs="+", default=["en", "de"], help="languages (default en de)")
    p.add_argument("--splits", nargs="+", default=["train", "val", "test_2016_flickr"],
                   help="splits (default train val test_2016_flickr)")
    args = p.parse_args(argv)
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in args.splits:
        for lang in args.langs:
            raw = read_lines(data / f"{split}.{lang}")
            tok = moses_lc_tok(raw, lang)
            official = data / "tok" / f"{split}.lc.norm.tok.{lang}"
            check = ""
            if official.is_file():
                ref = read_lines(official)
                same = sum(a == b for a, b in zip(tok, ref, strict=False))
                check = f"; {same} of {len(ref)} lines equal the official {official.name}"
            write_atomic(out / f"{split}.{lang}", tok)
            print(f"{out / f'{split}.{lang}'}: {len(tok)} lines{check}", flush=True)


if __name__ == "__main__":
    main()
