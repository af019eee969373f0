"""What the benchmark scripts share: interleaved timing, memory probes, FLOP counts and this machine's GEMM peak
(MFU), tables, JSON, the shipped configs' training steps. Benchmarks report ratios against a baseline measured in
the same run, never a lone absolute time: the CPUs are shared and one run can be 2x slower than the next."""

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
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext, suppress
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def ensure_peer_venv(script: str, modules: Sequence[str], venv: str, make_target: str) -> None:
    """Re-run `script` under ROOT/`venv` (a benchmark-only venv) when a peer module does not import here."""
    try:
        for name in modules:
            importlib.import_module(name)
    except ImportError:
        peer = ROOT / venv
        python = peer / "bin" / "python"
        # Compare prefixes, not executables: every venv's python links to the same interpreter.
        if python.exists() and Path(sys.prefix).resolve() != peer.resolve():
            os.execv(str(python), [str(python), script, *sys.argv[1:]])
        sys.exit(f"error: {'/'.join(modules)} not installed here and {venv} is missing; create it with "
                 f"`make {make_target}`")


def require_bf16_kernels(option: str) -> None:
    """Exit with one line when asked to time bf16 on a CPU where PyTorch runs it through its slow fallback."""
    # Imported here: scripts import _common before re-running themselves in a peer venv.
    from core.runtime.precision import NO_BF16_KERNELS, cpu_has_bf16_kernels

    if not cpu_has_bf16_kernels():
        sys.exit(f"error: {option}: {NO_BF16_KERNELS}, so bf16 timings would measure PyTorch's fallback")


def time_call(fn: Callable[[], object], sync: Callable[[], None] = lambda: None, number: int = 1) -> float:
    """Seconds per call of `fn` over `number` back-to-back calls; `sync` (e.g. CUDA's) runs before and after."""
    sync()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return (time.perf_counter() - start) / number


def interleave(fns: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None] = lambda: None,
               number: int = 1, warmup: bool = False) -> dict[str, list[float]]:
    """Time each function once a round, A B A B ..., so drifting load hits all; `warmup`: one untimed call first."""
    for fn in fns.values() if warmup else ():
        time_call(fn, sync)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(time_call(fn, sync, number))
    return times


def grad_step(forward: Callable[[], object], train: bool, backward: Callable[[object], object]) -> Callable[[], None]:
    """A call that runs `forward()` with autograd on only when `train`, and then `backward` on its output."""
    import torch

    def step() -> None:
        with torch.set_grad_enabled(train):
            out = forward()
            if train:
                backward(out)
    return step


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median of the per-round ratios num[i] / den[i]: robust to a round slowed for both sides."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def peak_gemm_flops(dtype: str = "fp32", threads: int | None = None, size: int = 1024, repeats: int = 5,
                    device: str = "cpu") -> float:
    """This machine's GEMM rate in FLOP/s: the best of `repeats` timed square matmuls (the best, since load on
    shared cores only ever slows one down), at `threads` (restored after) and under CUDA's current TF32 setting."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        a, b = (torch.randn(size, size, device=device).to({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
                for _ in range(2))
        sync = torch.cuda.synchronize if device == "cuda" else lambda: None
        time_call(lambda: a @ b, sync)  # warm-up: kernel selection, packing buffers
        return 2 * size**3 / min(time_call(lambda: a @ b, sync) for _ in range(repeats))
    finally:
        torch.set_num_threads(before)


def step_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of `fn` under `FlopCounterMode` (matmuls, attention, convolutions, no elementwise), plus what
    it counts 0: SDPA's CPU flash kernel (torch's SDPA counts) and the fast path's oneDNN linear (2 x out x in)."""
    import torch
    from torch.utils import flop_counter as fc

    try:  # keyed by op packets, as FlopCounterMode looks them up
        extra = {torch.ops.mkldnn._linear_pointwise: lambda x, w, *a, out_shape, **k: 2 * math.prod(out_shape) * w[1],
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, out_shape, **kw:
                 fc.sdpa_flop_count(q, k, v), torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
                 lambda g, q, k, v, *a, out_shape, **kw: fc.sdpa_backward_flop_count(g, q, k, v)}
    except AttributeError:
        extra = {}
    with fc.FlopCounterMode(display=False, custom_mapping=extra) as counter:
        fn()
    return int(counter.get_total_flops())


def loader_flops(step: Callable[[object], object], batches: Iterable, shape: Callable[[object], tuple]) -> int:
    """FLOPs of `step(batch)` over all of `batches`: `step_flops` on one batch per distinct `shape(batch)`, times
    that shape's count. The torch RNG is restored after, so counting changes no later draw."""
    import torch

    with torch.random.fork_rng():
        first: dict[tuple, list] = {}
        for batch in batches:
            first.setdefault(shape(batch), [batch, 0])[1] += 1
        return sum(n * step_flops(lambda b=b: step(b)) for b, n in first.values())


def flop_figures(flops: float, seconds: float, peak: float) -> dict[str, float]:
    return {"flop_s": flops / seconds, "mfu": flops / seconds / peak}


