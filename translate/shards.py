"""Translation split across jobs: the lines a shard translates, the record beside each part, the merge.

    python -m translate.infer --ckpt CKPT -i big.en -o parts/part-3.de --shard 3/16    # job 3 of 16
    python -m translate.shards merge parts/ --output big.de

The input is cut into blocks of `--chunk-lines` lines; block b belongs to shard b mod N, so every shard reads the whole
file but translates only its blocks, and a long file's shards get equal shares of it. Each part's record
(`PART.shard.json`) names its shard, block size, the input's line count and the settings that shape its lines; `merge`
checks that all N parts of one run are there, then interleaves their blocks back into input order in one atomic rename,
reading each part a line at a time."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from core.runtime.atomic import atomic_path, atomic_write_text
from core.runtime.errors import InputError, exit_on_error
from core.runtime.shards import Shard, check_shards

RECORD = ".shard.json"


def shard_runs(chunks: Iterable[list[str]], block: int, shard: Shard | None, skip: int = 0,
               ) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, lines) of the runs of consecutive lines this shard translates, past the first
    `skip` of them (those a resumed run has already written); every line when `shard` is None."""
    first = 1
    for lines in chunks:
        start = 0
        while start < len(lines):
            number = first + start
            stop = len(lines) if shard is None else min(len(lines), start + block - (number - 1) % block)
            if shard is None or (number - 1) // block % shard[1] == shard[0]:
                cut = min(skip, stop - start)
                skip -= cut
                if start + cut < stop:
                    yield number + cut, lines[start + cut : stop]
            start = stop
        first += len(lines)


def write_record(part: Path, record: dict[str, object]) -> None:
    atomic_write_text(part.with_name(part.name + RECORD), json.dumps(record, indent=1) + "\n")


def merge(folder: str | Path, output: str | Path) -> int:
    """Check the parts in `folder` and interleave them into `output` atomically; returns the lines written."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of parts")
    records = {p.with_name(p.name.removesuffix(RECORD)): json.loads(p.read_text())
               for p in sorted(folder.glob("*" + RECORD))}
    if not records:
        raise InputError(f"{folder}: no part record (*{RECORD}) in it; write parts with translate.infer --shard I/N")
    parts = check_shards(folder, records, ())
    if lost := [part.name for part in parts if not part.is_file()]:
        raise InputError(f"{folder}: the parts {', '.join(lost)} have records but are not there; translate them again")
    base = next(iter(records.values()))
    block, total = int(base["block"]), int(base["input_lines"])
    with atomic_path(output) as tmp, open(tmp, "wb") as out:
        readers = [open(part, "rb") for part in parts]
        try:
            for b in range(-(-total // block)):
                for _ in range(min(block, total - b * block)):
                    line = readers[b % len(parts)].readline()
                    if not line.endswith(b"\n"):
                        raise InputError(f"{parts[b % len(parts)]}: ends before block {b}; translate that shard again")
                    out.write(line)
            for part, reader in zip(parts, readers, strict=True):
                if reader.readline():
                    raise InputError(f"{part}: has more lines than its shard of {total}; translate that shard again")
        finally:
            for reader in readers:
                reader.close()
    return total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m translate.shards", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="check the parts in a folder and merge them into one file in input order")
    m.add_argument("folder", help="folder holding the N parts of one run and their records")
    m.add_argument("--output", required=True, help="the merged translation (written atomically)")
    args = p.parse_args(argv)
    with exit_on_error(args.output, not_written=True):
        lines = merge(args.folder, args.output)
    print(f"merged {lines} lines into {args.output}")


if __name__ == "__main__":
    main()
