"""Attention forward+backward: SDPA (`core.nn.attention.attend`) against the explicit softmax people hand-roll.

The baseline is written inline here (`explicit_step`), not taken from `core`:
softmax(Q K^T / sqrt(Dh)) V, with the future filled with -inf for causal attention and the
softmax in the input dtype. It is `core.nn.attention._attend_explicit` (capture mode) without
the weight capture and the fp32 softmax upcast (the same for fp32).

One step: q, k, v of (B=8, H=8, T, Dh=64) with requires_grad, out = attention(q, k, v),
out.sum().backward().

Time: both paths on the same inputs, interleaved A B A B ... after a warm-up; time = median over rounds, ratio =
median of per-round ratios explicit / SDPA; rounds adapt to T (about 15 s a cell) unless --repeats sets them.
Memory: one step's peak above its inputs, on CPU in a fresh process per path and cell (`_common.in_fresh_process`,
peak RSS), on CUDA from max_memory_allocated. A cell whose estimated need exceeds 60% of free memory is skipped.

    python benchmarks/attention.py                             # CPU fp32, T 128..4096, full and causal
    python benchmarks/attention.py --json runs/attention.json  # also every figure as one flat JSON object
    python benchmarks/attention.py --device cuda               # fp32 and bf16 (flash) on a GPU
    python benchmarks/attention.py --quick --json /tmp/a.json  # smoke test: T 128 and 512, 1 repeat

Targets (non-causal, T=2048): on CPU in fp32 SDPA is >= 1.5x faster and takes >= 4x less
peak memory (`cpu_fp32_T2048_time_ratio` >= 1.5, `cpu_fp32_T2048_mem_ratio` >= 4); on an
H100 in bf16 (flash) SDPA is >= 3x faster (`cuda_bf16_T2048_time_ratio` >= 3).

JSON keys: `{device}_{dtype}[_causal]_T{T}_{figure}`, figure one of sdpa_ms, explicit_ms,
time_ratio, sdpa_mem_mib, explicit_mem_mib, mem_ratio, repeats; a skipped path has
`{path}_needs_gib` instead of its figures.

Legend: B batch, H heads, T time (queries = keys), Dh head width.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from _common import (
    adaptive_repeats,
    gib,
    in_fresh_process,
    interleave,
    median_ratio,
    mem_available_bytes,
    print_table,
    print_targets,
    step_peak_bytes,
    time_call,
    write_json,
)
from rich.console import Console
from torch import Tensor

from core.nn.attention import attend
from core.nn.masks import causal_mask

B, H, DH = 8, 8, 64
LENGTHS = (128, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (128, 512)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PATHS = ("sdpa", "explicit")
# Live (B, H, T, T) matrices at the explicit step's peak: about 4 on CPU in fp32 (scores, weights and their
# grads overlap in backward); rounded up for allocator slack.
EXPLICIT_MATRICES = 4.5
# (B, H, T, Dh) tensors alive in either step: q, k, v, their grads, out, its grad, slack.
IO_TENSORS = 10
MEM_FRACTION = 0.6  # of MemAvailable (or free GPU memory) that one cell may need
REPEAT_BUDGET_S = 15.0  # timing per cell that sets the adaptive number of repeats
MIN_SAMPLE_S = 0.02  # a sample repeats a short step (small T on a GPU) until it takes this long
TARGETS = {"cpu_fp32_T2048_time_ratio": 1.5, "cpu_fp32_T2048_mem_ratio": 4.0, "cuda_bf16_T2048_time_ratio": 3.0}


def sdpa_step(q: Tensor, k: Tensor, v: Tensor, future: Tensor | None) -> None:
    """The fast path: `core.nn.attention.attend`, i.e. SDPA's flash or fused kernels."""
    out = attend(q, k, v, is_causal=future is not None)
    out.sum().backward()


