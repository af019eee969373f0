"""Small helpers shared by the benchmark scripts: interleaved timing, memory probes, tables, JSON.

Benchmarks here report ratios against a baseline measured in the same run, never a lone
absolute time: the CPUs are shared and one run can be 2x slower than the next.
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import multiprocessing
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


# Old-commit baselines (`git show REV:FILE`) import modules by the names they had before the packages were
# split into sub-packages; `with_current_imports` points those imports at where the modules live now.
_MOVED = {
    **{f"core.{m}": f"core.nn.{m}" for m in (
        "attention", "blocks", "cpu_fastpath", "explain", "kv_cache", "loss", "masks", "positions", "stacks",
        "schedule", "optim")},
    **{f"core.{m}": f"core.runtime.{m}" for m in (
        "atomic", "checkpoint", "checkpoint_io", "cli", "curves", "errors", "export", "lock", "logs", "prediction",
        "resume", "serve", "precision", "distributed")},
    **{f"streamrec.{m}": f"streamrec.data.{m}" for m in (
        "readers", "columnar", "interactions", "vocab", "splits", "datasets", "encoded", "items", "constants")},
    "streamrec.data": "streamrec.data.datamodule", "streamrec.model": "streamrec.model.network",
    **{f"streamrec.{m}": f"streamrec.model.{m}" for m in ("module", "losses", "metrics")},
    "streamrec.topk": "streamrec.ranking.topk", "streamrec.predict": "streamrec.ranking.predict",
    "translate.vocab": "translate.data.vocab", "translate.data": "translate.data.corpus",
    "translate.model": "translate.model.transformer", "translate.module": "translate.model.module",
    "translate.search": "translate.search.decoding", "translate.ensemble": "translate.search.ensemble",
    "translate.align": "translate.search.align",
}


def with_current_imports(source: str) -> str:
    """`source` of an old commit, its `from PKG.MODULE import` and `from core import` lines aimed at today's modules."""
    import re

    source = re.sub(r"^(\s*)from core import ", r"\1from core.nn import ", source, flags=re.M)
    return re.sub(r"^(\s*)from ((?:core|streamrec|translate)\.\w+) import ",
                  lambda m: f"{m[1]}from {_MOVED.get(m[2], m[2])} import ", source, flags=re.M)


def ensure_peer_venv(script: str, modules: Sequence[str], venv: str, make_target: str) -> None:
    """Re-run `script` under ROOT/`venv` when one of the peer `modules` does not import here.

    Peers (RecTools, transformers, CTranslate2) live in benchmark-only venvs, never in `.venv`;
    started from another interpreter, a peer benchmark hands itself over to its own.
    """
    try:
        for name in modules:
            importlib.import_module(name)
    except ImportError:
        peer = ROOT / venv
        python = peer / "bin" / "python"
        # Compare prefixes, not executables: every venv's python links to the same interpreter.
        if python.exists() and Path(sys.prefix).resolve() != peer.resolve():
            os.execv(str(python), [str(python), script, *sys.argv[1:]])
        sys.exit(f"error: {'/'.join(modules)} not installed here and {venv} is missing; "
                 f"create it with `make {make_target}` (or `bash benchmarks/envs/{make_target.rsplit('-', 1)[-1]}.sh`)")


def require_bf16_kernels(option: str) -> None:
    """Exit with one line when asked to time bf16 on a CPU where PyTorch runs it through its slow fallback."""
    # Imported here: scripts import _common before re-running themselves in a peer venv; that should not wait for torch.
    from core.runtime.precision import NO_BF16_KERNELS, cpu_has_bf16_kernels

    if not cpu_has_bf16_kernels():
        sys.exit(f"error: {option}: {NO_BF16_KERNELS}, so bf16 timings would measure PyTorch's fallback, not the "
                 "hardware; time fp32 here, bf16 on a CPU that has it")


def time_call(fn: Callable[[], object], sync: Callable[[], None] | None = None, number: int = 1) -> float:
    """Seconds per call of `fn`, averaged over `number` back-to-back calls.

    `sync` (e.g. `torch.cuda.synchronize`) runs before and after, so queued GPU work counts.
    """
    if sync is not None:
        sync()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    if sync is not None:
        sync()
    return (time.perf_counter() - start) / number


