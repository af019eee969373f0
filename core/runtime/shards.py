"""Work split across jobs (`--shard I/N` in both apps): the argument, and the check a merge makes that a folder
holds every shard of one run, once each."""

from __future__ import annotations

from pathlib import Path

from core.runtime.errors import InputError

Shard = tuple[int, int]


def parse_shard(text: str) -> Shard:
    """'I/N' -> (I, N), with 0 <= I < N."""
    head, sep, tail = text.partition("/")
    if sep and head.strip().isdigit() and tail.strip().isdigit() and int(head) < int(tail):
        return int(head), int(tail)
    raise InputError(f"--shard {text}: write I/N with 0 <= I < N, e.g. 0/4 for the first of 4 shards")


def check_shards(folder: Path, records: dict[Path, dict[str, object]], varying: tuple[str, ...]) -> list[Path]:
    """The files of `records` (each file's record of how it was made) in shard order: all shards I/N of one N,
    once each, with equal records but for the `varying` keys and "shard"."""
    first, base = next(iter(records.items()))
    by_index: dict[int, Path] = {}
    n_shards = None
    for file, record in records.items():
        for key in sorted(set(base) | set(record)):
            if key not in (*varying, "shard") and record.get(key) != base.get(key):
                raise InputError(f"{file.name}: {key} is {record.get(key)!r} but {first.name} has {base.get(key)!r}; "
                                 "merge only shards of one run (same input, checkpoint and settings)")
        if record.get("shard") is None:
            raise InputError(f"{file.name}: not a shard (written without --shard); move it out of {folder}")
        index, n = parse_shard(str(record["shard"]))
        if n_shards is not None and n != n_shards:
            raise InputError(f"{file.name}: shard {index}/{n} but {first.name} is one of {n_shards}")
        n_shards = n
        if index in by_index:
            raise InputError(f"shard {index}/{n} twice: {by_index[index].name} and {file.name}; remove one")
        by_index[index] = file
    if missing := [str(i) for i in range(n_shards) if i not in by_index]:
        raise InputError(f"{folder}: missing shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of "
                         f"{n_shards}; run them with --shard I/{n_shards}")
    return [by_index[i] for i in range(n_shards)]
