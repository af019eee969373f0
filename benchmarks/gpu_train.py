"""Training-step speed on a GPU: ours against HF MarianMTModel, one run; and StreamRec's step throughput.

One step = forward + loss + backward + AdamW (fused on CUDA) under bf16 autocast on CUDA (`--precision
fp32|bf16`; fp32 by default on CPU). Every system gets the same shapes and the same random batch of full-length
rows (tokens per step are B x T for everyone), though each still builds its padding masks.

Translator (`--preset`, sizes below; TranslationModule's defaults otherwise): ours is the network and loss
`TranslationModule` trains (`core.nn.linear_cross_entropy`: no (tokens, V) logits tensor), its encoder and
decoder stacks compiled in place for each `--compile` mode; HF MarianMTModel of the same size (post-LN, SDPA
attention) with label-smoothed `F.cross_entropy` on its logits, its whole loss function compiled. Marian is
skipped with a note where `transformers` does not import (without CUDA the script re-runs itself in
`.venv-translate`, `make bench-env-translate`). A compile that fails becomes a note, not an error.
StreamRec (ML-1M-like: 3,416 items, histories of 200, d_model 64, 2 layers, 1 head, batch 128): ours, eager and
with its encoder compiled.

Measured: step time (median of `--rounds` interleaved rounds of `--steps` steps after `--warmup`), tokens/s or
sequences/s, FLOPs per step (`FlopCounterMode`, eager), MFU (ours' FLOPs / step time / `--peak-tflops`, by
default 989: H100/H200 SXM bf16 dense), peak memory (parameters + optimizer state + one step's peak).

Presets (d_model, heads, encoder+decoder layers, d_ff, vocabulary, batch x length):
  d512 512, 8, 6+6, 2048, 32000, 64 x 128;  d1024 1024, 16, 6+6, 4096, 32000, 32 x 256;
  multi30k 128, 4, 4+4, 256, 10000, 128 x 32;  tiny 32, 2, 1+1, 64, 300, 4 x 8 (CPU smoke tests)

    python benchmarks/gpu_train.py --preset d512 --json runs/gpu_train_d512.json
    python benchmarks/gpu_train.py --preset tiny --device cpu --steps 2     # CPU smoke run, no compile
    bash benchmarks/gpu/run_all.sh                                          # every preset + CUDA tests (GPU box)

Targets (printed, never asserted): at d512 and d1024 ours trains >= 1.3x the tokens/s of HF Marian's faster row
and reaches MFU >= 45% at d1024.

JSON keys: the setting (d_model, n_heads, n_layers, d_ff, vocab, batch_size, length, steps, warmup, rounds, bf16,
cuda, hf_available, peak_tflops), `translate_{ours,hf}_{eager,compile_MODE}_{step_ms,tok_s,tflops,peak_mib[,mfu]}`,
`translate_{ours,hf}_flops_per_step`, `translate_{speedup,eager_speedup}_vs_hf`, `translate_mfu_best`,
`streamrec_ours_{eager,compile_MODE}_{step_ms,seq_s,tflops,peak_mib[,mfu]}`, `streamrec_ours_flops_per_step` and
streamrec_{num_items,max_len,batch_size,d_model,n_layers}.

Legend: B batch, T length, D model width, V vocabulary, N items.
"""

from __future__ import annotations

import importlib.util
import sys

import torch
from _common import ROOT, ensure_peer_venv, for_signature

if (__name__ == "__main__" and "--no-hf" not in sys.argv and importlib.util.find_spec("transformers") is None
        and not torch.cuda.is_available()):
    # The peer venv holds the CPU wheel of torch: hand over only where CUDA is missing anyway.
    if (ROOT / ".venv-translate" / "bin" / "python").exists():
        ensure_peer_venv(__file__, ["transformers"], ".venv-translate", "bench-env-translate")

# ruff: noqa: E402  (imports after the venv check on purpose)
import argparse
import copy
import gc
import os
import statistics
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from _common import (
    interleave,
    median_ratio,
    print_table,
    require_bf16_kernels,
    step_peak_bytes,
    write_json,
)
from rich.console import Console
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from streamrec.data.datasets import TrainBatch
from streamrec.model.module import StreamRecModule
from translate.data.corpus import Batch
from translate.data.vocab import BOS_ID, EOS_ID, PAD_ID
from translate.model.module import TranslationModule

