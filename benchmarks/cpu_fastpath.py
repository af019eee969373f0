"""`speed.cpu_fastpath` off against on (fp32 against bf16, eager against compiled) for each app's step, CPU.

Each case (`_common.STEP_CASES`: the shipped configs' shapes) is built twice from the same seed and times
`training_step` + backward + AdamW on one synthetic batch, or beam 5 over 32 sentences for `translate_decode`.
Interleaved rounds; time = median; speed-up = median of per-round ratios first / second (> 1: the second is faster).
`--compare precision` (fast path on, as the configs train) checks the start-up bf16 probe
(`core.runtime.precision.cpu_has_fast_bf16`): a case agrees when the probe's verdict names the faster precision or the
step is within 10% either way. `--compare compile`: eager against inductor (`model.speed.compile default`), both
without the fast path, training steps only; the warm-up call compiles. FLOP/s: `FlopCounterMode`'s count over the
step's time; MFU: its share of this machine's GEMM peak in the step's precision at the same threads (the best probe
beside any case of the run).

    python benchmarks/cpu_fastpath.py --threads 2 --json runs/bench/cpu_fastpath_t2.json
    python benchmarks/cpu_fastpath.py --compare precision --json runs/bench/cpu_precision.json

JSON keys: {case}_{label}_{ms,flop_s,mfu}, {case}_speedup, {case}_gflop per case (labels off/on, fp32/bf16 or
eager/compiled), peak_flop_s_{fp32,bf16}, threads, quick, load_avg_start, load_avg_end; fastpath: onednn,
fast_bf16; precision: probe_speedup, probe_fast_bf16, {case}_agrees.
"""

from __future__ import annotations

import argparse
import os
import statistics
import warnings

import _common
import torch

from core.nn.cpu_fastpath import onednn_available
from core.runtime.precision import FAST_BF16_MIN_SPEEDUP, cpu_bf16_speedup, cpu_has_bf16_kernels, cpu_has_fast_bf16

LABELS = {"fastpath": ("off", "on"), "precision": ("fp32", "bf16"), "compile": ("eager", "compiled")}
PRECISION_CASES = ("streamrec_ml1m", "streamrec_beauty", "translate_multi30k_fp32")
NEAR = 0.1  # a step within this fraction of level is no wrong verdict either way
# label -> step_case arguments; eager and compiled both without the fast path, whose kernels inductor would not fuse
BUILD = {"off": dict(fastpath=False), "on": dict(fastpath=True), "fp32": dict(bf16=False), "bf16": dict(bf16=True),
         "eager": dict(fastpath=False), "compiled": dict(fastpath=False, compiled=True)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compare", choices=tuple(LABELS), default="fastpath", help="what to time against what")
    p.add_argument("--cases", nargs="+", choices=tuple(_common.STEP_CASES), help="what to time (default: all)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--number", type=int, default=3, help="steps per timing (default 3)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs, times nothing useful")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    if min(args.threads, args.repeats, args.number) < 1:
        p.error("--threads, --repeats and --number must be >= 1")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*self.log.*")  # training_step logs; there is no trainer here
    out, labels = _common.console(width=120), LABELS[args.compare]
    cases = args.cases or list(PRECISION_CASES if args.compare == "precision" else _common.STEP_CASES)
    cases = [c for c in cases if args.compare != "compile" or c != "translate_decode"]  # search stays eager
    f: dict[str, float] = {"threads": args.threads, "quick": int(args.quick), "load_avg_start": os.getloadavg()[0]}
    if args.compare == "precision":
        _common.require_bf16_kernels("--compare precision")
        f |= {"probe_speedup": cpu_bf16_speedup(), "probe_fast_bf16": int(cpu_has_fast_bf16())}
        out.print(f"start-up probe: bf16 {f['probe_speedup']:.2f}x fp32's rate, so "
                  f"{'bf16' if f['probe_fast_bf16'] else 'fp32'}")
    elif not cpu_has_bf16_kernels():
        out.print(f"[yellow]{[c for c in cases if c.endswith('bf16')]} skipped: this CPU has no bf16 kernels[/]")
        cases = [c for c in cases if not c.endswith("bf16")]
    dtypes, peaks, runs = ("fp32", "bf16") if cpu_has_bf16_kernels() else ("fp32",), {}, {}
    for case in cases:
        # The peak is probed beside every case and the best kept: on shared cores one probe can land in a busy moment.
        size = 256 if args.quick else 1024
        peaks = {d: max(peaks.get(d, 0.0), _common.peak_gemm_flops(d, args.threads, size)) for d in dtypes}
        fns = {label: _common.step_case(case, quick=args.quick, **BUILD[label]) for label in labels}
        flops = _common.step_flops(_common.step_case(case, quick=args.quick, **BUILD[labels[0]]))
        runs[case] = flops, _common.interleave(fns, args.repeats, number=args.number, warmup=True)
    f |= {f"peak_flop_s_{d}": v for d, v in peaks.items()}
    rows = []
    for case, (flops, times) in runs.items():
        f[f"{case}_gflop"], f[f"{case}_speedup"] = flops / 1e9, _common.median_ratio(times[labels[0]], times[labels[1]])
        row = [case]
        for label, ts in times.items():
            dtype = "bf16" if label == "bf16" or case.endswith("bf16") else "fp32"
            step_s = statistics.median(ts)
            fl = _common.flop_figures(flops, step_s, peaks[dtype])
            f |= {f"{case}_{label}_ms": 1e3 * step_s} | {f"{case}_{label}_{k}": v for k, v in fl.items()}
            row += [f"{1e3 * step_s:.1f}", *_common.fmt_flops(fl["flop_s"], fl["mfu"])]
        rows.append([*row, f"{f[f'{case}_speedup']:.2f}x"])
        if args.compare == "precision":
            ratio = f[f"{case}_speedup"]
            f[f"{case}_agrees"] = int(abs(ratio - 1) <= NEAR or (ratio >= FAST_BF16_MIN_SPEEDUP) == bool(
                f["probe_fast_bf16"]))
    f["load_avg_end"] = os.getloadavg()[0]
    cols = [f"{label} {what}" for label in labels for what in ("ms", "GFLOP/s", "MFU")]
    _common.print_table(out, f"{labels[0]} vs {labels[1]}, ms per call, {args.threads} thread(s), load average "
                        f"{f['load_avg_start']:.1f} -> {f['load_avg_end']:.1f}; peak GEMM "
                        + ", ".join(f"{d} {v / 1e9:,.1f} GFLOP/s" for d, v in peaks.items()),
                        ["case", *cols, "speed-up"], rows)
    for case in cases if args.compare == "precision" else ():
        out.print(f"{case}: bf16 {f[f'{case}_speedup']:.2f}x, the probe "
                  f"{'agrees' if f[f'{case}_agrees'] else '[red]DISAGREES[/]'}")
    if args.compare == "fastpath":
        f |= {"onednn": int(onednn_available()), "fast_bf16": int(cpu_has_bf16_kernels())}
    _common.write_json(args.json, f)


if __name__ == "__main__":
    main()
