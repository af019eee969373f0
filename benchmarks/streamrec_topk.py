"""Top-K over big catalogues: the full score matrix against item chunks, in one run.

For each catalogue size N, random item vectors (N+1, D) and user states are ranked, 20 "seen" items a user
excluded: `full` (the (B, N+1) matrix, then `torch.topk`), `chunked` (`streamrec.ranking.topk.top_k_items`, a
running top-K over --item-chunk items at a time) and with --bf16 the exact bf16 scan over a bf16 `scan_table`
(`bf16`) or converting each fp32 chunk (`bf16_convert`, what `streamrec.score --precision bf16` does). Users/s
are medians of interleaved rounds, speed-ups medians of per-round ratios; peak RSS is the process's high-water
mark of one pass. --table-file keeps the fp32 table in a file (full and chunked map all of it, bf16 reads the rows
it needs). Agreement: the share of users whose top-K equals the full path's, and bf16's recall@K.

    python benchmarks/streamrec_topk.py --items 100000 --users 256 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import mmap
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from _common import console, interleave, median_ratio, peak_rss_bytes, print_table, reset_peak_rss, write_json

from streamrec.ranking.topk import DEFAULT_ITEM_CHUNK, FileRows, scan_table, top_k_items

SEEN = 20  # excluded items per user


def full_matrix(queries: torch.Tensor, vectors: torch.Tensor, k: int, seen: torch.Tensor) -> torch.Tensor:
    """The baseline: `StreamRecModel.score` (the full matrix), the seen items masked, then `torch.topk`."""
    scores = queries @ vectors.T  # (B, N+1)
    scores[:, 0] = float("-inf")
    return scores.scatter_(1, seen, float("-inf")).topk(k, dim=1).indices


def run_size(n_items: int, args: argparse.Namespace) -> tuple[dict[str, float], list[list[str]]]:
    g = torch.Generator().manual_seed(n_items)
    vectors = torch.randn(n_items + 1, args.d_model, generator=g) * args.d_model**-0.5  # (N+1, D)
    mapping, tables = None, {}
    if args.table_file:
        folder = tempfile.TemporaryDirectory()
        path = Path(folder.name) / "items.f32"
        vectors.numpy().tofile(path)
        with path.open("r+b") as file:  # mapped back copy-on-write: only the pages read become resident
            mapping = mmap.mmap(file.fileno(), 0, flags=mmap.MAP_PRIVATE)
        vectors = torch.frombuffer(mapping, dtype=torch.float32).view(vectors.shape)
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
    times = interleave(paths, args.repeats)
    ups = {name: args.users / statistics.median(t) for name, t in times.items()}
    tag = f"N{n_items}"
    f = {f"{tag}_table_mib": vectors.numel() * 4 / 2**20}
    rows = []
    for name in paths:
        f[f"{tag}_{name}_users_per_s"] = ups[name]
        f[f"{tag}_{name}_peak_rss_mib"] = peaks[name]
        if name != "full":
            f[f"{tag}_{name}_speedup"] = median_ratio(times["full"], times[name])
            f[f"{tag}_{name}_rss_ratio"] = peaks["full"] / peaks[name]
            f[f"{tag}_{name}_same_topk_share"] = float((results[name] == results["full"]).all(1).float().mean())
        rows.append([f"{n_items:,} items, {name}", f"{ups[name]:.0f}", f"{peaks[name]:.0f}",
                     "1.00x" if name == "full" else f"{f[f'{tag}_{name}_speedup']:.2f}x",
                     "1.00x" if name == "full" else f"{f[f'{tag}_{name}_rss_ratio']:.2f}x",
                     "" if name == "full" else f"{f[f'{tag}_{name}_same_topk_share']:.4f}"])
    if args.bf16:
        hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(results["bf16"], results["full"],
                                                                           strict=True))
        f[f"{tag}_bf16_recall"] = hits / results["full"].numel()
    gc.collect()
    return f, rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", default="100000,1000000,5000000", help="catalogue sizes, comma-separated")
    p.add_argument("--users", type=int, default=512, help="users ranked per pass")
    p.add_argument("--batch-size", type=int, default=128, help="users per matrix (default 128)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--item-chunk", type=int, default=DEFAULT_ITEM_CHUNK)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per size")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--bf16", action="store_true", help="also time the exact bf16 scan and its recall")
    p.add_argument("--table-file", action="store_true", help="keep the fp32 table in a file, read as it is needed")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.items.split(",")]
    if min(sizes) < 1 or args.users < 1 or args.batch_size < 1 or args.item_chunk < 1 or args.repeats < 1:
        p.error("--items, --users, --batch-size, --item-chunk and --repeats must be positive")
    torch.set_num_threads(args.threads)
    figures: dict[str, float] = {k: int(getattr(args, k)) for k in ("users", "batch_size", "d_model", "top_k",
                                                                     "item_chunk", "threads", "table_file")}
    rows = []
    for n in sizes:
        f, r = run_size(n, args)
        figures.update(f)
        rows += r
    print_table(console(), f"top-{args.top_k} of {args.users} users, batches of {args.batch_size}, d_model "
                f"{args.d_model}, item chunk {args.item_chunk:,}",
                ["catalogue, path", "users/s", "peak RSS MiB", "speed vs full", "RSS full/this", "same top-K"], rows)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