H100_BF16_DENSE_TFLOPS = 989.0  # H100 / H200 SXM, bf16 tensor cores, dense (no 2:4 sparsity)
FIRST_WORD = 4  # ids below are pad, unk, bos, eos
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TARGETS = {"hf": 1.3}  # ours' step throughput over the peer's faster row, at d512 and d1024
MFU_TARGET = 0.45  # at d1024
PEERS = {"hf": "HF MarianMTModel"}


@dataclass(frozen=True)
class Preset:
    """Translator sizes and batch, and the StreamRec sizes that go with them."""

    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    vocab: int
    batch_size: int
    length: int
    num_items: int = 3416  # ML-1M's catalogue
    max_len: int = 200  # ML-1M histories (configs/streamrec/ml1m.yaml)
    rec_batch_size: int = 128
    rec_d_model: int = 64
    rec_n_heads: int = 1
    rec_n_layers: int = 2


PRESETS = {
    "d512": Preset(512, 8, 6, 2048, 32000, 64, 128),
    "d1024": Preset(1024, 16, 6, 4096, 32000, 32, 256),
    "multi30k": Preset(128, 4, 4, 256, 10000, 128, 32),
    "tiny": Preset(32, 2, 1, 64, 300, 4, 8, num_items=50, max_len=12, rec_batch_size=4, rec_d_model=16,
                   rec_n_heads=2, rec_n_layers=1),
}


@dataclass(eq=False)
class System:
    """One timed training setup: `step` runs forward + loss + backward + optimizer step."""

    peer: str  # "ours" or a key of PEERS
    who: str  # how the table names the peer
    mode: str | None  # torch.compile mode, None = eager
    step: Callable[[], None]
    static_bytes: Callable[[], int]

    @property
    def name(self) -> str:
        """JSON key part: "{peer}_eager" or "{peer}_compile_{mode}"."""
        return f"{self.peer}_{'eager' if self.mode is None else 'compile_' + self.mode.replace('-', '_')}"

    @property
    def how(self) -> str:
        return "eager" if self.mode is None else f"compile {self.mode}"

    @property
    def label(self) -> str:
        return f"{self.who}, {self.how}"


@dataclass
class Section:
    """What a section's table and targets need."""

    key: str  # JSON prefix
    title: str
    unit: str  # "tokens/s" or "sequences/s"
    unit_key: str  # "tok_s" or "seq_s"
    units_per_step: int
    systems: list[System] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cuda = torch.cuda.is_available()
    sizes = "; ".join(f"{name}: D {c.d_model}, {c.n_layers}+{c.n_layers} layers, V {c.vocab}, B {c.batch_size} x T "
                      f"{c.length}" for name, c in PRESETS.items())
    p.add_argument("--preset", choices=sorted(PRESETS), default="d512", help=f"sizes (default d512). {sizes}")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if cuda else "cpu",
                   help="where to train (default cuda when available)")
    p.add_argument("--precision", choices=("bf16", "fp32"), help="autocast dtype (default bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--compile", nargs="+", choices=COMPILE_MODES, metavar="MODE",
                   help=f"torch.compile modes, a compiled row each ({', '.join(COMPILE_MODES)}; default: default on "
                        "CUDA, none on CPU)")
    p.add_argument("--sections", nargs="+", choices=("translate", "streamrec"), default=["translate", "streamrec"],
                   help="which sections to run (default both)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per round and system (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per system first (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--peak-tflops", type=float,
                   help=f"the device's peak TFLOP/s for MFU (default {H100_BF16_DENSE_TFLOPS:g} on CUDA: H100/H200 "
                        "bf16 dense; on CPU MFU is n/a unless given)")
    p.add_argument("--no-hf", action="store_true", help="leave HF MarianMTModel out (and never switch venvs)")
    p.add_argument("--threads", type=int, help="torch threads on CPU (default torch's)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and batches (default 0)")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    if args.device == "cuda" and not cuda:
        p.error("--device cuda: torch sees no CUDA device here; use --device cpu")
    args.precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    args.compile = [m for m in (args.compile or (["default"] if args.device == "cuda" else ["none"])) if m != "none"]
    for name in ("steps", "warmup", "rounds", "threads"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warmup" else 1):
            p.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'warmup' else 1}, got {value}")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        p.error(f"--peak-tflops must be > 0, got {args.peak_tflops}")
    preset = PRESETS[args.preset]
    for name in ("d_model", "n_heads", "n_layers", "d_ff", "vocab", "batch_size", "length", "num_items", "max_len",
                 "rec_batch_size"):
        setattr(args, name, getattr(preset, name))
    args.rec = preset
    if args.peak_tflops is None and args.device == "cuda":
        args.peak_tflops = H100_BF16_DENSE_TFLOPS
    return args