def explicit_step(q: Tensor, k: Tensor, v: Tensor, future: Tensor | None) -> None:
    """The hand-rolled baseline: every (T, T) matrix is materialised and kept for backward."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    if future is not None:
        scores = scores.masked_fill(future, float("-inf"))
    out = scores.softmax(dim=-1) @ v  # (B, H, T, Dh)
    out.sum().backward()


STEPS = {"sdpa": sdpa_step, "explicit": explicit_step}


@dataclass(frozen=True)
class Cell:
    """One table row: device, dtype, causal or not, sequence length."""

    device: torch.device
    dtype: str
    causal: bool
    t: int

    @property
    def prefix(self) -> str:
        return f"{self.device.type}_{self.dtype}{'_causal' if self.causal else ''}_T{self.t}"


def make_inputs(cell: Cell) -> tuple[list[Tensor], Tensor | None]:
    """q, k, v (B, H, T, Dh) that require grad, and the (T, T) mask of hidden future keys when causal."""
    torch.manual_seed(0)
    qkv = [
        torch.randn(B, H, cell.t, DH, device=cell.device, dtype=DTYPES[cell.dtype], requires_grad=True)
        for _ in range(3)
    ]
    future = ~causal_mask(cell.t, device=cell.device) if cell.causal else None  # True = hidden
    return qkv, future


def run_step(path: str, qkv: list[Tensor], future: Tensor | None) -> None:
    for x in qkv:
        x.grad = None  # accumulating into old grads would add an op and keep them alive
    STEPS[path](*qkv, future)


def estimate_bytes(path: str, cell: Cell) -> float:
    """Memory one step of `path` needs, inputs included (see EXPLICIT_MATRICES, IO_TENSORS)."""
    size = DTYPES[cell.dtype].itemsize
    need = IO_TENSORS * B * H * cell.t * DH * size
    if path == "explicit":
        need += EXPLICIT_MATRICES * B * H * cell.t**2 * size + cell.t**2  # + the bool mask
    return need


def memory_budget(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.empty_cache()  # blocks cached from the last cell would read as used
        free, _ = torch.cuda.mem_get_info(device)
        return MEM_FRACTION * free
    return MEM_FRACTION * mem_available_bytes()


def time_cell(cell: Cell, paths: list[str], repeats: int | None) -> tuple[dict[str, list[float]], int]:
    """Per-path seconds per step over interleaved repeats, and the number of repeats.

    `repeats` None picks it from the warm-up so a cell takes about REPEAT_BUDGET_S.
    """
    qkv, future = make_inputs(cell)
    sync = torch.cuda.synchronize if cell.device.type == "cuda" else None
    fns = {p: partial(run_step, p, qkv, future) for p in paths}
    warm = [time_call(fn, sync) for fn in fns.values()]  # first calls pay one-off set-up
    if repeats is None and sum(warm) < 1.0:
        warm = [time_call(fn, sync) for fn in fns.values()]
    number = max(1, min(100, math.ceil(MIN_SAMPLE_S / min(warm))))
    if repeats is None:
        repeats = adaptive_repeats(sum(warm) * number, REPEAT_BUDGET_S)
    return interleave(fns, repeats, sync, number), repeats


def measure_peak(path: str, cell: Cell) -> int:
    """Bytes one step of `path` needs on top of its inputs (on CPU: call it in a fresh process)."""
    qkv, future = make_inputs(cell)
    return step_peak_bytes(partial(run_step, path, qkv, future), cell.device.type)


def peaks_in_fresh_processes(paths: list[str], cell: Cell) -> dict[str, int | None]:
    """measure_peak for each path, each in a fresh process; None where one dies (killed for memory)."""
    preload = ["torch", "rich.console", "_common", "core.nn.attention", "core.nn.masks"]
    return {p: in_fresh_process(measure_peak, (p, cell), preload, torch.get_num_threads()) for p in paths}


def measure_cell(cell: Cell, repeats: int | None, log: Console) -> dict[str, float]:
    """All figures of one cell, keyed without the cell's prefix."""
    budget = memory_budget(cell.device)
    need = {p: estimate_bytes(p, cell) for p in PATHS}
    paths = [p for p in PATHS if need[p] <= budget]
    figures: dict[str, float] = {f"{p}_needs_gib": round(need[p] / 2**30, 1) for p in PATHS if p not in paths}
    if not paths:
        return figures
    times, repeats = time_cell(cell, paths, repeats)
    figures["repeats"] = repeats
    if cell.device.type == "cpu":
        peaks = peaks_in_fresh_processes(paths, cell)
    else:
        peaks = {p: measure_peak(p, cell) for p in paths}
    for p in paths:
        figures[f"{p}_ms"] = statistics.median(times[p]) * 1e3
        if peaks[p] is not None:
            figures[f"{p}_mem_mib"] = peaks[p] / 2**20
    if len(paths) == 2:
        figures["time_ratio"] = median_ratio(times["explicit"], times["sdpa"])
        if "sdpa_mem_mib" in figures and "explicit_mem_mib" in figures:
            figures["mem_ratio"] = figures["explicit_mem_mib"] / max(figures["sdpa_mem_mib"], 1e-3)
    log.log(f"{cell.prefix}: {repeats} repeats, " + ", ".join(f"{p} {figures[f'{p}_ms']:.1f} ms" for p in paths))
    return figures


