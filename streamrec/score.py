"""Batch recommendation scoring: top-K items for every user of an interaction log.

Writes rows `user_id, rank, item_id, score` (original ids; rank 1 = best), as CSV or Parquet by the output's extension;
`--explain` adds the "because you watched" columns and `--items FILE` the titles. Users are scored from the history in
the input, so users unseen in training need no retraining. The input is read the way the checkpoint's training log was
(its columns, delimiter, header, time format, filter; `streamrec.reading`); the reading flags override that.

A cold user (no history item known to the checkpoint, or a `--users` entry absent from the input) is skipped and named
in `OUTPUT.skipped.txt` (one id per line, what `--users` reads); `--cold-users popular` gives it the items with the most
events in the input instead (score = the event count; the checkpoint keeps no training counts).

Results go to `OUTPUT.parts/` chunk by chunk, each written atomically; a re-run after an interrupt (Ctrl-C, SIGTERM,
kill -9) skips the users already there (`--fresh` starts over), and the final file appears in one rename: never a
half-written output, nor a duplicated or dropped user. A second run on the same output exits naming the holder of
`OUTPUT.lock`. A failed run leaves no `.parts/` or temporary file behind, and an existing OUTPUT untouched.

Memory does not grow with the catalogue: it is ranked `--item-chunk` items at a time, its table read from the checkpoint
as needed. `--shard I/N` scores one shard of the users (`python -m streamrec.shards merge` joins them); a Parquet output
records its provenance in its schema metadata. See docs/streamrec.md."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from core.runtime.atomic import atomic_write_text, stale_temporaries
from core.runtime.errors import InputError, check_output_file, check_text, exit_on_error
from core.runtime.lock import OutputLock, interrupt_on_sigterm
from core.runtime.precision import cpu_has_fast_bf16
from core.runtime.ray_session import add_ray_arguments
from core.runtime.threads import set_threads
from streamrec.api import Recommender
from streamrec.data.interactions import Interactions
from streamrec.model.network import StreamRecModel
from streamrec.ranking.batch import BatchScorer, PopularItems, RankingOptions, write_tables
from streamrec.ranking.topk import DEFAULT_ITEM_CHUNK, SCAN_CHUNK, FileRows, ItemTable, Precision, scan_table
from streamrec.ray_engine import RayOptions, score_with_ray
from streamrec.reading import add_read_arguments, read_overrides
from streamrec.shards import checkpoints_sha256, parse_shard, provenance, provenance_metadata, shard_users

log = logging.getLogger(__name__)


class ResumableOutput:
    """Chunks of results in `OUTPUT.parts/`, merged into OUTPUT at the end. A manifest records the arguments that shape
    the results, so parts of a different run are refused rather than mixed in. The caller holds the output's lock, so
    temporary files found here belong to a killed run."""

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
            except ValueError:  # UnicodeDecodeError too
                previous = None
            if previous != manifest:
                raise InputError(f"{self.parts} holds partial results of a run with other arguments; rerun with "
                                 "those arguments to resume it, or pass --fresh to delete it and start over")
        else:
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1))

    def done_users(self) -> set[str]:
        return {u for part in self.parts.glob("part-*.parquet")
                for u in pq.read_table(part, columns=["user_id"]).column("user_id").to_pylist()}

    def write_part(self, table: pa.Table) -> None:
        n = len(list(self.parts.glob("part-*.parquet")))
        write_tables([table], self.parts / f"part-{n:05d}.parquet")

    def finish(self, metadata: dict[bytes, bytes] | None = None) -> int:
        """Merge the parts into the output in one atomic write, a part at a time; returns the number of rows."""
        parts = sorted(self.parts.glob("part-*.parquet"))
        rows = write_tables((pq.read_table(p) for p in parts), self.output, metadata)
        shutil.rmtree(self.parts)
        return rows

    def discard(self, keep_parts: bool = False) -> None:
        """After a failure or an interruption (`keep_parts`): remove what this run created, its temporaries at
        least; the parts of an earlier killed run stay resumable."""
        if not self.resumed and not keep_parts:
            shutil.rmtree(self.parts, ignore_errors=True)
        for tmp in self.parts.glob(".*.tmp"):  # none once removed
            tmp.unlink(missing_ok=True)


def scan_precision(choice: str, device: str) -> Precision:
    """`--precision auto` made concrete: the exact bf16 scan where the CPU's bf16 matmuls are fast, else fp32
    (CUDA keeps fp32: the bf16 scan is not measured there)."""
    if choice != "auto":
        return choice
    return "bf16" if torch.device(device).type == "cpu" and cpu_has_fast_bf16() else "fp32"


def item_table(model: StreamRecModel, ckpt: str | Path, precision: str) -> ItemTable:
    """The item table of a model loaded with `mmap=True`, in bounded memory on CPU: fp32 rows read from the
    checkpoint file (`FileRows`) as needed, and with "bf16" a bf16 copy built a chunk at a time. Elsewhere (CUDA,
    an export folder) the model's own table."""
    table = model.item_vectors.detach()
    rows = FileRows.mapped(table, ckpt) if Path(ckpt).is_file() else None
    vectors = table if rows is None else rows
    return ItemTable(vectors, scan_table(vectors) if precision == "bf16" and table.device.type == "cpu" else None)


