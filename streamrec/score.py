"""Batch recommendation scoring: top-K items for every user of an interaction log.

    python -m streamrec.score --ckpt CKPT --input FILE --output recs.parquet --top-k 10 \\
        [--include-seen] [--explain] [--batch-size N] [--users FILE] [--items FILE] [--item-chunk N] \\
        [--shard I/N] [--engine local|ray --workers N]

Writes rows `user_id, rank, item_id, score` (original ids; rank 1 = best), as CSV or Parquet
by the output's extension; `--explain` adds the "because you watched" columns
(`because_attention`, `attention_weight`, `because_occlusion`, `occlusion_drop`). `--items FILE`
(see `streamrec.data.items`) adds a `title` column, and `because_attention_title` and
`because_occlusion_title` with `--explain`; an id the file lacks is its own title.

Users are scored from the history in the input, so users unseen in training need no
retraining; history items unknown to the checkpoint are skipped and counted. Results go to
`OUTPUT.parts/` chunk by chunk, each chunk written atomically; a re-run after an interrupt
(Ctrl-C, SIGTERM, kill -9) skips the users already there (`--fresh` starts over instead), and
the final file appears in one rename at the end, so there is never a half-written output or a
duplicated or dropped user. One run at a time writes an output: a second exits at once naming
the holder of `OUTPUT.lock`. A failed run (bad input, full disk, no user scorable) leaves no
`.parts/` or temporary file behind, and an existing OUTPUT untouched. The output's folder must
exist.

At scale: the catalogue is ranked `--item-chunk` items at a time (`streamrec.ranking.topk`), so memory does
not grow with the number of items. On CPU the checkpoint is memory-mapped and the fp32 item table read
from the file as needed (`item_table`); the exact bf16 scan (`--precision bf16`, the default on CPUs with
fast bf16) holds only a bf16 copy (half the size).
`--shard I/N` scores only the users of shard I of N (a stable hash of the user id) for job arrays;
`python -m streamrec.shards merge DIR --output FILE` checks and joins the shards. `--engine ray` scores
on Ray Data (`streamrec.ray_engine`; the `scale` extra): the model is loaded once per worker. A Parquet
output carries its provenance (checkpoint sha256, top-k, exclude-seen, shard, created time, version)
in its schema metadata (`streamrec.shards.read_provenance`).

Built on the Python API (`streamrec.api`: `Recommender.load`, `encode_histories`, `recommend`); the
rows are `streamrec.ranking.predict.recommendation_table`'s, as `python -m streamrec predict` writes them.

Legend: B users in a batch, T history length (the model's max_len), K top-K, N items.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import Tensor

from core.runtime.atomic import atomic_path, stale_temporaries
from core.runtime.errors import InputError, check_text, describe_os_error
from core.runtime.lock import OutputLock, interrupt_on_sigterm
from core.runtime.precision import cpu_has_fast_bf16
from streamrec.api import Recommender, encode_histories, length_batches, recommend
from streamrec.data.readers import Interactions, read_interactions
from streamrec.data.vocab import ItemVocab
from streamrec.model.sasrec import StreamRecModel
from streamrec.ranking.explain import explain_columns
from streamrec.ranking.predict import recommendation_table
from streamrec.ranking.topk import DEFAULT_ITEM_CHUNK, SCAN_CHUNK, FileRows, ScanTable, scan_table
from streamrec.shards import checkpoint_sha256, parse_shard, provenance, shard_users, with_provenance

log = logging.getLogger(__name__)


def load_recommender(ckpt: str | Path, device: str | torch.device = "cpu") -> tuple[StreamRecModel, ItemVocab]:
    """The model (eval mode) and item vocabulary of a checkpoint: `Recommender.load`'s parts, for older callers."""
    rec = Recommender.load(ckpt, device)
    return rec.model, rec.vocab


# ----------------------------------------------------------------------------- output


def _write_table(table: pa.Table, path: Path) -> None:
    """Write atomically: a temporary file in the same folder, then one rename."""
    with atomic_path(path) as tmp:
        if path.suffix == ".csv":
            pacsv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp)