# ----------------------------------------------------------------------------- steps and measurements


def adamw(params, lr: float, betas: tuple[float, float], weight_decay: float, device: torch.device):
    """AdamW as the modules configure it; fused into one kernel per step on CUDA."""
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay,
                             fused=True if device.type == "cuda" else None)


def train_step(loss_fn: Callable[[], Tensor], opt: torch.optim.Optimizer,
               autocast: Callable[[], AbstractContextManager]) -> Callable[[], None]:
    def step() -> None:
        with autocast():
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def static_bytes(module: nn.Module, opt: torch.optim.Optimizer) -> Callable[[], int]:
    """Bytes of parameters and optimizer state (read after the warm-up, when the state exists)."""

    def count() -> int:
        tensors = {p.data_ptr(): p.nbytes for p in module.parameters()}
        for state in opt.state.values():
            tensors |= {t.data_ptr(): t.nbytes for t in state.values() if isinstance(t, Tensor) and t.dim() > 0}
        return sum(tensors.values())

    return count


def count_flops(step: Callable[[], None]) -> int:
    """FLOPs of one step (matmuls and attention kernels), counted at dispatch."""
    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


# ----------------------------------------------------------------------------- translator


def translator_batch(args: argparse.Namespace, device: torch.device) -> Batch:
    """(B, T) full-length random sources and targets: tgt_in = BOS + words, tgt_out = words + EOS."""
    g = torch.Generator().manual_seed(args.seed + 1)
    b, t = args.batch_size, args.length
    src = torch.randint(FIRST_WORD, args.vocab, (b, t), generator=g)
    words = torch.randint(FIRST_WORD, args.vocab, (b, t - 1), generator=g)
    tgt_in = torch.cat([torch.full((b, 1), BOS_ID), words], 1)
    tgt_out = torch.cat([words, torch.full((b, 1), EOS_ID)], 1)
    return Batch(src.to(device), tgt_in.to(device), tgt_out.to(device), torch.arange(b, device=device))


def build_marian(args: argparse.Namespace, max_len: int):
    """HF MarianMTModel of our size with SDPA attention (random weights: Marian is post-LN, ours pre-LN)."""
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=args.vocab, decoder_vocab_size=args.vocab, d_model=args.d_model,
        encoder_layers=args.n_layers, decoder_layers=args.n_layers, encoder_attention_heads=args.n_heads,
        decoder_attention_heads=args.n_heads, encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff,
        activation_function="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.1,
        max_position_embeddings=max_len, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None, attn_implementation="sdpa",
    )
    return MarianMTModel(config)