def fmt_flops(flop_s: float, mfu: float) -> list[str]:
    return [f"{flop_s / 1e9:,.1f}", f"{100 * mfu:.1f}%"]


def reset_peak_rss() -> None:
    """Lower this process's peak-RSS mark to its current RSS (Linux >= 4.0), where allowed."""
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    """VmHWM, which reset_peak_rss lowers (not ru_maxrss: exec keeps the parent's peak there)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def step_peak_bytes(step: Callable[[], object], device: str = "cpu") -> int:
    """Peak memory of one `step()` above what was allocated (CUDA) or resident (CPU) before it; on CPU call it in
    a fresh process (`in_fresh_process`) when earlier work must not count."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    gc.collect()
    start = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()  # RSS now
    reset_peak_rss()
    step()
    return max(0, peak_rss_bytes() - start)  # memory freed before the reset reads below 0


def in_fresh_process(fn: Callable[..., object], args: tuple, preload: Sequence[str], threads: int | None = None):
    """`fn(*args)` in a process of its own, and its result; None when it dies (killed for memory). It forks from a
    forkserver that imported `preload` (the caller's imports) and ran nothing: a clean heap, no busy thread pool."""
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


def console(stderr: bool = False, width: int = 132) -> Console:
    """rich falls back to 80 columns when piped, which would fold the tables."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, log_path=False, width=None if stream.isatty() else width)


def print_table(out: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    out.print(table)


def print_targets(out: Console, targets: dict[str, float], figures: dict[str, float]) -> None:
    for name, bound in targets.items():
        if name in figures:
            verdict = "met" if figures[name] >= bound else "[red]MISSED[/]"
            out.print(f"target {name} >= {bound:g}: {figures[name]:.3f} {verdict}")


def write_json(path: str | Path | None, figures: dict[str, float]) -> None:
    if path is None:
        return
    for name, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"figure {name!r} must be a finite number, got {value!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")


def compare_loss_steps(losses: dict[str, Callable[[], object]], leaves: Sequence, bf16: bool, repeats: int
                       ) -> tuple[dict[str, float], dict[str, list[float]], list[list[str]]]:
    """Loss steps (bf16 autocast if `bf16`, backward from cleared grads of `leaves`) on logits ("naive"), our chunked
    one ("chunked") and any others: the naive-vs-chunked figures, every step's times and the table rows."""
    import torch

    if bf16:
        require_bf16_kernels("--precision bf16")

    def step(loss: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            for x in leaves:
                x.grad = None
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                value = loss()
            value.backward()
            return value.item()
        return run

    fns = {name: step(loss) for name, loss in losses.items()}
    values = {name: fn() for name, fn in fns.items()}  # also the warm-up
    peaks = {name: step_peak_bytes(fn) / 2**20 for name, fn in fns.items()}
    times = interleave(fns, repeats)
    f = {"naive_ms": 1e3 * statistics.median(times["naive"]), "chunked_ms": 1e3 * statistics.median(times["chunked"]),
         "naive_peak_mib": peaks["naive"], "chunked_peak_mib": peaks["chunked"],
         "speedup": median_ratio(times["naive"], times["chunked"]),
         "memory_ratio": peaks["naive"] / max(peaks["chunked"], 1e-9),
         "loss_abs_diff": abs(values["naive"] - values["chunked"])}
    rows = [["forward + backward, ms (median)", f"{f['naive_ms']:.0f}", f"{f['chunked_ms']:.0f}",
             f"{f['speedup']:.2f}x"],
            ["peak memory above inputs, MiB", f"{f['naive_peak_mib']:.0f}", f"{f['chunked_peak_mib']:.0f}",
             f"{f['memory_ratio']:.1f}x"],
            ["loss", f"{values['naive']:.5f}", f"{values['chunked']:.5f}", ""]]
    return f, times, rows


def for_signature(cls: type, **kwargs: object) -> dict[str, object]:
    """`kwargs`, named flat (`attn_dropout=0.2`), as `cls` takes them: a top-level argument or a field of one of its
    option groups (`block={"attn_dropout": 0.2}`). Lets one case run on trees before and after a grouping."""
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


# case -> module arguments (flat names). "quick" shrinks every size.
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


def step_case(name: str, *, fastpath: bool = True, bf16: bool | None = None, quick: bool = False,
              compiled: bool = False) -> Callable[[], None]:
    """One call of case `name` from seed 0: a training step (training_step, backward, AdamW) or a beam search;
    `bf16`: autocast (default: as the name says); `compiled`: the stacks under inductor. Imports the apps from
    `sys.path`, so `hot_path.py` can use it on an older tree."""
    import torch

    kwargs = STEP_CASES[name] | ({k: v for k, v in QUICK.items() if k in STEP_CASES[name]} if quick else {})
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
    if compiled:
        from core.nn.compile import compile_in_place
        compile_in_place([m for m in (module.model.encoder, getattr(module.model, "decoder", None)) if m is not None],
                         "default")
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
    module.train()

    def step() -> None:
        with torch.autocast("cpu", torch.bfloat16) if bf16 else nullcontext():
            loss = module.training_step(batch, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step
