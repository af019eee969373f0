"""StreamRec ingestion: the columnar pyarrow readers against the csv-module reader they replaced.

A synthetic log (R rows, R/40 users, chronological like a real export) is written to a temporary
folder as CSV and Parquet. Each measurement runs in a fresh child process: the old reader is
`streamrec/data/datamodule.py` at the commit before the columnar change (`git show`, imported from a temporary
module, so the product keeps one reader), the new one is today's tree. Two stages:
`read` = `read_interactions` alone; `setup` = `StreamRecDataModule(path).setup("fit")` (read,
vocabulary, leave-one-out split, training windows). Each child imports what its stage needs: the
old reader lives in a module that imports torch and Lightning; today's `read` stage imports only
`streamrec.data.readers` (numpy and pyarrow, no torch), its `setup` stage the DataModule (torch). Wall
time inside the child; peak RSS of the child from `os.wait4`'s rusage (whole process, imports
included), its RSS after imports, and its peak above that (VmHWM after a reset), so the comparison
can be read with and without the imports. Both paths' results are checked equal (a digest of every
user's sequence). Figures vary with load on shared cores: compare ratios, and only within one run.

    python benchmarks/streamrec_ingest.py                      # 2M rows, 50k users
    python benchmarks/streamrec_ingest.py --rows 20000000 --json runs/ingest_20m.json
    python benchmarks/streamrec_ingest.py --rows 20000 --stages read   # seconds

JSON keys: {stage}_{format}_{old,new}_{s,cpu_s,peak_mib,imports_mib,above_imports_mib,torch},
{stage}_{format}_{speedup,cpu_speedup,memory_ratio,above_imports_ratio}, rows, users, items (torch: 1.0 when
the child had torch imported; cpu_s: CPU time of all the child's threads, steadier than wall time when
the cores are shared, though it counts arrow's threads that wall time overlaps).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import ROOT, peak_rss_bytes, print_table, reset_peak_rss, rss_bytes, with_current_imports, write_json
from rich.console import Console

BASELINE_COMMIT = "323717e6fe19ce35b9556d1a8243b5d891a7519a"  # the last commit with the csv-module reader


def generate(folder: Path, rows: int, users: int, items: int, seed: int,
             formats: tuple[str, ...] = ("csv", "parquet")) -> None:
    """log.csv and/or log.parquet: user_id u<n>, item_id i<n> (popularity skewed), integer timestamps in file order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    user = rng.integers(0, users, rows)
    item = np.minimum(rng.zipf(1.3, rows), items) - 1
    stamp = 1_600_000_000 + np.sort(rng.integers(0, 10**8, rows))
    table = pa.table({"user_id": pc_prefix("u", user), "item_id": pc_prefix("i", item), "timestamp": stamp})
    if "csv" in formats:
        pa_csv.write_csv(table, folder / "log.csv")
    if "parquet" in formats:
        pq.write_table(table, folder / "log.parquet")


def pc_prefix(prefix: str, numbers) -> object:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(numbers), pa.string()), "")


def old_module(commit: str, folder: Path) -> Path:
    """The data module file at `commit` (`streamrec/data.py` then), written as a module of its own.

    It imports only core and streamrec's constants.
    """
    source = subprocess.run(["git", "show", f"{commit}:streamrec/data.py"], cwd=ROOT, capture_output=True,
                            text=True)
    if source.returncode:
        sys.exit(f"error: cannot read streamrec/data.py at {commit} ({source.stderr.strip()}); "
                 "run from a git checkout that has that commit, or pass --baseline-commit")
    path = folder / "streamrec_data_old.py"
    path.write_text(with_current_imports(source.stdout))
    return path


def digest(users, sequences) -> str:
    import hashlib

    h = hashlib.sha256()
    for user in users:
        h.update(f"{user}:{' '.join(map(str, sequences[user]))}\n".encode())
    return h.hexdigest()[:16]


