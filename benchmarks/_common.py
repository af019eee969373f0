"""What the benchmark scripts share: interleaved timing, memory probes, tables, JSON, and the shipped configs'
training steps (the cases `cpu_fastpath.py`, `cpu_precision.py` and `hot_path.py` time).

Benchmarks here report ratios against a baseline measured in the same run, never a lone
absolute time: the CPUs are shared and one run can be 2x slower than the next.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import inspect
import json
import math
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


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


def step_peak_bytes(step: Callable[[], object], device: str = "cpu") -> int:
    """Peak memory of one `step()` above what was allocated (CUDA) or resident (CPU) before it.

    On CPU run it in a fresh process (`in_fresh_process`) when the peak must not include earlier work.
    """
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    gc.collect()
    start = rss_bytes()
    reset_peak_rss()
    step()
    return max(0, peak_rss_bytes() - start)  # memory freed before the reset reads below 0


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


def old_tree(commit: str, folder: Path, packages: Sequence[str] = ("core", "streamrec", "translate")) -> Path:
    """`packages` as they were at `commit` (`git archive`), extracted into `folder`; exits with one line if git
    cannot read them."""
    archive = folder / "old.tar"
    res = subprocess.run(["git", "archive", "-o", str(archive), commit, *packages], cwd=ROOT, capture_output=True,
                         text=True)
    if res.returncode:
        sys.exit(f"error: cannot read {', '.join(packages)} at {commit} ({res.stderr.strip()}); "
                 "run from a git checkout that has that commit")
    tree = folder / "old_tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def for_signature(cls: type, **kwargs: object) -> dict[str, object]:
    """`kwargs`, named flat (`attn_dropout=0.2`), as `cls` takes them: a top-level argument, or a field of one of
    its option groups (`block={"attn_dropout": 0.2}`). Lets one case run on trees before and after a grouping."""
    params = inspect.signature(cls).parameters
    out: dict[str, object] = {}
    for name, value in kwargs.items():
        if name in params:
            out[name] = value
            continue
        group = next((g for g, p in params.items() if dataclasses.is_dataclass(p.default)
                      and name in {f.name for f in dataclasses.fields(p.default)}), None)
        if group is None:
            raise TypeError(f"{cls.__name__} takes no {name!r}, neither as an argument nor in an option group")
        out.setdefault(group, {})[name] = value  # type: ignore[union-attr]
    return out


# The shipped configs' training steps: case -> module arguments (flat names). "quick" shrinks every size.
STEP_CASES = {
    # configs/streamrec/ml1m.yaml, fp32 as the config trains
    "streamrec_ml1m": dict(num_items=3416, max_len=200, d_model=128, n_heads=1, n_layers=3, d_ff=256, dropout=0.2),
    # configs/streamrec/beauty.yaml's network, fp32
    "streamrec_beauty": dict(num_items=12101, max_len=50, d_model=64, n_heads=2, n_layers=2, d_ff=256, dropout=0.35,
                             attn_dropout=0.2),
    # StreamRecModule's defaults at ML-1M's shape under bf16 autocast
    "streamrec_ml1m_bf16": dict(num_items=3416, max_len=200),
    # configs/translate/multi30k_en_de.yaml: a 4,096-token batch of 128 x 32, fp32 and bf16 autocast; beam 5 in fp32
    **{f"translate_{name}": dict(src_vocab_size=10000, tgt_vocab_size=10000, d_model=128, n_heads=4,
                                 n_encoder_layers=4, n_decoder_layers=4, d_ff=256, dropout=0.3, ff_dropout=0.0)
       for name in ("multi30k_fp32", "multi30k_bf16", "decode")},
}
QUICK = dict(num_items=50, max_len=12, src_vocab_size=60, tgt_vocab_size=60, d_model=16, n_heads=2, d_ff=32)


def step_case(name: str, *, fastpath: bool = True, bf16: bool | None = None, quick: bool = False) -> Callable[[], None]:
    """One call of case `name` from seed 0: a training step (training_step, backward, AdamW) or a beam search.

    `bf16`: autocast to bf16 (default: as the case's name says). Imports the apps from wherever `sys.path` finds
    them, so `hot_path.py` can build the same case on an older tree.
    """
    import torch

    kwargs = dict(STEP_CASES[name])
    if quick:
        kwargs |= {k: v for k, v in QUICK.items() if k in kwargs}
    bf16 = name.endswith("bf16") if bf16 is None else bf16
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name.startswith("streamrec"):
        from streamrec.data.datasets import TrainBatch
        from streamrec.model.module import StreamRecModule

        module = StreamRecModule(**for_signature(StreamRecModule, **kwargs, cpu_fastpath=fastpath))
        items = torch.randint(1, kwargs["num_items"] + 1, (8 if quick else 128, kwargs["max_len"] + 1), generator=g)
        batch = TrainBatch(inputs=items[:, :-1], targets=items[:, 1:])
    else:
        from translate.data.corpus import Batch
        from translate.data.vocab import BOS_ID, EOS_ID
        from translate.model.module import TranslationModule
        from translate.search.decoding import beam_search

        module = TranslationModule(**for_signature(TranslationModule, **kwargs, cpu_fastpath=fastpath))
        b, t = (4, 6) if quick else (128, 32)
        ids = torch.randint(4, kwargs["tgt_vocab_size"], (2, b, t), generator=g)
        if name == "translate_decode":
            model, n = module.model.eval(), 3 if quick else 19  # n subwords, then the forced EOS
            src = ids[0, :32, :20]
            return lambda: beam_search(model, src, BOS_ID, EOS_ID, beam_size=5, max_len_a=0.0, max_len_b=n, max_len=n)
        tgt_in = torch.cat([torch.full((b, 1), BOS_ID), ids[1, :, :-1]], 1)  # bos + target
        batch = Batch(src=ids[0], tgt_in=tgt_in, tgt_out=ids[1], index=torch.arange(b))
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
    module.train()

    def step() -> None:
        with torch.autocast("cpu", torch.bfloat16) if bf16 else nullcontext():
            loss = module.training_step(batch, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def parse_step_args(doc: str, cases: Sequence[str], number: int, argv: list[str] | None):
    """The options of a script that times step cases against each other, checked; torch threads set.

    Returns (args, console).
    """
    import argparse
    import warnings

    import torch

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", choices=cases, default=list(cases), help="what to time (default: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--number", type=int, default=number, help=f"steps per timing (default {number})")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs, times nothing useful")
    ap.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = ap.parse_args(argv)
    if min(args.threads, args.repeats, args.number) < 1:
        ap.error("--threads, --repeats and --number must be >= 1")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*self.log.*")  # training_step logs; there is no trainer here
    return args, Console(width=None if sys.stdout.isatty() else 120)


def time_pairs(console: Console, args, title: str, labels: tuple[str, str],
               make: Callable[[str, str], Callable[[], None]]) -> dict[str, float]:
    """Each case of `args.cases` under both `labels` (`make(case, label)` builds its call), interleaved rounds;
    prints the table and returns {case}_{label}_ms and {case}_speedup (median of per-round ratios first / second).
    """
    figures: dict[str, float] = {"threads": args.threads, "quick": int(args.quick),
                                 "load_avg_start": os.getloadavg()[0]}
    rows = []
    for case in args.cases:
        fns = {label: make(case, label) for label in labels}
        for fn in fns.values():  # warm-up: oneDNN builds its kernels on the first call
            fn()
        times = interleave(fns, args.repeats, number=args.number)
        ms = {label: statistics.median(t) * 1e3 for label, t in times.items()}
        ratio = median_ratio(times[labels[0]], times[labels[1]])
        figures |= {f"{case}_{label}_ms": ms[label] for label in labels} | {f"{case}_speedup": ratio}
        rows.append([case, f"{ms[labels[0]]:.1f}", f"{ms[labels[1]]:.1f}", f"{ratio:.2f}x"])
    figures["load_avg_end"] = os.getloadavg()[0]
    print_table(console, f"{title}, ms per call, {args.threads} thread(s), load average "
                f"{figures['load_avg_start']:.1f} -> {figures['load_avg_end']:.1f}",
                ["case", f"{labels[0]} ms", f"{labels[1]} ms", "speed-up"], rows)
    return figures