def translator_section(args: argparse.Namespace, device: torch.device, autocast, figures: dict[str, float],
                       log: Console) -> Section:
    """Build every translator system on `device`, from one set of our weights where the layout allows."""
    torch.manual_seed(args.seed)
    max_len = max(args.length, 128)
    module = TranslationModule(args.vocab, args.vocab, pad_id=PAD_ID, d_model=args.d_model, n_heads=args.n_heads,
                               n_encoder_layers=args.n_layers, n_decoder_layers=args.n_layers, d_ff=args.d_ff,
                               max_len=max_len)
    hp = module.hparams
    module.to(device)
    batch = translator_batch(args, device)
    smoothing = module.objective.label_smoothing
    section = Section("translate", f"Translator training step: d_model {args.d_model}, {args.n_layers}+{args.n_layers}"
                      f" layers, {args.n_heads} heads, FFN {args.d_ff}, vocab {args.vocab}, batch {args.batch_size} x "
                      f"{args.length}", "tokens/s", "tok_s", args.batch_size * args.length)

    module.train()
    opt_args = dict(lr=hp.lr, betas=tuple(module.optimizer.betas), weight_decay=hp.weight_decay, device=device)

    def add(peer: str, label: str, model: nn.Module, loss_fn: Callable[[], Tensor], mode: str | None) -> None:
        opt = adamw(model.parameters(), **opt_args)
        section.systems.append(System(peer, label, mode, train_step(loss_fn, opt, autocast), static_bytes(model, opt)))

    copies = {mode: copy.deepcopy(module) for mode in args.compile}  # before any step
    add("ours", "ours", module, lambda: module.compute_loss(batch), None)
    for mode, mod in copies.items():
        for stack in (mod.model.encoder, mod.model.decoder):
            stack.compile(mode=mode)  # in place; the embeddings and the chunked loss stay eager
        add("ours", "ours", mod, lambda mod=mod: mod.compute_loss(batch), mode)
    figures["hf_available"] = 0
    if args.no_hf:
        section.notes.append(f"{PEERS['hf']}: left out (--no-hf)")
    elif importlib.util.find_spec("transformers") is None:
        section.notes.append(f"{PEERS['hf']}: skipped, transformers is not installed here; `make bench-env-translate` "
                             "creates .venv-translate, where this script re-runs itself on a machine without CUDA "
                             "(on a GPU, install transformers into this environment)")
    else:
        import transformers

        transformers.logging.set_verbosity_error()
        torch.manual_seed(args.seed)
        try:
            hf = build_marian(args, max_len).to(device).train()
        except Exception as e:  # an API change in transformers becomes a note; ours still runs
            section.notes.append(f"{PEERS['hf']}: skipped, building it failed with transformers "
                                 f"{transformers.__version__}: {type(e).__name__}: {str(e)[:200]}")
            return section
        figures["hf_available"] = 1
        impl = getattr(hf.config, "_attn_implementation", "?")
        log.log(f"HF MarianMTModel, transformers {transformers.__version__}, attention {impl}")

        def hf_loss(model: nn.Module) -> Callable[[], Tensor]:
            def loss() -> Tensor:
                logits = model(input_ids=batch.src, attention_mask=batch.src != PAD_ID,
                               decoder_input_ids=batch.tgt_in).logits
                return nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(),
                                                   ignore_index=PAD_ID, label_smoothing=smoothing)
            return loss

        hf_copies = {mode: copy.deepcopy(hf) for mode in args.compile}
        add("hf", f"{PEERS['hf']} ({impl})", hf, hf_loss(hf), None)
        for mode, m in hf_copies.items():
            add("hf", f"{PEERS['hf']} ({impl})", m, torch.compile(hf_loss(m), mode=mode), mode)
    return section


# ----------------------------------------------------------------------------- StreamRec


def streamrec_section(args: argparse.Namespace, device: torch.device, autocast, figures: dict[str, float],
                      log: Console) -> Section:
    """Ours, eager and compiled, on one batch of full-length histories."""
    rec = args.rec
    torch.manual_seed(args.seed)
    module = StreamRecModule(**for_signature(
        StreamRecModule, num_items=args.num_items, d_model=rec.rec_d_model, n_heads=rec.rec_n_heads,
        n_layers=rec.rec_n_layers, max_len=args.max_len, loss="full", popularity_baseline=False))
    module.to(device)
    g = torch.Generator().manual_seed(args.seed + 2)
    shape = (args.rec_batch_size, args.max_len)
    items = torch.randint(1, args.num_items + 1, shape, generator=g).to(device)
    targets = torch.randint(1, args.num_items + 1, shape, generator=g).to(device)
    for name, value in (("num_items", args.num_items), ("max_len", args.max_len),
                        ("batch_size", args.rec_batch_size), ("d_model", rec.rec_d_model),
                        ("n_layers", rec.rec_n_layers)):
        figures[f"streamrec_{name}"] = value
    section = Section("streamrec", f"StreamRec training step: {args.num_items} items, histories of {args.max_len}, "
                      f"d_model {rec.rec_d_model}, {rec.rec_n_layers} layers, {rec.rec_n_heads} head(s), batch "
                      f"{args.rec_batch_size}", "sequences/s", "seq_s", args.rec_batch_size)

    batch = TrainBatch(inputs=items, targets=targets)

    def ours_loss(mod: StreamRecModule) -> Callable[[], Tensor]:
        return lambda: mod.training_step(batch, 0)  # its loss as fit trains it

    module.train()
    copies = {mode: copy.deepcopy(module) for mode in args.compile}

    def add(model: nn.Module, loss_fn: Callable[[], Tensor], mode: str | None) -> None:
        opt = adamw(model.parameters(), lr=module.hparams.lr, betas=(0.9, 0.999), weight_decay=0.0, device=device)
        section.systems.append(System("ours", "ours", mode, train_step(loss_fn, opt, autocast),
                                      static_bytes(model, opt)))

    add(module, ours_loss(module), None)
    for mode, mod in copies.items():
        mod.model.encoder.compile(mode=mode)  # in place; trimming, embeddings and the loss stay eager
        add(mod, ours_loss(mod), mode)
    return section