def child(args: argparse.Namespace) -> None:
    """One measurement; prints its figures as JSON on the last line of stdout."""
    sys.path[:0] = [str(ROOT)] + ([str(Path(args.module).parent)] if args.path_kind == "old" else [])
    if args.path_kind == "old":
        mod = __import__(Path(args.module).stem)
        read, datamodule = mod.read_interactions, mod.StreamRecDataModule
    elif args.stage == "read":  # what a read step needs: no DataModule, so no torch
        from streamrec.data.readers import read_interactions as read
    else:
        from streamrec.data.datamodule import StreamRecDataModule as datamodule
    import logging

    logging.disable(logging.INFO)
    before = rss_bytes()
    reset_peak_rss()
    start, cpu = time.perf_counter(), time.process_time()
    if args.stage == "read":
        result = read(args.data)
    else:
        result = datamodule(str(args.data), batch_size=256)
        result.setup("fit")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    above = peak_rss_bytes() - before
    if args.stage == "read":
        check = digest(list(result.items), result.items)
    else:  # the training histories, then the windows, test targets and items
        split = result.splits
        check = digest(list(split.train), {u: [int(i) for i in h] for u, h in split.train.items()})
        check += f"/{len(result.train_set)}/{sum(int(c.target) for c in split.test)}/{result.num_items}"
    print(json.dumps({"s": seconds, "cpu_s": cpu, "imports_mib": before / 2**20, "above_imports_mib": above / 2**20,
                      "torch": float("torch" in sys.modules), "check": check}))


def run_child(cmd: list[str], what: str, timeout_s: float | None = None) -> dict | None:
    """Run `cmd`, a child that prints its figures as JSON on its last stdout line; add its peak RSS from `os.wait4`.

    Returns None when the child ran past `timeout_s` (it is killed); exits with its stderr when it fails.
    """
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        timer = threading.Timer(timeout_s, proc.kill) if timeout_s else None
        if timer:
            timer.start()
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, so the rusage is this child's alone
        if timer:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        if timeout_s and proc.returncode == -signal.SIGKILL:
            return None
        if proc.returncode:
            err.seek(0)
            sys.exit(f"error: the {what} failed:\n{err.read()[-2000:]}")
    figures = json.loads(out.strip().splitlines()[-1])
    figures["peak_mib"] = usage.ru_maxrss / 1024  # KiB on Linux
    return figures


def run_in_process(entry, cmd: list[str]) -> dict:
    """What `run_child(cmd)` gives, from `entry(cmd[2:])` (the script's `main` on the child's arguments) run in this
    process: the last stdout line's JSON, and as `peak_mib` this process's peak RSS since the call began (VmHWM,
    so what earlier work left resident counts too). For smoke runs: quick, but the memory figures are not a child's."""
    out = io.StringIO()
    reset_peak_rss()
    with contextlib.redirect_stdout(out):
        entry([str(arg) for arg in cmd[2:]])
    figures = json.loads(out.getvalue().strip().splitlines()[-1])
    figures["peak_mib"] = peak_rss_bytes() / 2**20
    return figures


