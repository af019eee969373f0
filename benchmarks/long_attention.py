"""Attention for long histories: sliding-window and linear attention against full causal attention.

One step: q, k, v of (B, H, T, Dh) with requires_grad, out = attention(q, k, v), out.sum().backward(),
on a left-padded batch (the first row's first quarter is padding). The baseline is full causal attention
on SDPA as a padded batch needs it (`full`: `core.nn.attention.attend` with the (B, 1, T, T) boolean
mask of causality and padding, which is what StreamRec's encoder builds); `full_nopad` is SDPA's
`is_causal` path without any mask (flash kernels, no T x T tensor at all), the best case for full
attention, which ignores the padding. Against them, `core.nn.windowed.windowed_attention` (window W,
blocked; on CUDA FlexAttention's block-sparse kernel, with the SDPA blocks kept as `window_blocks`) and
`core.nn.linear_attention.causal_linear_attention` (elu + 1 features, chunked), both given the padding as (B, T).

Time: the paths interleaved in one process, A B C A B C ..., after a warm-up; a time is the median over
repeats, a ratio the median of the per-repeat ratios full / path (above 1: faster than full).
Memory (CPU): each path's step in a process of its own (from a forkserver that has imported torch and
core), peak RSS (VmHWM, reset after the inputs are built) above the RSS with its inputs; ratio full /
path (above 1: less memory). On CUDA: max_memory_allocated above the inputs.

    python benchmarks/long_attention.py                            # T 1024 2048 4096, W 256, fp32, B 32 H 2 Dh 32
    python benchmarks/long_attention.py --lengths 4096 --json runs/long_attention.json
    python benchmarks/long_attention.py --quick --json /tmp/l.json # smoke test: tiny sizes, 1 repeat

Targets at T = 4,096, W = 256: windowed and linear each >= 3x faster and <= 1/3 of the memory of full
causal attention on the padded batch (`T4096_window_time_ratio` >= 3, `T4096_window_mem_ratio` >= 3, the
same for linear).

JSON keys: T{T}_{path}_ms, T{T}_{path}_mem_mib, T{T}_{path}_time_ratio, T{T}_{path}_mem_ratio (path:
full, full_nopad, window, linear, and window_blocks on CUDA; ratios against `full`, for the windowed paths and
linear), repeats, window, batch, heads, head_dim.

Legend: B batch, H heads, T time, W window, Dh head width.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from functools import partial

import torch
from _common import (
    in_fresh_process,
    interleave,
    median_ratio,
    print_table,
    print_targets,
    step_peak_bytes,
    time_call,
    write_json,
)
from rich.console import Console
from torch import Tensor

from core.nn.attention import attend
from core.nn.linear_attention import causal_linear_attention
from core.nn.masks import causal_mask, combine_masks
from core.nn.windowed import windowed_attention

PATHS = ("full", "full_nopad", "window", "linear")
TARGETS = {"T4096_window_time_ratio": 3.0, "T4096_window_mem_ratio": 3.0,
           "T4096_linear_time_ratio": 3.0, "T4096_linear_mem_ratio": 3.0}


def step(path: str, window: int, q: Tensor, k: Tensor, v: Tensor, valid: Tensor) -> None:
    for x in (q, k, v):
        x.grad = None
    if path == "full":  # the mask is built inside the step, as the encoder builds it for every batch
        out = attend(q, k, v, combine_masks(valid[:, None, None, :], causal_mask(q.shape[2], device=q.device)))
    elif path == "full_nopad":
        out = attend(q, k, v, is_causal=True)
    elif path == "window":
        out = windowed_attention(q, k, v, window, valid)  # "auto": FlexAttention on CUDA
    elif path == "window_blocks":
        out = windowed_attention(q, k, v, window, valid, kernel="blocks")
    else:
        out = causal_linear_attention(q, k, v, valid)
    out.sum().backward()


def make_inputs(args: argparse.Namespace, t: int) -> list[Tensor]:
    """q, k, v (B, H, T, Dh) that require grad, and the (B, T) padding (the first row's first quarter)."""
    torch.manual_seed(0)
    qkv = [torch.randn(args.batch, args.heads, t, args.head_dim, device=args.device, requires_grad=True)
           for _ in range(3)]
    valid = torch.ones(args.batch, t, dtype=torch.bool, device=args.device)
    valid[0, : t // 4] = False
    return [*qkv, valid]


def peak_bytes(args: argparse.Namespace, path: str, t: int) -> int:
    """Memory one step of `path` needs above its inputs (on CPU: call it in a fresh process)."""
    return step_peak_bytes(partial(step, path, args.window, *make_inputs(args, t)), args.device)


# What a memory probe's process imports before it forks: the script's own imports.
PRELOAD = ["torch", "rich.console", "_common", "core.nn.attention", "core.nn.linear_attention", "core.nn.windowed",
           "core.nn.masks"]


def peak_in_child(args: argparse.Namespace, path: str, t: int) -> int | None:
    """`peak_bytes` in a fresh process (`_common.in_fresh_process`); None if it died."""
    return in_fresh_process(peak_bytes, (args, path, t), PRELOAD)


def measure(args: argparse.Namespace, t: int, log: Console) -> dict[str, float]:
    paths = PATHS + (("window_blocks",) if args.device == "cuda" else ())  # on CPU "window" is the blocks
    peaks = {p: (peak_bytes(args, p, t) if args.device == "cuda" else peak_in_child(args, p, t)) for p in paths}
    qkv = make_inputs(args, t)
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    fns = {p: partial(step, p, args.window, *qkv) for p in paths}
    for fn in fns.values():
        time_call(fn, sync)  # warm-up
    times = interleave(fns, args.repeats, sync)
    f: dict[str, float] = {}
    for p in paths:
        f[f"T{t}_{p}_ms"] = statistics.median(times[p]) * 1e3
        if peaks[p] is not None:
            f[f"T{t}_{p}_mem_mib"] = peaks[p] / 2**20
        if p in ("window", "window_blocks", "linear"):
            f[f"T{t}_{p}_time_ratio"] = median_ratio(times["full"], times[p])
            if peaks[p] is not None and peaks["full"] is not None:
                f[f"T{t}_{p}_mem_ratio"] = peaks["full"] / max(peaks[p], 1)
    log.log(f"T {t}: " + ", ".join(f"{p} {f[f'T{t}_{p}_ms']:.1f} ms" for p in paths))
    return f


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available")
    p.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096], help="sequence lengths T")
    p.add_argument("--window", type=int, default=256, help="sliding window W")
    # StreamRec's shape by default (batch 32 of its 128 windows, 2 heads of 32): the long histories are its case.
    p.add_argument("--batch", type=int, default=32, help="B")
    p.add_argument("--heads", type=int, default=2, help="H")
    p.add_argument("--head-dim", type=int, default=32, help="Dh")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds of all three paths")
    p.add_argument("--threads", type=int, help="torch CPU threads (default torch's choice)")
    p.add_argument("--quick", action="store_true", help="smoke test: T 128, W 16, B 1, 1 repeat")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False; use --device cpu")
    if args.quick:
        args.lengths, args.window, args.batch, args.repeats = [128], 16, 1, 1
    for name in ("window", "batch", "heads", "head_dim", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(t < 1 for t in args.lengths):
        p.error(f"--lengths must be >= 1, got {args.lengths}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=None if sys.stdout.isatty() else 132)
    log = Console(stderr=True, log_path=False, width=None if sys.stderr.isatty() else 132)
    console.print(f"[bold]Causal attention for long histories[/], forward+backward, fp32: full (SDPA) vs window "
                  f"W={args.window} vs linear | device {args.device} | torch {torch.__version__} | threads "
                  f"{torch.get_num_threads()} | B={args.batch} H={args.heads} Dh={args.head_dim} | load average "
                  f"{os.getloadavg()[0]:.2f}")
    figures: dict[str, float] = {"window": args.window, "batch": args.batch, "heads": args.heads,
                                 "head_dim": args.head_dim, "repeats": args.repeats}
    rows = []
    for t in args.lengths:
        f = measure(args, t, log)
        figures.update(f)
        row = [str(t)]
        for p in PATHS:
            mem = f.get(f"T{t}_{p}_mem_mib")
            row += [f"{f[f'T{t}_{p}_ms']:.1f}", "failed" if mem is None else f"{mem:.1f}"]
        for p in ("window", "linear"):
            row += [f"{f[f'T{t}_{p}_time_ratio']:.2f}x", f"{f.get(f'T{t}_{p}_mem_ratio', float('nan')):.2f}x"]
        rows.append(row)
    print_table(console, "ms per step and MiB above the inputs; ratios full / path (above 1: better than full)",
                ["T", "full ms", "full MiB", "no-pad ms", "no-pad MiB", "window ms", "window MiB", "linear ms",
                 "linear MiB", "window time", "window mem", "linear time", "linear mem"], rows)
    print_targets(console, TARGETS, figures)
    if args.json:
        write_json(args.json, figures)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