def write_tables(tables: Iterable[pa.Table], path: Path, prov: dict[str, object] | None = None) -> int:
    """Stream tables of one schema into `path` atomically, one in memory at a time; returns the rows written.

    A Parquet file gets `prov` (`streamrec.shards.provenance`) in its schema metadata; CSV has no place for it.
    """
    writer, rows = None, 0
    with atomic_path(path) as tmp:
        try:
            for table in tables:
                if writer is None:
                    schema = table.schema.remove_metadata()
                    if path.suffix == ".csv":
                        writer = pacsv.CSVWriter(tmp, schema)
                    else:
                        writer = pq.ParquetWriter(tmp, schema if prov is None else with_provenance(schema, prov))
                writer.write_table(table.replace_schema_metadata(None))
                rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise InputError(f"{path}: no user could be scored (no history item is known to the checkpoint; "
                             "see the warnings above); nothing was written")
    return rows


class ResumableOutput:
    """Chunks of results in `OUTPUT.parts/`, merged into OUTPUT at the end.

    A manifest records the arguments that shape the results; parts from a different run
    are refused rather than mixed in. The caller holds the output's lock (`core.runtime.lock`), so
    temporary files found here belong to a killed run and are deleted.

    Args:
        output: the final .csv or .parquet file.
        manifest: the arguments that shape the rows.
        fresh: delete the parts of an earlier interrupted run instead of resuming it.
    """

    def __init__(self, output: Path, manifest: dict[str, object], fresh: bool = False):
        self.output = output
        self.parts = output.with_name(output.name + ".parts")
        if fresh and self.parts.exists():
            shutil.rmtree(self.parts)
        self.resumed = self.parts.is_dir()
        self.parts.mkdir(exist_ok=True)
        for tmp in self.parts.glob(".*.tmp"):
            tmp.unlink()
        manifest_path = self.parts / "manifest.json"
        if manifest_path.exists():
            try:
                previous = json.loads(manifest_path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                previous = None
            if previous != manifest:
                raise InputError(f"{self.parts} holds partial results of a run with other arguments; rerun with "
                                 "those arguments to resume it, or pass --fresh to delete it and start over")
        else:
            with atomic_path(manifest_path) as tmp:
                tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")

    def done_users(self) -> set[str]:
        """Users already written by an earlier, interrupted run."""
        done: set[str] = set()
        for part in sorted(self.parts.glob("part-*.parquet")):
            done.update(pq.read_table(part, columns=["user_id"]).column("user_id").to_pylist())
        return done

    def write_part(self, table: pa.Table) -> None:
        n = len(list(self.parts.glob("part-*.parquet")))
        _write_table(table, self.parts / f"part-{n:05d}.parquet")

    def finish(self, prov: dict[str, object] | None = None) -> int:
        """Merge the parts into the output in one atomic write, a part at a time; returns the number of rows."""
        parts = sorted(self.parts.glob("part-*.parquet"))
        rows = write_tables((pq.read_table(p) for p in parts), self.output, prov)
        shutil.rmtree(self.parts)
        return rows

    def discard(self) -> None:
        """After a failure: remove what this run created; the parts of an earlier killed run stay resumable."""
        if not self.parts.exists():
            return
        if self.resumed:
            for tmp in self.parts.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
        else:
            shutil.rmtree(self.parts, ignore_errors=True)


class ItemTable(NamedTuple):
    """The catalogue as scoring reads it: fp32 item vectors (N+1, D), maybe from a file, and the bf16 scan table."""

    vectors: Tensor | FileRows
    scan: ScanTable | None


def scan_precision(choice: str, device: str) -> str:
    """`--precision auto` made concrete: the exact bf16 scan where bf16 matmuls are fast, fp32 elsewhere.

    At 5M items on a 2-core Zen 5 the bf16 scan scored 156 users/s against fp32's 53, in 1,430 MiB
    (docs/results.md, "Scale"), with the same top K. CUDA keeps fp32: the bf16 scan was not measured there.
    """
    if choice != "auto":
        return choice
    return "bf16" if torch.device(device).type == "cpu" and cpu_has_fast_bf16() else "fp32"


def item_table(rec: Recommender, ckpt: str | Path, precision: str, item_chunk: int) -> ItemTable:
    """The item table of a recommender loaded with `mmap=True`, in bounded memory on CPU.

    The fp32 rows are read from the checkpoint file (`streamrec.ranking.topk.FileRows`): the fp32 table (1.2 GB
    at 5M items, D 64) never enters memory whole, and with precision "bf16" the scan reads a bf16 copy
    built a chunk at a time (half the size), then fp32 rows only for the items it re-scores. Elsewhere
    (CUDA, an export folder, a table that is not a mapping of `ckpt`) the model's own table.
    """
    table = rec.model.item_vectors.detach()
    rows = FileRows.mapped(table, ckpt) if Path(ckpt).is_file() else None
    vectors = table if rows is None else rows
    if precision != "bf16" or table.device.type != "cpu":
        return ItemTable(vectors, None)
    return ItemTable(vectors, scan_table(vectors, min(item_chunk, SCAN_CHUNK)))  # 4 MB reads: little for malloc to keep


def _score_users(users: list[str], histories: Mapping[str, list[str]], rec: Recommender,
                 args: argparse.Namespace, counts: dict[str, int], table: ItemTable | None = None) -> pa.Table | None:
    """Recommendations (and explanations) for one batch of users as output rows."""
    kept, ids = [], []
    encoded, unknown = encode_histories([histories[u] for u in users], rec.vocab)  # one vocabulary lookup
    counts["unknown_items"] += sum(map(len, unknown))
    for u, history in zip(users, encoded, strict=True):
        if history:
            kept.append(u)
            ids.append(history)
        else:
            counts["no_history"] += 1
    if not kept:
        return None
    vectors, scan = (None, None) if table is None else table
    inputs, items, scores = recommend(rec.model, ids, args.top_k, args.include_seen, item_chunk=args.item_chunk,
                                      precision=args.precision, vectors=vectors, scan=scan)
    extra = explain_columns(rec.model, inputs, items) if args.explain else {}
    table = recommendation_table(kept, rec.vocab, items.cpu(), scores.cpu(), {k: v.cpu() for k, v in extra.items()})
    return table if rec.catalog is None else _with_titles(table, rec)


def _with_titles(table: pa.Table, rec: Recommender) -> pa.Table:
    """A title column after each item id column (`--items`)."""
    for column, title in (("item_id", "title"), ("because_attention", "because_attention_title"),
                          ("because_occlusion", "because_occlusion_title")):
        if column in table.column_names:
            titles = pa.array([rec.catalog.title(i) for i in table.column(column).to_pylist()], pa.string())
            table = table.add_column(table.column_names.index(column) + 1, title, titles)
    return table


def _in_input_order(table: pa.Table, users: list[str]) -> pa.Table:
    """Rows put back into the users' input order (they were scored sorted by history length)."""
    position = {u: i for i, u in enumerate(users)}
    keys = pa.table({"position": [position[u] for u in table.column("user_id").to_pylist()],
                     "rank": table.column("rank")})
    return table.take(pc.sort_indices(keys, sort_keys=[("position", "ascending"), ("rank", "ascending")]))


MAX_USERS_FILE_BYTES = 1 << 30


def _read_users(path: str) -> list[str]:
    """The user ids listed in `path`, once each, in file order."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--users {path}: no such file")
    if file.stat().st_size > MAX_USERS_FILE_BYTES:
        raise InputError(f"--users {path}: larger than {MAX_USERS_FILE_BYTES:,} bytes; split the user list")
    data = file.read_bytes()
    check_text(data, path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(f"--users {path}: not UTF-8 text (byte {err.start}); write one user id per line") from None
    lines = text.split("\n")
    users = list(dict.fromkeys(line.strip() for line in lines if line.strip()))
    if not users:
        raise InputError(f"--users {path}: the file lists no user; write one user id per line")
    return users


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; user mistakes end with one line on stderr and a non-zero exit status."""
    p = argparse.ArgumentParser(prog="python -m streamrec.score", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint written by `python -m streamrec fit`")
    p.add_argument("--input", required=True, help="interaction log with the users' histories (csv/tsv/parquet/txt)")
    p.add_argument("--output", required=True, help="recommendations file, .csv or .parquet, in an existing folder")
    p.add_argument("--top-k", type=int, default=10, help="items per user (default 10)")
    p.add_argument("--include-seen", action="store_true", help="allow items already in the user's history")
    p.add_argument("--explain", action="store_true", help="add 'because you watched' columns (slower)")
    p.add_argument("--batch-size", type=int, default=256, help="users per forward pass (default 256)")
    p.add_argument("--users", help="file with one user id per line: score only these users")
    p.add_argument("--items", help="item titles: CSV/TSV with item_id,title,... or MovieLens' movies.dat; "
                                   "adds title columns")
    p.add_argument("--format", default="auto", help="input format: auto, csv, tsv, parquet, sasrec, lines")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    p.add_argument("--chunk-users", type=int, default=20_000, help="users per resumable chunk (default 20,000)")
    p.add_argument("--fresh", action="store_true",
                   help="delete OUTPUT.parts/ left by an interrupted run and start over (default: resume it)")
    p.add_argument("--item-chunk", type=int, default=DEFAULT_ITEM_CHUNK,
                   help=f"items ranked at once; memory is about batch-size x item-chunk scores (default "
                        f"{DEFAULT_ITEM_CHUNK:,})")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="bf16: each item chunk scanned in bf16 and the items that can reach the top K (a proven "
                        "bound on bf16 rounding) re-scored in fp32: the same items and scores as fp32, faster and in "
                        "half the memory on CPUs with AVX512-BF16 or AMX (see streamrec.ranking.topk). auto (default): "
                        "bf16 "
                        "on such a CPU, else fp32; the output's provenance records which ran")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads of the local engine (default 0: one per core); 1 where other jobs keep the "
                        "cores busy: waiting for a second thread then costs more than it gives")
    p.add_argument("--shard", help="I/N: score only shard I of N of the users (a stable hash of the user id); "
                                   "merge the N outputs with python -m streamrec.shards merge")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local (this process, resumable) or ray (Ray Data workers; pip install -e '.[scale]')")
    p.add_argument("--workers", type=int, default=2, help="--engine ray: model replicas (default 2)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0,
                   help="--engine ray: CPUs each replica reserves, also its torch threads (default 1)")
    p.add_argument("--ray-address", help="--engine ray: a running cluster (default: start a local one)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    interrupt_on_sigterm()
    try:
        _run(args)
    except KeyboardInterrupt:
        sys.exit(f"interrupted: the users scored so far are kept in {args.output}.parts/; rerun the same command "
                 "to resume, or add --fresh to start over")
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    except OSError as err:  # an unwritable folder, a full disk
        sys.exit(f"error: {describe_os_error(err, args.output)}; nothing was written to {args.output}")


def _check_output(path: Path) -> None:
    """Refuse an output that cannot be written before any work is done."""
    if path.suffix not in (".csv", ".parquet"):
        raise InputError(f"--output {path}: use a .csv or .parquet file name")
    if path.is_dir():
        raise InputError(f"--output {path}: is a folder; name a .csv or .parquet file in it")
    if not path.parent.is_dir():
        raise InputError(f"--output {path}: the folder {path.parent} does not exist; create it first")


def _run(args: argparse.Namespace) -> None:
    if args.top_k < 1 or args.batch_size < 1 or args.chunk_users < 1 or args.item_chunk < 1:
        raise InputError("--top-k, --batch-size, --chunk-users and --item-chunk must be positive")
    if args.workers < 1 or args.cpus_per_worker <= 0 or args.threads < 0:
        raise InputError("--workers and --cpus-per-worker must be positive, --threads 0 or more")
    args.shard_index = None if args.shard is None else parse_shard(args.shard)
    output = Path(args.output)
    _check_output(output)
    with OutputLock(output, "streamrec.score"):  # first: a second writer stops at once, before any work
        for tmp in stale_temporaries(output):  # a final write cut by kill -9; we hold the lock, so no one owns it
            tmp.unlink()
        _score_into(args, output)


def _score_into(args: argparse.Namespace, output: Path) -> None:
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    args.precision = scan_precision(args.precision, device)
    rec = Recommender.load(args.ckpt, device, items=args.items, mmap=True)  # the weights stay in the file until read
    interactions = read_interactions(args.input, args.format)
    pa.default_memory_pool().release_unused()  # the reader's freed blocks, which arrow's pool would keep
    users = _read_users(args.users) if args.users else list(interactions.items)
    missing = [u for u in users if u not in interactions.items]
    if missing:
        log.warning("skipped %d users absent from %s (e.g. %r)", len(missing), args.input, missing[0])
    users = shard_users(users, args.shard_index)
    ckpt = Path(args.ckpt)
    args.provenance = provenance(checkpoint_sha256(ckpt), args.top_k, not args.include_seen, args.shard_index,
                                 explain=args.explain, titles=args.items is not None, precision=args.precision)
    if args.engine == "ray":
        from streamrec.ray_engine import score_with_ray  # ray is an optional extra

        todo = [u for u in users if u in interactions.items]
        rows = score_with_ray(args, todo, interactions, output)
        log.info("wrote %d rows for %d users to %s", rows, len(todo), output)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    manifest = {
        "ckpt": str(ckpt.resolve()), "ckpt_bytes": ckpt.stat().st_size, "input": str(Path(args.input).resolve()),
        "users": args.users, "top_k": args.top_k, "include_seen": args.include_seen, "explain": args.explain,
        "items": str(Path(args.items).resolve()) if args.items else None, "shard": args.shard_index,
        "precision": args.precision,
    }
    out = ResumableOutput(output, manifest, fresh=args.fresh)
    table = item_table(rec, ckpt, args.precision, args.item_chunk)
    try:
        _score_all(args, out, users, interactions, rec, table)
    except KeyboardInterrupt:
        raise  # an interruption: the parts stay, the next run resumes them
    except BaseException:
        out.discard()
        raise


def _score_all(args: argparse.Namespace, out: ResumableOutput, users: list[str], interactions: Interactions,
               rec: Recommender, table: ItemTable | None = None) -> None:
    done = out.done_users()
    todo = [u for u in users if u in interactions.items and u not in done]
    if done:
        log.info("resuming: %d users already scored, %d to go", len(done), len(todo))
    counts = {"unknown_items": 0, "no_history": 0}
    with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()) as bar:
        task = bar.add_task("users", total=len(todo))
        for chunk_start in range(0, len(todo), args.chunk_users):
            chunk = todo[chunk_start : chunk_start + args.chunk_users]
            tables = []
            for batch in length_batches([len(interactions.items[u]) for u in chunk], args.batch_size):
                rows = _score_users([chunk[i] for i in batch], interactions.items, rec, args, counts, table)
                if rows is not None:
                    tables.append(rows)
                bar.advance(task, len(batch))
            if tables:
                out.write_part(_in_input_order(pa.concat_tables(tables), chunk))  # the chunk is durable from here on
    unknown_items, no_history = counts["unknown_items"], counts["no_history"]
    if unknown_items:
        log.warning("skipped %d history items unknown to the checkpoint", unknown_items)
    if no_history:
        log.warning("skipped %d users with no item known to the checkpoint", no_history)
    rows = out.finish(args.provenance)
    log.info("wrote %d rows for %d users to %s", rows, len(done) + len(todo) - no_history, args.output)


if __name__ == "__main__":
    main()
