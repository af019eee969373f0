"""Attention forward+backward: SDPA (`core.nn.attention.attend`) against the explicit softmax people hand-roll.

The baseline is written here: softmax(Q K^T / sqrt(Dh)) V, the future filled with -inf when causal, the softmax in
the input dtype. One step: q, k, v of (B=8, H=8, T, Dh=64) with requires_grad, out.sum().backward(). Time: both
paths interleaved after a warm-up; time = median, ratio = median of per-round ratios explicit / SDPA; rounds adapt
to T (about 15 s a cell) unless --repeats sets them. Memory: one step's peak above its inputs, on CPU in a fresh
process per path and cell (peak RSS), on CUDA from max_memory_allocated; a cell whose estimated need exceeds 60%
of free memory is skipped.

    python benchmarks/attention.py --json runs/attention.json  # CPU fp32, T 128..4096, full and causal
    python benchmarks/attention.py --device cuda               # fp32 and bf16 (flash) on a GPU

Targets (non-causal, T=2048): CPU fp32 SDPA >= 1.5x faster and >= 4x less peak memory; H100 bf16 >= 3x faster.

JSON keys: `{device}_{dtype}[_causal]_T{T}_{figure}`, figure one of sdpa_ms, explicit_ms, time_ratio, sdpa_mem_mib,
explicit_mem_mib, mem_ratio, repeats; a skipped path has `{path}_needs_gib` instead.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from pathlib import Path

import _common
import torch

from core.nn.attention import attend
from core.nn.masks import causal_mask

B, H, DH = 8, 8, 64
LENGTHS, QUICK_LENGTHS = (128, 512, 1024, 2048, 4096), (128, 512)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PATHS = ("sdpa", "explicit")
EXPLICIT_MATRICES = 4.5  # live (B, H, T, T) matrices at the explicit step's peak (scores, weights, their grads)
IO_TENSORS = 10  # (B, H, T, Dh) tensors alive in either step: q, k, v, their grads, out, its grad, slack
TARGETS = {"cpu_fp32_T2048_time_ratio": 1.5, "cpu_fp32_T2048_mem_ratio": 4.0, "cuda_bf16_T2048_time_ratio": 3.0}


def make_step(path: str, device: str, dtype: str, causal: bool, t: int):
    """A call that runs one step of `path` on q, k, v (B, H, T, Dh) built here once, seeded."""
    torch.manual_seed(0)
    qkv = [torch.randn(B, H, t, DH, device=device, dtype=DTYPES[dtype], requires_grad=True) for _ in range(3)]
    future = ~causal_mask(t, device=device) if causal else None  # True = hidden

    def run() -> None:
        for x in qkv:
            x.grad = None  # accumulating into old grads would add an op and keep them alive
        q, k, v = qkv
        if path == "sdpa":
            out = attend(q, k, v, is_causal=causal)
        else:  # every (T, T) matrix materialised and kept for backward
            scores = q @ k.transpose(-2, -1) / math.sqrt(DH)  # (B, H, T, T)
            if future is not None:
                scores = scores.masked_fill(future, float("-inf"))
            out = scores.softmax(dim=-1) @ v  # (B, H, T, Dh)
        out.sum().backward()
    return run


def peak(path: str, device: str, dtype: str, causal: bool, t: int) -> int:
    return _common.step_peak_bytes(make_step(path, device, dtype, causal, t), device)


def measure_cell(device: str, dtype: str, causal: bool, t: int, repeats: int | None, log) -> dict[str, float]:
    """All figures of one cell, keyed without the cell's prefix."""
    if device == "cuda":
        torch.cuda.empty_cache()  # blocks cached from the last cell would read as used
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())  # values in KiB
    budget = 0.6 * (torch.cuda.mem_get_info()[0] if device == "cuda" else int(meminfo["MemAvailable"].split()[0]) << 10)
    size = DTYPES[dtype].itemsize
    need = {p: IO_TENSORS * B * H * t * DH * size + (p == "explicit") * (EXPLICIT_MATRICES * B * H * t**2 * size + t**2)
            for p in PATHS}
    paths = [p for p in PATHS if need[p] <= budget]
    f: dict[str, float] = {f"{p}_needs_gib": round(need[p] / 2**30, 1) for p in PATHS if p not in paths}
    if not paths:
        return f
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    fns = {p: make_step(p, device, dtype, causal, t) for p in paths}
    warm = [_common.time_call(fn, sync) for fn in fns.values()]  # first calls pay one-off set-up
    if repeats is None and sum(warm) < 1.0:
        warm = [_common.time_call(fn, sync) for fn in fns.values()]
    number = max(1, min(100, math.ceil(0.02 / min(warm))))  # a sample lasts >= 20 ms
    repeats = repeats or max(3, min(25, int(15.0 / (sum(warm) * number))))
    times = _common.interleave(fns, repeats, sync, number)
    f["repeats"] = repeats
    preload = ["torch", "rich.console", "_common", "core.nn.attention", "core.nn.masks"]
    for p in paths:
        args = (p, device, dtype, causal, t)
        mem = _common.in_fresh_process(peak, args, preload, torch.get_num_threads()) if device == "cpu" else peak(*args)
        f[f"{p}_ms"] = statistics.median(times[p]) * 1e3
        if mem is not None:
            f[f"{p}_mem_mib"] = mem / 2**20
    if len(paths) == 2:
        f["time_ratio"] = _common.median_ratio(times["explicit"], times["sdpa"])
        if "sdpa_mem_mib" in f and "explicit_mem_mib" in f:
            f["mem_ratio"] = f["explicit_mem_mib"] / max(f["sdpa_mem_mib"], 1e-3)
    log.log(f"T{t}: {repeats} repeats, " + ", ".join(f"{p} {f[f'{p}_ms']:.1f} ms" for p in paths))
    return f


