"""Attention for long histories: sliding-window and linear attention against full causal attention.

One step: q, k, v of (B, H, T, Dh), out.sum().backward(), on a left-padded batch (the first row's first quarter is
padding). Baselines: `full`, `core.nn.attention.attend` with the (B, 1, T, T) mask of causality and padding that
StreamRec's encoder builds, and `full_nopad`, SDPA's `is_causal` path without a mask (ignores the padding: the best
case for full attention). Against them `core.nn.windowed.windowed_attention` (window W; on CUDA FlexAttention, the
SDPA blocks kept as `window_blocks`) and `core.nn.linear_attention.causal_linear_attention`, both given the
padding as (B, T). Paths interleaved; time = median, ratio = median of per-round ratios full / path (> 1: better
than full). Memory: CPU, each step in a fresh process, peak RSS above its inputs; CUDA, max_memory_allocated.

    python benchmarks/long_attention.py --lengths 4096 --json runs/long_attention.json

Targets at T = 4,096, W = 256: window and linear each >= 3x faster and >= 3x less memory than `full`.

JSON keys: T{T}_{path}_{ms,mem_mib,time_ratio,mem_ratio} (ratios for window, window_blocks, linear), repeats,
window, batch, heads, head_dim.
"""

from __future__ import annotations

import argparse
import os
import statistics
from functools import partial

import _common
import torch
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
    return _common.step_peak_bytes(partial(step, path, args.window, *make_inputs(args, t)), args.device)


def measure(args: argparse.Namespace, t: int, log) -> dict[str, float]:
    paths = PATHS + (("window_blocks",) if args.device == "cuda" else ())  # on CPU "window" is the blocks
    preload = ["torch", "rich.console", "_common", "core.nn.attention", "core.nn.linear_attention", "core.nn.windowed",
               "core.nn.masks"]  # what this script imports: the fresh process's peak is one step's alone
    peaks = {p: peak_bytes(args, p, t) if args.device == "cuda" else
             _common.in_fresh_process(peak_bytes, (args, p, t), preload) for p in paths}
    qkv = make_inputs(args, t)
    sync = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    times = _common.interleave({p: partial(step, p, args.window, *qkv) for p in paths}, args.repeats, sync, warmup=True)
    f: dict[str, float] = {}
    for p in paths:
        f[f"T{t}_{p}_ms"] = statistics.median(times[p]) * 1e3
        if peaks[p] is not None:
            f[f"T{t}_{p}_mem_mib"] = peaks[p] / 2**20
        if p in ("window", "window_blocks", "linear"):
            f[f"T{t}_{p}_time_ratio"] = _common.median_ratio(times["full"], times[p])
            if peaks[p] is not None and peaks["full"] is not None:
                f[f"T{t}_{p}_mem_ratio"] = peaks["full"] / max(peaks[p], 1)
    log.log(f"T {t}: " + ", ".join(f"{p} {f[f'T{t}_{p}_ms']:.1f} ms" for p in paths))
    return f


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available")
    p.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096], help="sequence lengths T")
    # StreamRec's shape by default (batch 32 of its 128 windows, 2 heads of 32): the long histories are its case.
    for flag, default in (("--window", 256), ("--batch", 32), ("--heads", 2), ("--head-dim", 32), ("--repeats", 5)):
        p.add_argument(flag, type=int, default=default, help=f"(default {default})")
    p.add_argument("--threads", type=int, help="torch CPU threads (default torch's choice)")
    p.add_argument("--quick", action="store_true", help="smoke test: T 128, W 16, B 1, 1 repeat")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    args.device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False; use --device cpu")
    if args.quick:
        args.lengths, args.window, args.batch, args.repeats = [128], 16, 1, 1
    for name in ("window", "batch", "heads", "head_dim", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out, log = _common.console(), _common.console(stderr=True)
    out.print(f"[bold]Causal attention for long histories[/], forward+backward, fp32: full (SDPA) vs window "
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
    _common.print_table(out, "ms per step and MiB above the inputs; ratios full / path (above 1: better than full)",
                        ["T", "full ms", "full MiB", "no-pad ms", "no-pad MiB", "window ms", "window MiB", "linear ms",
                         "linear MiB", "window time", "window mem", "linear time", "linear mem"], rows)
    _common.print_targets(out, TARGETS, figures)
    _common.write_json(args.json, figures)


if __name__ == "__main__":
    main()
