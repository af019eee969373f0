"""Top-K over big catalogues: the full score matrix against item chunks, in one run.

For each catalogue size N, random item vectors (N+1, D) and random user states are ranked two ways,
with each user's 20 "seen" items excluded, in batches of --batch-size users:
  full     the (B, N+1) score matrix, then `torch.topk` (the baseline)
  chunked  `streamrec.ranking.topk.top_k_items`: --item-chunk items at a time with a running top-K merge
  bf16     (with --bf16) the exact bf16 scan: `precision="bf16"` with a `scan_table` (bf16 copy of the
           table, built before its pass), fp32 re-scoring of the items that can reach the top K
  bf16_convert  (with --bf16) the same without a scan table: each fp32 chunk converted to bf16 on the way
           (what `python -m streamrec.score --precision bf16` does: the model's fp32 table stays in memory)
Users/s are medians over interleaved rounds (full, chunked, full, ...); the speedup is the median of the
per-round ratios; "CPU time full/this" compares the median process CPU seconds of the same rounds (less
sensitive to other jobs on shared cores than wall time). Peak RSS is the whole process's high-water
mark during one pass (item table included; `table_mib` is the table alone), reset before each pass.
With --table-file the fp32 table lives in a file, as a table read from disk would: full and chunked
map it into memory (they read all of it), bf16 reads only the rows it needs (`streamrec.ranking.topk.FileRows`);
the mapped pages are dropped from the process before each RSS pass, so a pass counts what it reads.
Agreement: the share of users whose top-K item lists are identical to the full path's
(`same_topk_*`), and bf16's recall@K against exact.

    python benchmarks/streamrec_topk.py                           # 100k, 1M, 5M items (about 3 minutes)
    python benchmarks/streamrec_topk.py --items 100000 --users 256 --json out.json

Random vectors are enough: the cost of ranking depends on N, D, B and K, not on training.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import interleave, median_ratio, peak_rss_bytes, print_table, reset_peak_rss, write_json  # noqa: E402
from rich.console import Console  # noqa: E402

from streamrec.ranking.topk import DEFAULT_ITEM_CHUNK, FileRows, scan_table, top_k_items  # noqa: E402

SEEN = 20  # excluded items per user


def full_matrix(queries: torch.Tensor, vectors: torch.Tensor, k: int, seen: torch.Tensor) -> torch.Tensor:
    """The baseline: `StreamRecModel.score` (the full matrix), the seen items masked, then `torch.topk`."""
    scores = queries @ vectors.T  # (B, N+1)
    scores[:, 0] = float("-inf")
    return scores.scatter_(1, seen, float("-inf")).topk(k, dim=1).indices


def mapped_table(vectors: torch.Tensor, path: Path) -> tuple[torch.Tensor, mmap.mmap]:
    """`vectors` written to `path` and mapped back copy-on-write: only the pages read become resident."""
    vectors.numpy().tofile(path)
    with path.open("r+b") as f:
        mapping = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
    return torch.frombuffer(mapping, dtype=torch.float32).view(vectors.shape), mapping


def run_size(n_items: int, args: argparse.Namespace) -> tuple[dict[str, float], list[list[str]]]:
    g = torch.Generator().manual_seed(n_items)
    vectors = torch.randn(n_items + 1, args.d_model, generator=g) * args.d_model**-0.5  # (N+1, D)
    mapping, tables = None, {}
    if args.table_file:
        folder = tempfile.TemporaryDirectory()
        path = Path(folder.name) / "items.f32"
        vectors, mapping = mapped_table(vectors, path)
        tables["rows"] = FileRows(path, tuple(vectors.shape))
    users = torch.randn(args.users, args.d_model, generator=g)  # (U, D)
    seen = torch.randint(1, n_items + 1, (args.users, SEEN), generator=g)
    batches = [(users[i : i + args.batch_size], seen[i : i + args.batch_size])
               for i in range(0, args.users, args.batch_size)]
    paths: dict[str, Callable[[], list[torch.Tensor]]] = {
        "full": lambda: [full_matrix(q, vectors, args.top_k, s) for q, s in batches],
        "chunked": lambda: [top_k_items(q, vectors, args.top_k, exclude=s, item_chunk=args.item_chunk).items
                            for q, s in batches],
    }
    if args.bf16:  # bf16_convert first: its RSS pass must not hold bf16's scan table
        paths["bf16_convert"] = lambda: [top_k_items(q, vectors, args.top_k, exclude=s, item_chunk=args.item_chunk,
                                                     precision="bf16").items for q, s in batches]
        paths["bf16"] = lambda: [top_k_items(q, tables.get("rows", vectors), args.top_k, exclude=s,
                                             item_chunk=args.item_chunk, precision="bf16", scan=tables["scan"]).items
                                 for q, s in batches]
    results, peaks = {}, {}
    for name, fn in paths.items():  # one pass each: the results and the peak RSS of that pass alone
        if name == "bf16":  # built here: the other passes' peaks do not hold it
            tables["scan"] = scan_table(vectors, args.item_chunk)
        if mapping is not None:
            mapping.madvise(mmap.MADV_DONTNEED)  # the table's pages leave this process; the next read maps them again
        gc.collect()
        reset_peak_rss()
        results[name] = torch.cat(fn())
        peaks[name] = peak_rss_bytes() / 2**20
    cpu_rounds: dict[str, list[float]] = {name: [] for name in paths}
    times = interleave({name: _cpu_timed(fn, cpu_rounds[name]) for name, fn in paths.items()}, args.repeats)
    cpu = {name: statistics.median(t) for name, t in cpu_rounds.items()}
    ups = {name: args.users / statistics.median(t) for name, t in times.items()}
    tag = f"N{n_items}"
    f = {f"{tag}_table_mib": vectors.numel() * 4 / 2**20}
    rows = []
    for name in paths:
        f[f"{tag}_{name}_users_per_s"] = ups[name]
        f[f"{tag}_{name}_peak_rss_mib"] = peaks[name]
        f[f"{tag}_{name}_users_per_cpu_s"] = args.users / cpu[name]
        if name != "full":
            f[f"{tag}_{name}_speedup"] = median_ratio(times["full"], times[name])
            f[f"{tag}_{name}_rss_ratio"] = peaks["full"] / peaks[name]
            f[f"{tag}_{name}_cpu_speedup"] = cpu["full"] / cpu[name]
            f[f"{tag}_{name}_same_topk_share"] = float((results[name] == results["full"]).all(1).float().mean())
        rows.append([f"{n_items:,} items, {name}", f"{ups[name]:.0f}", f"{peaks[name]:.0f}",
                     "1.00x" if name == "full" else f"{f[f'{tag}_{name}_speedup']:.2f}x",
                     "1.00x" if name == "full" else f"{f[f'{tag}_{name}_cpu_speedup']:.2f}x",
                     "1.00x" if name == "full" else f"{f[f'{tag}_{name}_rss_ratio']:.2f}x",
                     "" if name == "full" else f"{f[f'{tag}_{name}_same_topk_share']:.4f}"])
    if args.bf16:
        hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(results["bf16"], results["full"],
                                                                           strict=True))
        f[f"{tag}_bf16_recall"] = hits / results["full"].numel()
    gc.collect()
    return f, rows


def _cpu_timed(fn: Callable[[], object], seconds: list[float]) -> Callable[[], object]:
    """`fn` that appends the process CPU seconds of each call to `seconds`."""
    def timed() -> object:
        start = time.process_time()
        out = fn()
        seconds.append(time.process_time() - start)
        return out
    return timed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", default="100000,1000000,5000000", help="catalogue sizes, comma-separated")
    p.add_argument("--users", type=int, default=512, help="users ranked per pass")
    p.add_argument("--batch-size", type=int, default=128, help="users per matrix (default 128)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--item-chunk", type=int, default=DEFAULT_ITEM_CHUNK)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per size")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--bf16", action="store_true", help="also time the exact bf16 scan and its recall")
    p.add_argument("--table-file", action="store_true",
                   help="keep the fp32 table in a file (mapped by full/chunked, rows read by bf16); see above")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.items.split(",")]
    if min(sizes) < 1 or args.users < 1 or args.batch_size < 1 or args.item_chunk < 1 or args.repeats < 1:
        p.error("--items, --users, --batch-size, --item-chunk and --repeats must be positive")
    torch.set_num_threads(args.threads)
    figures: dict[str, float] = {"users": args.users, "batch_size": args.batch_size, "d_model": args.d_model,
                                 "top_k": args.top_k, "item_chunk": args.item_chunk, "threads": args.threads,
                                 "table_file": int(args.table_file)}
    rows = []
    for n in sizes:
        f, r = run_size(n, args)
        figures.update(f)
        rows += r
    print_table(Console(), f"top-{args.top_k} of {args.users} users, batches of {args.batch_size}, d_model "
                f"{args.d_model}, item chunk {args.item_chunk:,}",
                ["catalogue, path", "users/s", "peak RSS MiB", "speed vs full", "CPU time full/this", "RSS full/this",
                 "same top-K"], rows)
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
