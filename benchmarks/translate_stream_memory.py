"""Streaming translation's memory: peak RSS of `python -m translate.infer`, a baseline revision against today's.

The old path is `translate/infer.py` and `translate/api.py` as they were at `--baseline` (a git
revision; default: the commit before streaming was bounded), read with `git show` into a temporary
folder as `old_infer` / `old_api`; the rest of the package is today's, so the import line and the
calls whose arguments have since become keyword-only or names since changed (`COMPAT`) are rewritten.
Each run is a fresh process (`python -c`) whose peak RSS (VmHWM) and wall time it reports itself, so
nothing of one run stays in the next; a one-line input gives each path's floor (Python, torch and the
model), and "above floor" is what the input added. Both translate the same files with their default
chunking (old: 10,000 lines, each encoded whole; new: `--chunk-lines` 2,000 or 16 MiB of text, encoded
1 Mi characters at a time and truncated at once) and must write identical output (`outputs_equal_N`).

The model is tiny and barely trained (one step on the demo corpus, d_model 16, max_len 256) and
decoding is cut to one subword (`--beam 1 --max-len-a 0 --max-len-b 1`): the speed of search
barely matters here; what grows with the input is reading and encoding the long lines.

    python benchmarks/translate_stream_memory.py                          # 2,000 and 20,000 lines of 5,000 words
    python benchmarks/translate_stream_memory.py --words 500 --json runs/translate_stream_memory.json
    python benchmarks/translate_stream_memory.py --lines 100 300 --words 50 --max-len 16   # seconds

`--fork` (for smoke tests) forks each run from this process instead of starting a fresh interpreter, so
torch and Lightning are not imported again for every run; its peaks then include what this process holds
(Lightning, the fitted model), so they only show that each run completed and reported, not the memory
the paths need.

JSON keys: {old,new}_floor_mib; per line count N {old,new}_{N}_peak_mib, {old,new}_{N}_above_floor_mib,
{old,new}_{N}_s, peak_ratio_{N} and above_floor_ratio_{N} (old / new), outputs_equal_{N} (1 or 0);
{old,new}_growth (peak at the largest N / peak at the smallest), {old,new}_above_floor_growth; and the
setting (words, max_len, threads, smallest_lines, largest_lines).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from _common import ROOT, peak_rss_bytes, print_table, reset_peak_rss, with_current_imports, write_json
from rich.console import Console

BASELINE = "323717e6fe19ce35b9556d1a8243b5d891a7519a"  # infer: 10,000-line chunks encoded whole
DECODE = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "1"]
COMPAT = {  # old text -> the same under today's signatures and names
    # search functions' options became keyword-only
    "greedy_search(model, src, BOS_ID, EOS_ID, max_len_a, max_len_b)":
        "greedy_search(model, src, BOS_ID, EOS_ID, max_len_a=max_len_a, max_len_b=max_len_b)",
    # the bf16 warning's constant became a function of the measured probe
    "from core.precision import NO_FAST_BF16, cpu_has_fast_bf16, quantize_int8":
        "from core.precision import NO_BF16_KERNELS as NO_FAST_BF16, cpu_has_fast_bf16, quantize_int8",
}
# Runs in the child: import the script's module, translate, report VmHWM (fresh after exec) and seconds.
PROBE = """
import importlib, json, sys, time
import torch
module, figures, threads, argv = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
torch.set_num_threads(threads)
main = importlib.import_module(module).main
start = time.perf_counter()
main(argv)
seconds = time.perf_counter() - start
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
open(figures, "w").write(json.dumps({"peak_mib": hwm / 1024, "s": seconds}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, nargs="+", default=[2_000, 20_000], help="input sizes in lines")
    p.add_argument("--words", type=int, default=5_000, help="words per input line (default 5,000)")
    p.add_argument("--max-len", type=int, default=256, help="the model's max_len in subwords (default 256)")
    p.add_argument("--chunk-lines", type=int, help="the new path's --chunk-lines (default: its own default)")
    p.add_argument("--baseline", default=BASELINE, help="git revision of the old infer.py/api.py")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--workdir", help="folder for the checkpoint and inputs (default: a temporary one)")
    p.add_argument("--json", help="write the figures here as one flat JSON object")
    p.add_argument("--fork", action="store_true",
                   help="for smoke tests: fork each run from this process instead of starting a fresh interpreter "
                        "(much cheaper: nothing is imported again), with --threads 1 only; the peaks then include "
                        "this process's own memory, so they do not measure the two paths")
    args = p.parse_args(argv)
    if min(args.lines) < 1 or args.words < 1 or args.max_len < 2 or args.threads < 1:
        p.error("--lines, --words and --threads must be >= 1 and --max-len >= 2")
    if args.fork and args.threads != 1:  # a forked child must not use the thread pool its parent may have started
        p.error("--fork runs with --threads 1 only")
    return args


def make_checkpoint(out: Path, max_len: int) -> Path:
    """A tiny translator fitted for one step on a small demo corpus (its vocabulary is what matters)."""
    import importlib.util

    import lightning as L

    spec = importlib.util.spec_from_file_location("make_translate_demo", ROOT / "data" / "make_translate_demo.py")
    demo = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = demo  # dataclasses look the module up while it executes
    spec.loader.exec_module(demo)
    from translate.data.corpus import TranslationDataModule
    from translate.model.module import TranslationModule

    demo.write_corpus(demo.generate(train_size=300, val_size=10, test_size=10, seed=0), out / "demo")
    L.seed_everything(0, verbose=False)
    dm = TranslationDataModule(str(out / "demo" / "train"), str(out / "demo" / "val"), str(out / "demo" / "test"),
                               max_len=max_len, max_tokens=max(512, max_len), cache_dir=str(out / "spm"))
    module = TranslationModule(src_vocab_size=dm.src_vocab_size, tgt_vocab_size=dm.tgt_vocab_size, pad_id=dm.pad_id,
                               max_len=max_len, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, dm)
    trainer.save_checkpoint(out / "tiny.ckpt")
    return out / "tiny.ckpt"


def write_input(path: Path, lines: int, words: int, vocabulary: list[str], seed: int = 0) -> Path:
    """`lines` lines of `words` words drawn from `vocabulary` (written a line at a time: the file may be large)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choices(vocabulary, k=words)) + "\n")
    return path


def old_modules(revision: str, folder: Path) -> Path:
    """`old_infer` and `old_api` in `folder`: infer.py and api.py at `revision`, the first importing the second."""
    def show(path: str) -> str:
        done = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"error: --baseline {revision}: git show {path} failed ({done.stderr.strip()}); "
                     "run from a git checkout or pass a revision it has")
        return done.stdout

    infer = show("translate/infer.py")
    if "from translate.api import" not in infer:
        sys.exit(f"error: --baseline {revision}: its translate/infer.py does not use translate.api; pick a later one")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "old_infer.py").write_text(with_current_imports(infer.replace("from translate.api import",
                                                                             "from old_api import")))
    api = show("translate/api.py")
    for old, new in COMPAT.items():
        api = api.replace(old, new)
    (folder / "old_api.py").write_text(with_current_imports(api))
    return folder


def probe(module: str, argv: list[str], threads: int, work: Path, path: str | None = None) -> dict[str, float]:
    """Run `module.main(argv)` in a fresh process; its peak RSS in MiB and seconds."""
    figures = work / "probe.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (path, str(ROOT), os.environ.get("PYTHONPATH")))))
    cmd = [sys.executable, "-c", PROBE, module, str(figures), str(threads), *argv]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {module} {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return json.loads(figures.read_text())


def forked(module: str, argv: list[str], work: Path, path: str | None = None) -> dict[str, float]:
    """`probe`'s figures for `module.main(argv)` run in a child forked from this process (`--fork`).

    The child inherits everything imported here; its peak mark is reset to its RSS at the start, so the peak
    is that RSS (this process's own memory, shared) plus what the run added. One thread (see `parse_args`).
    """
    log = work / "forked.log"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        status = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            import torch

            torch.set_num_threads(1)
            if path is not None:
                sys.path.insert(0, path)
            main = importlib.import_module(module).main
            reset_peak_rss()
            start = time.perf_counter()
            main(argv)
            seconds = time.perf_counter() - start
            (work / "probe.json").write_text(json.dumps({"peak_mib": peak_rss_bytes() / 2**20, "s": seconds}))
            status = 0
        except BaseException:  # whatever it was (SystemExit too), the parent reports it from the log
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {module} {' '.join(argv)} failed:\n{log.read_text(errors='replace')[-3000:]}")
    return json.loads((work / "probe.json").read_text())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 130))
    sizes = sorted(set(args.lines))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        ckpt = make_checkpoint(work, args.max_len)
        vocabulary = sorted(set((work / "demo" / "train.en").read_text(encoding="utf-8").split()))
        old_path = old_modules(args.baseline, work / "old")
        new_extra = [] if args.chunk_lines is None else ["--chunk-lines", str(args.chunk_lines)]
        f: dict[str, float] = {"words": args.words, "max_len": args.max_len, "threads": args.threads,
                               "smallest_lines": sizes[0], "largest_lines": sizes[-1]}
        runs = {"old": ("old_infer", [], str(old_path)), "new": ("translate.infer", new_extra, None)}
        for n in [1, *sizes]:
            src = write_input(work / f"in{n}.en", n, args.words, vocabulary)
            for name, (module, extra, path) in runs.items():
                argv = ["--ckpt", str(ckpt), "-i", str(src), "-o", str(work / f"{name}.out"), *DECODE, *extra]
                got = forked(module, argv, work, path) if args.fork else probe(module, argv, args.threads, work, path)
                if n == 1:
                    f[f"{name}_floor_mib"] = got["peak_mib"]
                    continue
                f[f"{name}_{n}_peak_mib"], f[f"{name}_{n}_s"] = got["peak_mib"], got["s"]
                f[f"{name}_{n}_above_floor_mib"] = max(got["peak_mib"] - f[f"{name}_floor_mib"], 1.0)  # no 0 division
            if n > 1:
                f[f"peak_ratio_{n}"] = f[f"old_{n}_peak_mib"] / f[f"new_{n}_peak_mib"]
                f[f"above_floor_ratio_{n}"] = f[f"old_{n}_above_floor_mib"] / f[f"new_{n}_above_floor_mib"]
                f[f"outputs_equal_{n}"] = float((work / "old.out").read_bytes() == (work / "new.out").read_bytes())
            src.unlink()  # the largest inputs are hundreds of MB
        for name in runs:
            f[f"{name}_growth"] = f[f"{name}_{sizes[-1]}_peak_mib"] / f[f"{name}_{sizes[0]}_peak_mib"]
            f[f"{name}_above_floor_growth"] = (f[f"{name}_{sizes[-1]}_above_floor_mib"]
                                               / f[f"{name}_{sizes[0]}_above_floor_mib"])
    rows = [[f"{n:,} lines", f"{f[f'old_{n}_peak_mib']:.0f}", f"{f[f'new_{n}_peak_mib']:.0f}",
             f"{f[f'peak_ratio_{n}']:.2f}x", f"{f[f'old_{n}_above_floor_mib']:.0f}",
             f"{f[f'new_{n}_above_floor_mib']:.0f}", f"{f[f'above_floor_ratio_{n}']:.2f}x",
             f"{f[f'old_{n}_s']:.1f}", f"{f[f'new_{n}_s']:.1f}", "yes" if f[f"outputs_equal_{n}"] else "NO"]
            for n in sizes]
    rows.append([f"growth {sizes[-1]:,} / {sizes[0]:,}", f"{f['old_growth']:.2f}x", f"{f['new_growth']:.2f}x", "",
                 f"{f['old_above_floor_growth']:.2f}x", f"{f['new_above_floor_growth']:.2f}x", "", "", "", ""])
    print_table(console, f"translate.infer peak RSS, MiB ({args.words:,} words per line, max_len {args.max_len}, "
                f"{args.threads} thread(s); old = {args.baseline[:10]}; floor = a 1-line input: old "
                f"{f['old_floor_mib']:.0f}, new {f['new_floor_mib']:.0f}"
                f"{'; --fork: every peak includes this process' if args.fork else ''})",
                ["input", "old peak", "new peak", "old / new", "old above floor", "new above floor", "old / new",
                 "old s", "new s", "same output"], rows)
    if args.json:
        write_json(args.json, f)


if __name__ == "__main__":
    main()