def row(t: int, f: dict[str, float]) -> list[str]:
    cells = [str(t)]
    for kind, ratio in (("ms", "time_ratio"), ("mem_mib", "mem_ratio")):
        for p in PATHS:
            cells.append(f"skipped (needs ~{f[f'{p}_needs_gib']:.1f} GiB)" if f"{p}_needs_gib" in f
                         else f"{f[f'{p}_{kind}']:,.2f}" if f"{p}_{kind}" in f else "failed")
        cells.append(f"{f[ratio]:.2f}x" if ratio in f else "-")
    return [*cells, str(int(f["repeats"])) if "repeats" in f else "-"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available")
    p.add_argument("--lengths", nargs="+", type=int, help=f"sequence lengths T (default {LENGTHS})")
    p.add_argument("--repeats", type=int, help="timed rounds per cell (default adaptive, 3..25)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default torch's choice)")
    p.add_argument("--quick", action="store_true", help=f"T {QUICK_LENGTHS}, 1 repeat (smoke test)")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False; use --device cpu")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = ["fp32", "bf16"] if device == "cuda" else ["fp32"]
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS)
    repeats = args.repeats or (1 if args.quick else None)
    out, log = _common.console(), _common.console(stderr=True)
    load = os.getloadavg()[0]
    where = torch.cuda.get_device_name() if device == "cuda" else f"{os.cpu_count()} CPU cores, load {load:.1f}"
    out.print(f"[bold]Attention forward+backward[/]: SDPA vs explicit softmax | {where} | torch {torch.__version__} "
              f"| threads {torch.get_num_threads()} | B={B} H={H} Dh={DH}")
    f: dict[str, float] = {f"{device}_threads": torch.get_num_threads(), "load_avg_1min": load}
    columns = ["T", "SDPA ms", "explicit ms", "time ratio", "SDPA peak MiB", "explicit peak MiB", "mem ratio", "reps"]
    for dtype in dtypes:
        for causal in (False, True):
            rows = []
            for t in lengths:
                cell = measure_cell(device, dtype, causal, t, repeats, log)
                f |= {f"{device}_{dtype}{'_causal' if causal else ''}_T{t}_{k}": v for k, v in cell.items()}
                rows.append(row(t, cell))
            _common.print_table(out, f"{dtype}, {'causal' if causal else 'non-causal'}", columns, rows)
    _common.print_targets(out, TARGETS, f)
    _common.write_json(args.json, f)


if __name__ == "__main__":
    main()