@dataclass(frozen=True)
class ScoreJob:
    """One run of `python -m streamrec.score`: the command line's options (`ranking`: those that shape the ranking;
    `ray`: the Ray engine's, None for the local engine; `read`: the reading flags given)."""

    ckpt: tuple[Path, ...]  # several: an ensemble
    input: str
    output: Path
    ranking: RankingOptions
    device: str = "cpu"
    read: dict[str, object] = field(default_factory=dict)
    cold_users: str = "skip"
    users: str | None = None
    items: str | None = None
    shard: tuple[int, int] | None = None
    chunk_users: int = 20_000
    fresh: bool = False
    threads: int = 0
    ray: RayOptions | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ScoreJob:
        if args.top_k < 1 or args.batch_size < 1 or args.chunk_users < 1 or (args.item_chunk or 1) < 1:
            raise InputError("--top-k, --batch-size, --chunk-users and --item-chunk must be positive")
        if args.workers < 1 or args.cpus_per_worker <= 0 or args.threads < 0:
            raise InputError("--workers and --cpus-per-worker must be positive, --threads 0 or more")
        if not 0 <= args.cold_slots <= args.top_k:
            raise InputError(f"--cold-slots ({args.cold_slots}) must be between 0 and --top-k ({args.top_k})")
        if args.cold_users == "popular" and args.engine == "ray":
            raise InputError("--cold-users popular runs on the local engine; drop it or --engine ray")
        device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
        if len(args.ckpt) > 1 and args.precision == "bf16":
            raise InputError("--precision bf16: an ensemble (several --ckpt) ranks by a mean of probabilities, in "
                             "fp32; drop --precision")
        precision = "fp32" if len(args.ckpt) > 1 else scan_precision(args.precision, device)
        ranking = RankingOptions(top_k=args.top_k, exclude_seen=args.exclude_seen, item_chunk=args.item_chunk,
                                 precision=precision, explain=args.explain,
                                 batch_size=args.batch_size, cold_slots=args.cold_slots)
        return cls(tuple(map(Path, args.ckpt)), args.input, Path(args.output), ranking, device, read_overrides(args),
                   args.cold_users, args.users, args.items, None if args.shard is None else parse_shard(args.shard),
                   args.chunk_users, args.fresh, args.threads,
                   RayOptions(args.workers, args.cpus_per_worker, args.ray_address, args.chunk_users)
                   if args.engine == "ray" else None)

    def provenance(self) -> dict[str, object]:
        r = self.ranking
        return provenance(checkpoints_sha256(self.ckpt), r.top_k, r.exclude_seen, self.shard, explain=r.explain,
                          titles=self.items is not None, precision=r.precision, cold_slots=r.cold_slots,
                          cold_users=self.cold_users)

    def manifest(self) -> dict[str, object]:
        """The settings that shape the rows: parts of an interrupted run are resumed only under the same."""
        r = self.ranking
        return {"ckpt": [str(p.resolve()) for p in self.ckpt], "ckpt_bytes": [p.stat().st_size for p in self.ckpt],
                "input": str(Path(self.input).resolve()), "users": self.users, "top_k": r.top_k,
                "exclude_seen": r.exclude_seen, "explain": r.explain,
                "items": str(Path(self.items).resolve()) if self.items else None,
                "shard": None if self.shard is None else list(self.shard), "precision": r.precision,
                "cold_slots": r.cold_slots, "cold_users": self.cold_users, "read": self.read}


