"""The Transformer models' hot path, today's tree against an older commit's: did new options slow what existed?

Each case is one of `_common.STEP_CASES` (the shipped configs' training steps, or Translate's beam search), the
fast path on. The `--baseline` tree comes from `git archive`; every measurement is a child process that imports
one tree, builds the case from seed 0, warms it up and times `--number` calls. Rounds alternate baseline, today;
the ratio is the median of the per-round ratios today / baseline (> 1: today is slower).

    python benchmarks/hot_path.py --baseline e671319^ --json runs/bench/hot_path.json
    python benchmarks/hot_path.py --baseline HEAD~1 --quick        # tiny sizes: checks the script runs

JSON keys: {case}_{baseline,today}_ms, {case}_ratio for each case; rounds, number, threads, quick.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from _common import ROOT, STEP_CASES, console, median_ratio, print_table, step_case, time_call, write_json

from core.runtime.precision import cpu_has_bf16_kernels


def old_tree(commit: str, folder: Path) -> Path:
    """core, streamrec and translate as they were at `commit`, extracted into `folder`; one line if git cannot."""
    archive = folder / "old.tar"
    res = subprocess.run(["git", "archive", "-o", str(archive), commit, "core", "streamrec", "translate"], cwd=ROOT,
                         capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"error: cannot read the packages at {commit} ({res.stderr.strip()}); run from a checkout that has it")
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "old_tree", filter="data")
    return folder / "old_tree"


def child(tree: str, case: str, number: int, quick: bool, threads: int) -> None:
    """Time `case` with the apps imported from `tree`; print seconds per call (the median of `number`)."""
    import warnings

    import torch

    import core
    import streamrec
    import translate

    for package in (core, streamrec, translate):  # an editable install must not have won over sys.path
        if not Path(package.__file__).resolve().is_relative_to(Path(tree).resolve()):
            sys.exit(f"error: {package.__name__} was imported from {package.__file__}, not from {tree}")

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", ".*self.log.*")  # training_step logs; there is no trainer here
    fn = step_case(case, quick=quick)
    fn()  # warm-up: oneDNN builds its kernels on the first call
    print(json.dumps({"s": statistics.median(time_call(fn) for _ in range(number))}))


def measure(tree: Path | None, case: str, args: argparse.Namespace) -> float:
    """Seconds per call of `case` in a fresh child importing `tree` (None: today's)."""
    where = str(tree or ROOT)
    code = (f"import sys; sys.path[:0] = [{where!r}, {str(ROOT / 'benchmarks')!r}]; import hot_path; "
            f"hot_path.child({where!r}, {case!r}, {args.number}, {args.quick}, {args.threads})")
    res = subprocess.run([sys.executable, "-c", code], cwd=tree or ROOT, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"error: {case} on {'the baseline' if tree else 'today'}'s tree failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])["s"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="the commit to compare with (any git revision)")
    p.add_argument("--cases", nargs="+", choices=tuple(STEP_CASES), default=list(STEP_CASES))
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument("--number", type=int, default=5, help="timed calls per child (default 5)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if min(args.rounds, args.number, args.threads) < 1:
        p.error("--rounds, --number and --threads must be >= 1")
    out = console(width=120)
    figures: dict[str, float] = {"rounds": args.rounds, "number": args.number, "threads": args.threads,
                                 "quick": int(args.quick)}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        tree = old_tree(args.baseline, Path(folder))
        for case in args.cases:
            if case.endswith("bf16") and not cpu_has_bf16_kernels():
                out.print(f"[yellow]{case}: skipped, this CPU has no bf16 matmul kernels[/]")
                continue
            base, today = [], []
            for _ in range(args.rounds):
                base.append(measure(tree, case, args))
                today.append(measure(None, case, args))
            ratio = median_ratio(today, base)
            ms = statistics.median(base) * 1e3, statistics.median(today) * 1e3
            figures |= {f"{case}_baseline_ms": ms[0], f"{case}_today_ms": ms[1], f"{case}_ratio": ratio}
            rows.append([case, f"{ms[0]:.1f}", f"{ms[1]:.1f}", f"{ratio:.3f}"])
    print_table(out, f"today against {args.baseline}: ms per call, median of {args.rounds} alternating rounds "
                f"of {args.number} calls, {args.threads} thread(s)", ["case", "baseline ms", "today ms", "ratio"],
                rows)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
