"""Scoring split across jobs: which users a shard scores, the provenance every Parquet output carries, the merge.

    python -m streamrec.score --ckpt CKPT --input LOG --shard 3/16 --output recs/part-03.parquet   # job 3 of 16
    python -m streamrec.shards merge recs/ --output recs.parquet

A user belongs to shard `blake2b(user_id) mod N`: stable across processes, machines and Python versions (unlike `hash`),
so the N shards are disjoint and together cover every user. Each Parquet output carries its provenance in the schema
metadata (key `streamrec.provenance`, JSON): checkpoint sha256, top-k, exclude-seen, the other settings that shape the
rows, created time, package version and shard i/N. `merge` checks that all N shards are there, once each, with the same
provenance and no user twice or in the wrong shard, then writes OUTPUT in one atomic rename, one shard in memory at a
time. Read provenance with `read_provenance(path)`."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from core.runtime.atomic import atomic_path
from core.runtime.errors import InputError, exit_on_error
from core.runtime.shards import check_shards, parse_shard

PROVENANCE_KEY = b"streamrec.provenance"
VARYING = ("created", "shard")  # the provenance fields shards of one run may differ in


def shard_of(user_id: str, n_shards: int) -> int:
    """The shard a user belongs to: a stable hash of the id, modulo `n_shards`."""
    digest = hashlib.blake2b(user_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n_shards


def shard_users(users: Iterable[str], shard: tuple[int, int] | None) -> list[str]:
    """The users of shard (I, N), order kept; all of them for None."""
    if shard is None:
        return list(users)
    index, n_shards = shard
    return [u for u in users if shard_of(u, n_shards) == index]


def checkpoint_sha256(path: str | Path) -> str:
    """sha256 of a checkpoint file, or of an export folder's files (names and contents, sorted by name)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with file.open("rb") as f:
            hashlib.file_digest(f, lambda: digest)
    return digest.hexdigest()


def package_version() -> str:
    try:
        return metadata.version("transformer-apps")
    except metadata.PackageNotFoundError:
        return "unknown"


def checkpoints_sha256(paths: Sequence[str | Path]) -> str:
    """One checkpoint's `checkpoint_sha256`; an ensemble's, the sha256 of its members' digests in the order given."""
    if len(paths) == 1:
        return checkpoint_sha256(paths[0])
    return hashlib.sha256(",".join(checkpoint_sha256(p) for p in paths).encode()).hexdigest()


def provenance(ckpt_sha256: str, top_k: int, exclude_seen: bool, shard: tuple[int, int] | None,
               **settings: object) -> dict[str, object]:
    """The provenance of one output; `settings` are the other arguments that shape its rows."""
    return {"checkpoint_sha256": ckpt_sha256, "top_k": top_k, "exclude_seen": exclude_seen, **settings,
            "shard": None if shard is None else f"{shard[0]}/{shard[1]}",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "version": package_version()}


def provenance_metadata(prov: dict[str, object]) -> dict[bytes, bytes]:
    return {PROVENANCE_KEY: json.dumps(prov).encode()}


def read_provenance(path: str | Path) -> dict[str, object]:
    """The provenance stored in a Parquet output's schema metadata."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (pa.ArrowInvalid, OSError) as err:
        raise InputError(f"{path}: not a readable Parquet file ({err})") from None
    if PROVENANCE_KEY not in meta:
        raise InputError(f"{path}: no streamrec provenance in its metadata; write it with python -m streamrec.score")
    return json.loads(meta[PROVENANCE_KEY])


def merge(folder: str | Path, output: str | Path) -> int:
    """Check the shards in `folder` and write them into `output` atomically; returns the number of rows."""
    folder, output = Path(folder), Path(output)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of shards")
    if output.suffix != ".parquet":
        raise InputError(f"--output {output}: name a .parquet file")
    files = [p for p in sorted(folder.glob("*.parquet")) if p.resolve() != output.resolve()]
    if not files:
        raise InputError(f"{folder}: no .parquet shard in it; write them with python -m streamrec.score --shard I/N")
    provs = {f: read_provenance(f) for f in files}
    n_shards = len(check_shards(folder, provs, VARYING))
    first, seen, rows = files[0], {}, 0
    schema = pq.read_schema(first)
    with atomic_path(output) as tmp:
        merged = {**provs[first], "shard": None, "merged_shards": n_shards,
                  "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with pq.ParquetWriter(tmp, schema.remove_metadata().with_metadata(provenance_metadata(merged))) as writer:
            for file in files:
                table = pq.read_table(file)
                if not table.schema.remove_metadata().equals(schema.remove_metadata()):
                    raise InputError(f"{file}: its columns differ from {first.name}'s; shards must come from one run")
                index, n_shards = parse_shard(str(provs[file]["shard"]))
                for user in dict.fromkeys(table.column("user_id").to_pylist()):
                    if user in seen:
                        raise InputError(f"user {user!r} is in both {seen[user].name} and {file.name}; rescore one "
                                         "of the shards")
                    if shard_of(user, n_shards) != index:
                        raise InputError(f"{file.name}: user {user!r} belongs to shard {shard_of(user, n_shards)}/"
                                         f"{n_shards}, not {index}/{n_shards}")
                    seen[user] = file
                writer.write_table(table.replace_schema_metadata(None))
                rows += table.num_rows
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m streamrec.shards", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="check the shards in a folder and merge them into one Parquet file")
    m.add_argument("folder", help="folder holding the N shard files (.parquet) of one run")
    m.add_argument("--output", required=True, help="the merged .parquet file (written atomically)")
    args = p.parse_args(argv)
    with exit_on_error(args.output, not_written=True):
        rows = merge(args.folder, args.output)
    print(f"merged {rows} rows into {args.output}")


if __name__ == "__main__":
    main()