MAX_USERS_FILE_BYTES = 1 << 30


def _read_users(path: str) -> list[str]:
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
    users = list(dict.fromkeys(line.strip() for line in text.split("\n") if line.strip()))
    if not users:
        raise InputError(f"--users {path}: the file lists no user; write one user id per line")
    return users


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; user mistakes end with one line on stderr and a non-zero exit status."""
    p = argparse.ArgumentParser(prog="python -m streamrec.score", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, nargs="+", metavar="CKPT",
                   help="checkpoint written by `python -m streamrec fit`; several (one catalogue): an ensemble, "
                        "ranked by the mean of their probabilities")
    p.add_argument("--input", required=True, help="interaction log with the users' histories (csv/tsv/parquet/txt)")
    p.add_argument("--output", required=True, help="recommendations file, .csv or .parquet, in an existing folder")
    p.add_argument("--top-k", type=int, default=10, help="items per user (default 10)")
    p.add_argument("--exclude-seen", action=argparse.BooleanOptionalAction, default=True,
                   help="leave out items already in the user's history (default: yes)")
    p.add_argument("--explain", action="store_true",
                   help="add 'because you watched' columns (more model calls per user)")
    p.add_argument("--cold-slots", type=int, default=0, metavar="C",
                   help="of the top K, C go to the best cold items of a model trained with item features (items "
                        "known by their features only), placed by score; default 0: one ranking of every item")
    p.add_argument("--batch-size", type=int, default=256, help="users per forward pass (default 256)")
    p.add_argument("--users", help="file with one user id per line: score only these users")
    p.add_argument("--items", help="item titles: CSV/TSV with item_id,title,... or MovieLens' movies.dat; "
                                   "adds title columns")
    p.add_argument("--cold-users", choices=("skip", "popular"), default="skip",
                   help="users with no item known to the checkpoint: skip (default; named in OUTPUT.skipped.txt) "
                        "or popular (the items with the most events in the input, score = their count)")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    p.add_argument("--chunk-users", type=int, default=20_000, help="users per resumable chunk (default 20,000)")
    p.add_argument("--fresh", action="store_true",
                   help="delete OUTPUT.parts/ left by an interrupted run and start over (default: resume it)")
    p.add_argument("--item-chunk", type=int,
                   help=f"items ranked at once; memory is about batch-size x item-chunk scores (default "
                        f"{DEFAULT_ITEM_CHUNK:,}; {SCAN_CHUNK:,} with the bf16 scan, whose scores then stay in cache)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="bf16: a bf16 scan, the items that can reach the top K (a proven bound) re-scored in fp32: "
                        "fp32's items and scores in half the memory, on CPUs with AVX512-BF16 or AMX. auto "
                        "(default): bf16 on such a CPU, else fp32; the output's provenance records which ran")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads of the local engine (default 0: OMP_NUM_THREADS where set, else the CPUs this "
                        "process may use, as fit's --threads); 1 where other jobs keep the cores busy")
    p.add_argument("--shard", help="I/N: score only shard I of N of the users (a stable hash of the user id); "
                                   "merge the N outputs with python -m streamrec.shards merge")
    add_ray_arguments(p, "local (this process, resumable) or ray (Ray Data workers; pip install -e '.[scale]')")
    add_read_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    interrupt_on_sigterm()
    with exit_on_error(args.output, not_written=True, interrupted=f"the users scored so far are kept in "
                       f"{args.output}.parts/; rerun the same command to resume, or add --fresh to start over"):
        run(ScoreJob.from_args(args))


def run(job: ScoreJob) -> None:
    path = job.output  # refused before any work is done
    if path.suffix not in (".csv", ".parquet"):
        raise InputError(f"--output {path}: use a .csv or .parquet file name")
    check_output_file(path, "--output", "a .csv or .parquet file in it")
    with OutputLock(job.output, "streamrec.score"):  # first: a second writer stops at once, before any work
        for tmp in stale_temporaries(job.output):  # a final write cut by kill -9; we hold the lock, so no one owns it
            tmp.unlink()
        _score_into(job)


def _score_into(job: ScoreJob) -> None:
    # mmap: the weights stay in the file until read
    rec = Recommender.load(list(job.ckpt), job.device, items=job.items, mmap=True)
    interactions = rec.read_log(job.input, **job.read)  # as the checkpoint's log was read, with the flags given
    pa.default_memory_pool().release_unused()  # the reader's freed blocks, which arrow's pool would keep
    users = _read_users(job.users) if job.users else list(interactions.items)
    missing = [u for u in users if u not in interactions.items]
    if missing:
        log.warning("%d listed users are absent from %s (e.g. %r)", len(missing), job.input, missing[0])
    users = shard_users(users, job.shard)
    metadata = provenance_metadata(job.provenance())
    if job.ray is not None:
        users = [u for u in users if u in interactions.items]
        if not users:
            raise InputError(f"{job.output}: no user to score (none of the listed users is in {job.input}); "
                             "nothing written")
        rows = score_with_ray(list(job.ckpt), job.items, job.ranking, job.ray, users, interactions, job.output,
                              metadata)
        log.info("wrote %d rows for %d users to %s", rows, len(users), job.output)
        return
    set_threads(job.threads or None)
    out = ResumableOutput(job.output, job.manifest(), fresh=job.fresh)
    popular = PopularItems.count(interactions, rec.vocab, job.ranking.top_k) if job.cold_users == "popular" else None
    scorer = BatchScorer(rec.model, rec.vocab, job.ranking, rec.catalog,
                         item_table(rec.model, job.ckpt[0], job.ranking.precision) if len(job.ckpt) == 1 else None,
                         popular)
    try:
        _score_all(job, out, users, interactions, scorer, metadata)
    except BaseException as err:
        out.discard(keep_parts=isinstance(err, KeyboardInterrupt))  # interrupted: the next run resumes the parts
        raise


SKIPPED_SHOWN = 5  # skipped users named in the log; the file beside the output names them all


def _score_all(job: ScoreJob, out: ResumableOutput, users: list[str], interactions: Interactions,
               scorer: BatchScorer, metadata: dict[bytes, bytes]) -> None:
    done = out.done_users()
    todo = [u for u in users if u not in done]
    if done:
        log.info("resuming: %d users already scored, %d to go", len(done), len(todo))
    histories = interactions.items
    with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()) as bar:
        task = bar.add_task("users", total=len(todo))
        for start in range(0, len(todo), job.chunk_users):
            table = scorer.rows(todo[start : start + job.chunk_users], histories, lambda n: bar.advance(task, n))
            if table.num_rows:
                out.write_part(table)  # the chunk is durable from here on
    if scorer.unknown_items:
        log.warning("skipped %d history items unknown to the checkpoint", scorer.unknown_items)
    if scorer.popular_users:
        log.warning("%d users with no item known to the checkpoint got the %d most popular items of %s",
                    scorer.popular_users, len(scorer.popular.items), job.input)
    rows = out.finish(metadata)
    skipped, path = scorer.skipped, job.output.with_name(job.output.name + ".skipped.txt")
    if not skipped:
        path.unlink(missing_ok=True)  # an earlier run's list would name users this run scored
    else:
        atomic_write_text(path, "".join(f"{u}\n" for u in skipped))
        shown = ", ".join(map(repr, skipped[:SKIPPED_SHOWN])) + (", ..." if len(skipped) > SKIPPED_SHOWN else "")
        log.warning("skipped %d users with no item known to the checkpoint (%s), listed in %s; --cold-users "
                    "popular gives them the most popular items", len(skipped), shown, path)
    log.info("wrote %d rows for %d users to %s", rows, len(done) + len(todo) - scorer.no_history, job.output)


if __name__ == "__main__":
    main()