def measure(kind: str, stage: str, data: Path, module: Path, in_process: bool = False) -> dict:
    """Run one child; its wall time and peak above imports from itself, its peak RSS from `os.wait4`."""
    cmd = [sys.executable, __file__, "--child", kind, "--stage", stage, "--data", str(data), "--module", str(module)]
    if in_process:
        return run_in_process(main, cmd)
    return run_child(cmd, f"{kind} {stage} run on {data.name}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000, help="events in the synthetic log (default 2,000,000)")
    p.add_argument("--items", type=int, default=50_000, help="catalogue size (default 50,000)")
    p.add_argument("--stages", nargs="+", choices=("read", "setup"), default=["read", "setup"],
                   help="read_interactions alone, and/or the DataModule's setup('fit') (default both)")
    p.add_argument("--formats", nargs="+", choices=("csv", "parquet"), default=["csv", "parquet"])
    p.add_argument("--baseline-commit", default=BASELINE_COMMIT, help="commit whose streamrec/data.py is 'old'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    p.add_argument("--in-process", action="store_true",
                   help="run the log's generation and every measurement in this process, one after another, instead "
                        "of a fresh child process each (today's read stage first, before the old reader imports "
                        "torch): quick, for checking that the script runs and old and new agree; the memory and "
                        "import figures then include what earlier measurements left behind, so do not compare them")
    p.add_argument("--child", choices=("old", "new"), dest="path_kind", help=argparse.SUPPRESS)
    p.add_argument("--stage", choices=("read", "setup"), help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--module", help=argparse.SUPPRESS)
    p.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.path_kind:
        return child(args)
    if args.generate:
        return generate(args.generate, args.rows, max(1, args.rows // 40), args.items, args.seed)
    if args.rows < 100:
        p.error("--rows must be at least 100")
    users = max(1, args.rows // 40)
    console = Console()
    figures: dict[str, float] = {"rows": args.rows, "users": users, "items": args.items}
    rows = []
    with tempfile.TemporaryDirectory(prefix="streamrec_ingest_") as tmp:
        folder = Path(tmp)
        # Generated in a child too (but with --in-process): a big parent would raise every child's ru_maxrss (exec
        # keeps the peak).
        cmd = [sys.executable, __file__, "--generate", tmp, "--rows", str(args.rows), "--items", str(args.items),
               "--seed", str(args.seed)]
        if args.in_process:
            main(cmd[2:])
        else:
            subprocess.run(cmd, cwd=ROOT, check=True)
        module = old_module(args.baseline_commit, folder)
        done: dict[tuple[str, str, str], dict] = {}

        def result(kind: str, stage: str, fmt: str) -> dict:
            if (kind, stage, fmt) not in done:
                done[kind, stage, fmt] = measure(kind, stage, folder / f"log.{fmt}", module, args.in_process)
            return done[kind, stage, fmt]

        if args.in_process and "read" in args.stages:  # before the old reader's module imports torch in here
            for fmt in args.formats:
                result("new", "read", fmt)
        for stage in args.stages:
            for fmt in args.formats:
                old, new = (result(kind, stage, fmt) for kind in ("old", "new"))
                if old["check"] != new["check"]:
                    sys.exit(f"error: {stage} {fmt}: old and new results differ ({old['check']} != {new['check']})")
                name = f"{stage}_{fmt}"
                for kind, f in (("old", old), ("new", new)):
                    for key in ("s", "cpu_s", "peak_mib", "imports_mib", "above_imports_mib", "torch"):
                        figures[f"{name}_{kind}_{key}"] = f[key]
                figures[f"{name}_speedup"] = old["s"] / new["s"]
                figures[f"{name}_cpu_speedup"] = old["cpu_s"] / new["cpu_s"]
                figures[f"{name}_memory_ratio"] = old["peak_mib"] / new["peak_mib"]
                figures[f"{name}_above_imports_ratio"] = old["above_imports_mib"] / max(new["above_imports_mib"], 1)
                rows.append([f"{stage} {fmt}", f"{old['s']:.2f}", f"{new['s']:.2f}", f"{old['s'] / new['s']:.1f}x",
                             f"{old['cpu_s'] / new['cpu_s']:.1f}x",
                             f"{old['peak_mib']:.0f}", f"{new['peak_mib']:.0f}",
                             f"{old['peak_mib'] / new['peak_mib']:.1f}x",
                             f"{old['imports_mib']:.0f} / {new['imports_mib']:.0f}",
                             f"{old['above_imports_mib']:.0f} / {new['above_imports_mib']:.0f}"])
    print_table(console, f"StreamRec ingestion, {args.rows:,} rows, {users:,} users (old = {args.baseline_commit[:7]})",
                ["stage", "old s", "new s", "speedup", "CPU-time speedup", "old peak MiB", "new peak MiB",
                 "memory ratio", "imports old / new MiB", "above imports old / new MiB"], rows)
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
