"""`translate.infer --engine ray` against one process: lines per second and each process's peak memory by file size.

A file of N lines (the demo test sentences repeated) is translated by one process at 1 and at W threads, and by
`--engine ray --workers W` (one thread each), with the same checkpoint and search; the outputs must be equal. Peak
memory: the driver's from `wait4`, each Ray actor's sampled from /proc, so "flat in the file size" reads across sizes.

    python benchmarks/translate_scale.py --ckpt runs/translate_demo/checkpoints/best.ckpt --lines 20000 80000
JSON keys: {n}_{local_t1,local_tW,ray}_{s,lines_s,rss_mb}, {n}_ray_actor_rss_mb, {n}_speedup_{t1,tW}, workers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _common

REPO = Path(__file__).resolve().parents[1]


def run(args: list[str], threads: int, actors: dict[int, int]) -> tuple[float, float]:
    """Wall seconds and the driver's peak RSS in MB; `actors` gets each Ray actor's peak RSS in kB by pid."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start, done = time.perf_counter(), threading.Event()
    proc = subprocess.Popen([sys.executable, "-m", "translate.infer", *args], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sampler = threading.Thread(target=_sample, args=(actors, done))
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if status:
        raise SystemExit(f"translate.infer {' '.join(args)} failed with status {status}")
    return seconds, usage.ru_maxrss / 1024


def _sample(actors: dict[int, int], done: threading.Event) -> None:
    while not done.wait(0.2):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ChunkTranslator"):
                    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                               if line.startswith("VmRSS"))
                    actors[int(pid)] = max(actors.get(int(pid), 0), rss)
            except (OSError, StopIteration):
                continue


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a translate checkpoint")
    p.add_argument("--lines", type=int, nargs="+", default=[20_000, 80_000], help="file sizes in lines")
    p.add_argument("--workers", type=int, default=2, help="Ray actors, and the threads of the wide local run")
    p.add_argument("--beam-size", default="1", help="search width (default 1: greedy)")
    p.add_argument("--no-wide", action="store_true", help="skip the one-process run at W threads")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    rows, w, f = [], args.workers, {"workers": args.workers}
    runs = [("local_t1", 1, []), ("local_tW", w, []), ("ray", 1, ["--engine", "ray", "--workers", str(w)])]
    runs = runs[::2] if args.no_wide else runs
    labels = [label for label, _, _ in runs]
    sentences = (REPO / "data/translate_demo/test.en").read_text(encoding="utf-8").splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lines:
            src = Path(tmp, f"in{n}.en")
            src.write_text("".join(sentences[k % len(sentences)] + "\n" for k in range(n)), encoding="utf-8")
            outs, actors = {}, {}
            for label, threads, extra in runs:
                outs[label] = Path(tmp, f"{label}.de")
                s, rss = run(["--ckpt", args.ckpt, "-i", str(src), "-o", str(outs[label]), "--beam-size",
                              args.beam_size, *extra], threads, actors)
                f |= {f"{n}_{label}_s": s, f"{n}_{label}_lines_s": n / s, f"{n}_{label}_rss_mb": rss}
            if len({o.read_bytes() for o in outs.values()}) != 1:
                raise SystemExit(f"{n} lines: the engines' outputs differ")
            f[f"{n}_ray_actor_rss_mb"] = max(actors.values(), default=0) / 1024
            speedups = {k.removeprefix("local_"): f[f"{n}_{k}_s"] / f[f"{n}_ray_s"] for k in labels if k != "ray"}
            f |= {f"{n}_speedup_{t}": x for t, x in speedups.items()}
            rows.append([f"{n:,}", *(f"{f[f'{n}_{k}_lines_s']:,.0f}" if k in labels else "-"
                                     for k in ("local_t1", "local_tW", "ray")),
                         " / ".join(f"{x:.2f}x" for x in speedups.values()),
                         f"{f[f'{n}_ray_rss_mb']:,.0f} / {f[f'{n}_ray_actor_rss_mb']:,.0f}"])
    _common.print_table(_common.console(width=120), f"translate.infer, beam {args.beam_size}, lines per second",
                        ["lines", "1 process, 1 thread", f"1 process, {w} threads", f"Ray, {w} workers",
                         "Ray speed-up (vs 1 / vs W threads)", "Ray peak MB (driver / actor)"], rows)
    _common.write_json(args.json, f)


if __name__ == "__main__":
    main()