def interleave(
    fns: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None] | None = None, number: int = 1
) -> dict[str, list[float]]:
    """Time every function once per round, A B A B ..., so drifting machine load hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(time_call(fn, sync, number))
    return times


def adaptive_repeats(round_s: float, budget_s: float, lo: int = 3, hi: int = 25) -> int:
    """How many rounds fit in `budget_s`, given one round takes `round_s`; clamped to [lo, hi]."""
    return max(lo, min(hi, int(budget_s / max(round_s, 1e-9))))


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median of the per-round ratios num[i] / den[i]: robust to a round slowed for both sides."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux): what can be allocated without swapping."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable line in /proc/meminfo")


def rss_bytes() -> int:
    """Resident set size of this process now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def reset_peak_rss() -> bool:
    """Lower this process's peak-RSS mark to its current RSS (Linux >= 4.0); False if not allowed.

    Without the reset the peak would include whatever import or set-up touched earlier.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int:
    """High-water mark of this process's RSS: VmHWM, which reset_peak_rss lowers.

    Not ru_maxrss: exec keeps the parent's peak there, so a probe started by a big parent
    (subprocess.run, multiprocessing spawn) would report the parent's RSS.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def in_fresh_process(fn: Callable[..., object], args: tuple, preload: Sequence[str], threads: int | None = None):
    """`fn(*args)` in a process of its own, and its result; None when the process dies (killed for memory).

    The process forks from a forkserver that has imported `preload` and run nothing: a clean heap for a memory
    peak, without paying torch's import again (a plain fork of the caller would inherit its busy thread pool,
    which can hang the child). The child re-runs the calling script's top level as __mp_main__: preload what
    that imports. `threads`: torch CPU threads in the child (default torch's choice).
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_send_result, args=(sender, fn, args, threads))
    proc.start()
    sender.close()  # so recv() sees EOF if the child dies
    try:
        return receiver.recv()
    except EOFError:
        return None
    finally:
        proc.join()


def _send_result(sender, fn: Callable[..., object], args: tuple, threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
    sender.send(fn(*args))
    sender.close()


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def print_table(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A right-aligned table (first column left-aligned)."""
    table = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def print_targets(console: Console, targets: dict[str, float], figures: dict[str, float], *,
                  ceilings: bool = False) -> None:
    """One line per target the run measured: its figure against the floor (`ceilings`: the ceiling), met or
    MISSED."""
    for name, bound in targets.items():
        if name in figures:
            met = figures[name] <= bound if ceilings else figures[name] >= bound
            verdict = "met" if met else "[red]MISSED[/]"
            console.print(f"target {name} {'<=' if ceilings else '>='} {bound:g}: {figures[name]:.3f} {verdict}")


def write_json(path: str | Path, figures: dict[str, float]) -> None:
    """Write one flat JSON object name -> finite number; anything else is a bug in the caller."""
    for name, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"figure {name!r} must be a finite number, got {value!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")


def compare_loss_steps(
    fns: dict[str, Callable[[], float]], repeats: int,
) -> tuple[dict[str, float], dict[str, list[float]], list[list[str]]]:
    """A loss step on materialised logits ("naive") against our chunked one ("chunked"), plus any others.

    Each function runs one forward + backward and returns the loss. One call each warms up and
    gives the loss values; a separate call each measures peak RSS above the inputs; then
    `interleave` times them. Returns the naive-vs-chunked figures (ms as medians, speedup as the
    median of per-round ratios), every function's times (for extra rows), and the table rows.
    """
    values = {name: fn() for name, fn in fns.items()}
    peaks = {}
    for name, fn in fns.items():
        gc.collect()
        start = rss_bytes()
        reset_peak_rss()
        fn()
        peaks[name] = max(0.0, (peak_rss_bytes() - start) / 2**20)  # memory freed before the reset reads below 0
    times = interleave(fns, repeats)
    f = {
        "naive_ms": 1e3 * statistics.median(times["naive"]), "chunked_ms": 1e3 * statistics.median(times["chunked"]),
        "naive_peak_mib": peaks["naive"], "chunked_peak_mib": peaks["chunked"],
        "speedup": median_ratio(times["naive"], times["chunked"]),
        "memory_ratio": peaks["naive"] / max(peaks["chunked"], 1e-9),
        "loss_abs_diff": abs(values["naive"] - values["chunked"]),
    }
    rows = [
        ["forward + backward, ms (median)", f"{f['naive_ms']:.0f}", f"{f['chunked_ms']:.0f}", f"{f['speedup']:.2f}x"],
        ["peak memory above inputs, MiB", f"{f['naive_peak_mib']:.0f}", f"{f['chunked_peak_mib']:.0f}",
         f"{f['memory_ratio']:.1f}x"],
        ["loss", f"{values['naive']:.5f}", f"{values['chunked']:.5f}", ""],
    ]
    return f, times, rows