def _ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def _mib(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def table_rows(figures: dict[str, float], prefixes: list[str]) -> list[list[str]]:
    rows = []
    for prefix in prefixes:
        f = {k[len(prefix) + 1:]: v for k, v in figures.items() if k.startswith(prefix + "_")}
        row = [prefix.rsplit("_T", 1)[1]]
        for kind, fmt in (("ms", _ms), ("mem_mib", _mib)):
            for p in PATHS:
                if f"{p}_needs_gib" in f:
                    row.append(f"skipped (needs ~{f[f'{p}_needs_gib']:.1f} GiB)")
                else:
                    row.append(fmt(f[f"{p}_{kind}"]) if f"{p}_{kind}" in f else "failed")
            ratio = f.get("time_ratio" if kind == "ms" else "mem_ratio")
            row.append("-" if ratio is None else f"{ratio:.2f}x")
        row.append(str(int(f["repeats"])) if "repeats" in f else "-")
        rows.append(row)
    return rows


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        tf32 = "on" if torch.backends.cuda.matmul.allow_tf32 else "off"
        return f"cuda ({torch.cuda.get_device_name(device)}, TF32 matmul {tf32})"
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"cpu ({model}, {os.cpu_count()} cores, {gib(mem_available_bytes())} available)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available")
    p.add_argument("--dtype", nargs="+", choices=tuple(DTYPES), help="default fp32 on CPU, fp32 and bf16 on CUDA")
    p.add_argument("--lengths", nargs="+", type=int, help=f"sequence lengths T (default {' '.join(map(str, LENGTHS))})")
    p.add_argument("--causal", choices=("both", "off", "on"), default="both", help="non-causal, causal or both")
    p.add_argument("--repeats", type=int, help="timed A B rounds per cell (default adaptive, 3..25, fewer at large T)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default torch's choice)")
    p.add_argument("--quick", action="store_true", help=f"T {' '.join(map(str, QUICK_LENGTHS))}, 1 repeat (smoke test)")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False; use --device cpu")
    args.dtype = args.dtype or (["fp32", "bf16"] if args.device == "cuda" else ["fp32"])
    args.lengths = args.lengths or list(QUICK_LENGTHS if args.quick else LENGTHS)
    if args.repeats is None and args.quick:
        args.repeats = 1
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    modes = {"both": [False, True], "off": [False], "on": [True]}[args.causal]
    # rich falls back to 80 columns when piped, which would fold the table.
    console = Console(width=None if sys.stdout.isatty() else 132)
    log = Console(stderr=True, log_path=False, width=None if sys.stderr.isatty() else 132)
    console.print("[bold]Attention forward+backward[/]: SDPA (core.nn.attention.attend) "
                  "vs explicit softmax(QK^T/sqrt(Dh))V written in this script")
    console.print(f"device {describe_device(device)} | torch {torch.__version__} | threads {torch.get_num_threads()} | "
                  f"dtype {', '.join(args.dtype)} | B={B} H={H} Dh={DH} | "
                  f"attention: {' and '.join('causal' if c else 'non-causal' for c in modes)}")
    probe = "peak RSS of a fresh process" if device.type == "cpu" else "torch.cuda.max_memory_allocated"
    console.print(f"repeats {args.repeats or 'adaptive'}, interleaved A B; time = median, ratio = median of per-repeat "
                  f"explicit/SDPA; memory = {probe} minus that with the inputs allocated")

    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        # Busy cores stall every parallel region; the explicit path has many more of them.
        console.print(f"[yellow]load average {load:.1f} on {os.cpu_count()} cores: times are inflated and ratios "
                      "favour SDPA; prefer an idle machine or --threads 1[/]")
    figures: dict[str, float] = {f"{device.type}_threads": torch.get_num_threads(), "load_avg_1min": load}
    tables = []
    for dtype in args.dtype:
        for causal in modes:
            cells = [Cell(device, dtype, causal, t) for t in args.lengths]
            for cell in cells:
                figures.update({f"{cell.prefix}_{k}": v for k, v in measure_cell(cell, args.repeats, log).items()})
            tables.append((f"{dtype}, {'causal' if causal else 'non-causal'}", [c.prefix for c in cells]))

    columns = ["T", "SDPA ms", "explicit ms", "time ratio", "SDPA peak MiB", "explicit peak MiB", "mem ratio", "reps"]
    for title, prefixes in tables:
        print_table(console, title, columns, table_rows(figures, prefixes))
    print_targets(console, TARGETS, figures)
    if args.json:
        write_json(args.json, figures)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