# ----------------------------------------------------------------------------- running and reporting


def run_section(section: Section, args: argparse.Namespace, device: torch.device, figures: dict[str, float],
                console: Console, log: Console) -> None:
    """Warm up (dropping systems that fail), count FLOPs, measure memory, time interleaved rounds, report."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    ok: list[System] = []
    for system in section.systems:
        log.log(f"{section.key}: warm-up of {system.label} ({max(args.warmup, 1)} steps)")
        try:
            for _ in range(max(args.warmup, 1)):  # a compiled row compiles here
                system.step()
            if sync is not None:
                sync()
        except Exception as e:  # a failed compile or peer becomes a note; the run goes on
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            section.notes.append(f"{system.label}: skipped, {type(e).__name__}: {first}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        ok.append(system)
    key = section.key
    flops: dict[str, int] = {}
    for system in ok:
        if system.mode is None:
            flops[system.peer] = count_flops(system.step)
            figures[f"{key}_{system.peer}_flops_per_step"] = flops[system.peer]
    peaks = {s.name: step_peak_bytes(s.step, device.type) + s.static_bytes() for s in ok}
    log.log(f"{section.key}: {args.rounds} interleaved rounds of {args.steps} steps: {', '.join(s.label for s in ok)}")
    times = interleave({s.name: s.step for s in ok}, args.rounds, sync=sync, number=args.steps)
    model_flops = flops.get("ours", 0)
    rows = []
    for s in ok:
        step_s = statistics.median(times[s.name])
        f = {"step_ms": 1e3 * step_s, section.unit_key: section.units_per_step / step_s,
             "tflops": model_flops / step_s / 1e12, "peak_mib": peaks[s.name] / 2**20}
        if args.peak_tflops:
            f["mfu"] = f["tflops"] / args.peak_tflops
        figures.update({f"{key}_{s.name}_{k}": v for k, v in f.items()})
        rows.append([s.label, f"{f['step_ms']:.2f}", f"{f[section.unit_key]:,.0f}", f"{f['tflops']:.3g}",
                     f"{100 * f['mfu']:.1f}%" if "mfu" in f else "n/a", f"{f['peak_mib']:,.1f}"])
    rows += [[s.label, "skipped", "", "", "", ""] for s in section.systems if s not in ok]
    print_table(console, section.title, ["system", "step ms", section.unit, "TFLOP/s", "MFU", "peak MiB"], rows)
    for note in section.notes:
        console.print(f"[yellow]note[/]: {note}")
    if flops:
        console.print("FLOPs per step (FlopCounterMode, eager): " + ", ".join(
            f"{PEERS.get(p, p)} {n / 1e9:.4g} GFLOP" for p, n in flops.items()) + "; TFLOP/s and MFU use ours' count")
    report_targets(section, ok, times, args, figures, console)


def fastest(systems: list[System], times: dict[str, list[float]], peer: str) -> System | None:
    rows = [s for s in systems if s.peer == peer]
    return min(rows, key=lambda s: statistics.median(times[s.name])) if rows else None


def report_targets(section: Section, ok: list[System], times: dict[str, list[float]], args: argparse.Namespace,
                   figures: dict[str, float], console: Console) -> None:
    """Ours (eager, and its faster row) against each peer's faster row; MFU of ours' faster row."""
    key = section.key
    ours_best = fastest(ok, times, "ours")
    ours_eager = next((s for s in ok if s.peer == "ours" and s.mode is None), None)
    rows = []
    for peer in ("hf",) if key == "translate" else ():
        theirs = fastest(ok, times, peer)
        target = TARGETS[peer] if key == "translate" else None
        wanted = f">= {target}x" if target else "-"
        for tag, ours in (("eager_speedup", ours_eager), ("speedup", ours_best)):
            what = f"ours {'eager' if tag == 'eager_speedup' else '(faster row)'} / {PEERS[peer]} (faster row)"
            ratio = None if ours is None or theirs is None else median_ratio(times[theirs.name], times[ours.name])
            if ratio is not None:
                figures[f"{key}_{tag}_vs_{peer}"] = ratio
            if tag == "speedup" and ours is ours_eager:
                continue  # the row above: nothing compiled beat ours eager
            if ratio is None:
                rows.append([what, "", "n/a", wanted, "n/a"])
                continue
            met = "-" if target is None else ("yes" if ratio >= target else "no")
            rows.append([what, f"{ours.how} / {theirs.how}", f"{ratio:.2f}x", wanted, met])
    if key == "translate" and ours_best is not None and args.peak_tflops:
        mfu = figures[f"{key}_{ours_best.name}_mfu"]
        figures[f"{key}_mfu_best"] = mfu
        rows.append(["MFU of ours (faster row)", ours_best.how, f"{100 * mfu:.1f}%", f">= {100 * MFU_TARGET:.0f}%",
                     "yes" if mfu >= MFU_TARGET else "no"])
    where = " (targets at d512 and d1024; MFU at d1024)" if key == "translate" else ""
    print_table(console, f"{section.title.split(':')[0]}: step throughput, ratios{where}",
                ["comparison", "rows", "ratio", "target", "target met"], rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    bf16 = args.precision == "bf16"
    if device.type == "cpu":
        if bf16:
            require_bf16_kernels("--precision bf16")
        if args.threads:
            torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*enable_nested_tensor is True.*")
    warnings.filterwarnings("ignore", ".*self.log.*")  # training_step logs; there is no trainer here
    console = Console(width=None if sys.stdout.isatty() else 140)
    log = Console(stderr=True, log_path=False, width=None if sys.stderr.isatty() else 140)

    def autocast() -> AbstractContextManager:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    console.print(f"[bold]Training step: ours vs HF Marian; StreamRec[/] ({args.preset}) | "
                  f"{where} | torch {torch.__version__} | {args.precision} | "
                  f"compile: {', '.join(args.compile) or 'none'} | AdamW{' fused' if device.type == 'cuda' else ''}")
    console.print(f"MFU against {args.peak_tflops:g} TFLOP/s" if args.peak_tflops else "MFU: n/a (no --peak-tflops)")
    if not args.compile:
        console.print("compiled rows: none (" + ("the default on CPU, where inductor's C++ build is slow; pass "
                      "--compile default to compile here)" if device.type == "cpu" else "--compile none)"))
    figures: dict[str, float] = {
        "d_model": args.d_model, "n_heads": args.n_heads, "n_layers": args.n_layers, "d_ff": args.d_ff,
        "vocab": args.vocab, "batch_size": args.batch_size, "length": args.length, "steps": args.steps,
        "warmup": args.warmup, "rounds": args.rounds, "bf16": int(bf16), "cuda": int(device.type == "cuda"),
    }
    if args.peak_tflops:
        figures["peak_tflops"] = args.peak_tflops
    builders = {"translate": translator_section, "streamrec": streamrec_section}
    for name in args.sections:
        section = builders[name](args, device, autocast, figures, log)
        run_section(section, args, device, figures, console, log)
        del section
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.json:  # after each section: a run stopped by a time limit keeps what it measured
            write_json(args.json, figures)
    if args.json:
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
