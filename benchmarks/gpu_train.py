"""Training-step speed on a GPU: ours against HF MarianMTModel, one run; and StreamRec's step throughput.

One step = forward + loss + backward + AdamW (fused on CUDA) under bf16 autocast on CUDA (`--precision`; fp32 by
default on CPU), on one random batch of full-length rows. Translator (`--preset`): ours is what `TranslationModule`
trains, its stacks compiled in place for each `--compile` mode; HF MarianMTModel of the same size (SDPA) with
label-smoothed cross-entropy on its logits, its loss function compiled; Marian is a note where `transformers` does
not import, and so is a compile that fails. StreamRec: ML-1M's shape (3,416 items, histories of 200, d_model 64, 2
layers, 1 head, batch 128), eager and compiled. Measured: step time (median of `--rounds` interleaved rounds of
`--steps` steps after `--warmup`), tokens/s or sequences/s, FLOP/s (ours' eager `FlopCounterMode` count over each
row's time) and MFU against the device's GEMM peak in the step's precision measured in the run, peak memory
(parameters + optimizer state + one step's peak).

    python benchmarks/gpu_train.py --preset d512 --json runs/gpu_train_d512.json
    python benchmarks/gpu_train.py --preset tiny --device cpu --steps 2     # CPU smoke run, no compile

Targets (printed): at d512 and d1024 ours >= 1.3x the tokens/s of HF Marian's faster row; MFU >= 45% at d1024.

JSON keys: the setting, peak_flop_s, `{section}_{ours,hf}_{eager,compile_MODE}_{step_ms,tok_s|seq_s,flop_s,mfu,
peak_mib}`, `{section}_ours_flops_per_step`, `translate_{speedup,eager_speedup}_vs_hf`, `translate_mfu_best`.
"""

from __future__ import annotations

import importlib.util
import sys

import torch
from _common import ROOT, ensure_peer_venv, for_signature

if (__name__ == "__main__" and "--no-hf" not in sys.argv and importlib.util.find_spec("transformers") is None
        and not torch.cuda.is_available() and (ROOT / ".venv-translate" / "bin" / "python").exists()):
    ensure_peer_venv(__file__, ["transformers"], ".venv-translate", "bench-env-translate")  # a CPU-only venv

# ruff: noqa: E402  (imports after the venv check on purpose)
import argparse
import copy
import gc
import os
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import _common
from torch import Tensor, nn

from streamrec.data.datasets import TrainBatch
from streamrec.model.module import StreamRecModule
from translate.data.corpus import Batch
from translate.data.vocab import BOS_ID, EOS_ID, PAD_ID
from translate.model.module import TranslationModule

FIRST_WORD = 4  # ids below are pad, unk, bos, eos
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
HF_TARGET, MFU_TARGET = 1.3, 0.45
# name: d_model, heads, encoder = decoder layers, d_ff, vocabulary, batch, length; StreamRec: items, max_len, batch,
# d_model, heads, layers
PRESETS = {
    "d512": ((512, 8, 6, 2048, 32000, 64, 128), (3416, 200, 128, 64, 1, 2)),
    "d1024": ((1024, 16, 6, 4096, 32000, 32, 256), (3416, 200, 128, 64, 1, 2)),
    "multi30k": ((128, 4, 4, 256, 10000, 128, 32), (3416, 200, 128, 64, 1, 2)),
    "tiny": ((32, 2, 1, 64, 300, 4, 8), (50, 12, 4, 16, 2, 1)),
}


@dataclass(eq=False)
class System:
    peer: str  # "ours" or "hf"
    mode: str | None  # torch.compile mode, None = eager
    name: str  # JSON key part: {peer}_eager, {peer}_compile_{mode}
    label: str
    step: Callable[[], None]
    static_bytes: Callable[[], int]


@dataclass
class Section:
    key: str  # JSON prefix
    title: str
    unit_key: str  # "tok_s" or "seq_s"
    units_per_step: int
    systems: list[System] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, peer: str, who: str, model: nn.Module, loss_fn: Callable[[], Tensor], mode: str | None,
            autocast, device: torch.device, **opt_args) -> None:
        opt = torch.optim.AdamW(model.parameters(), fused=True if device.type == "cuda" else None, **opt_args)

        def step() -> None:
            with autocast():
                loss = loss_fn()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def static_bytes() -> int:  # parameters and optimizer state, read after the warm-up
            tensors = {p.data_ptr(): p.nbytes for p in model.parameters()}
            for state in opt.state.values():
                tensors |= {t.data_ptr(): t.nbytes for t in state.values() if isinstance(t, Tensor) and t.dim()}
            return sum(tensors.values())

        how = "eager" if mode is None else f"compile_{mode.replace('-', '_')}"
        label = f"{who}, {'eager' if mode is None else 'compile ' + mode}"
        self.systems.append(System(peer, mode, f"{peer}_{how}", label, step, static_bytes))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cuda = torch.cuda.is_available()
    p.add_argument("--preset", choices=sorted(PRESETS), default="d512", help="sizes (default d512)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if cuda else "cpu")
    p.add_argument("--precision", choices=("bf16", "fp32"), help="autocast dtype (default bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--compile", nargs="+", choices=COMPILE_MODES, metavar="MODE",
                   help="torch.compile modes, a row each (default: default on CUDA, none on CPU)")
    p.add_argument("--sections", nargs="+", choices=("translate", "streamrec"), default=["translate", "streamrec"])
    p.add_argument("--steps", type=int, default=10, help="timed steps per round and system (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per system first (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--no-hf", action="store_true", help="leave HF MarianMTModel out (and never switch venvs)")
    p.add_argument("--threads", type=int, help="torch threads on CPU (default torch's)")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    if args.device == "cuda" and not cuda:
        p.error("--device cuda: torch sees no CUDA device here; use --device cpu")
    args.precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    args.compile = [m for m in (args.compile or (["default"] if args.device == "cuda" else ["none"])) if m != "none"]
    for name in ("steps", "warmup", "rounds", "threads"):
        low, value = 0 if name == "warmup" else 1, getattr(args, name)
        if value is not None and value < low:
            p.error(f"--{name} must be >= {low}, got {value}")
    args.size, args.rec = PRESETS[args.preset]
    return args


def translator_section(args, device: torch.device, autocast, figures: dict[str, float], log) -> Section:
    """Ours (eager and compiled) and HF Marian of the same size on one (B, T) batch."""
    d, heads, layers, d_ff, vocab, b, t = args.size
    torch.manual_seed(0)
    max_len = max(t, 128)
    module = TranslationModule(vocab, vocab, pad_id=PAD_ID, d_model=d, n_heads=heads, n_encoder_layers=layers,
                               n_decoder_layers=layers, d_ff=d_ff, max_len=max_len).to(device).train()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(FIRST_WORD, vocab, (b, t), generator=g)
    words = torch.randint(FIRST_WORD, vocab, (b, t - 1), generator=g)
    batch = Batch(src.to(device), torch.cat([torch.full((b, 1), BOS_ID), words], 1).to(device),
                  torch.cat([words, torch.full((b, 1), EOS_ID)], 1).to(device), torch.arange(b, device=device))
    section = Section("translate", f"Translator training step: d_model {d}, {layers}+{layers} layers, {heads} heads, "
                      f"FFN {d_ff}, vocab {vocab}, batch {b} x {t}", "tok_s", b * t)
    opt = dict(lr=module.hparams.lr, betas=tuple(module.optimizer.betas), weight_decay=module.hparams.weight_decay)
    copies = {mode: copy.deepcopy(module) for mode in args.compile}  # before any step
    section.add("ours", "ours", module, lambda: module.compute_loss(batch), None, autocast, device, **opt)
    for mode, mod in copies.items():
        for stack in (mod.model.encoder, mod.model.decoder):
            stack.compile(mode=mode)  # in place; the embeddings and the chunked loss stay eager
        section.add("ours", "ours", mod, lambda mod=mod: mod.compute_loss(batch), mode, autocast, device, **opt)
    figures["hf_available"] = 0
    if args.no_hf or importlib.util.find_spec("transformers") is None:
        section.notes.append("HF MarianMTModel: " + ("left out (--no-hf)" if args.no_hf else "skipped, transformers "
                             "is not installed (`make bench-env-translate`, or install it beside the CUDA torch)"))
        return section
    import transformers
    from transformers import MarianConfig, MarianMTModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=d, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=d_ff, decoder_ffn_dim=d_ff,
        activation_function="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.1,
        max_position_embeddings=max_len, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None, attn_implementation="sdpa")
    try:
        hf = MarianMTModel(config).to(device).train()
    except Exception as e:  # an API change in transformers becomes a note; ours still runs
        section.notes.append(f"HF MarianMTModel: skipped, transformers {transformers.__version__}: {e!s:.200}")
        return section
    figures["hf_available"] = 1
    smoothing = module.objective.label_smoothing

    def hf_loss(model: nn.Module) -> Callable[[], Tensor]:
        def loss() -> Tensor:
            logits = model(input_ids=batch.src, attention_mask=batch.src != PAD_ID,
                           decoder_input_ids=batch.tgt_in).logits
            return nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(),
                                               ignore_index=PAD_ID, label_smoothing=smoothing)
        return loss

    who = f"HF MarianMTModel ({getattr(hf.config, '_attn_implementation', '?')})"
    copies = {mode: copy.deepcopy(hf) for mode in args.compile}
    section.add("hf", who, hf, hf_loss(hf), None, autocast, device, **opt)
    for mode, m in copies.items():
        section.add("hf", who, m, torch.compile(hf_loss(m), mode=mode), mode, autocast, device, **opt)
    return section


def streamrec_section(args, device: torch.device, autocast, figures: dict[str, float], log) -> Section:
    """Ours, eager and compiled, on one batch of full-length histories."""
    items, max_len, b, d, heads, layers = args.rec
    torch.manual_seed(0)
    module = StreamRecModule(**for_signature(StreamRecModule, num_items=items, d_model=d, n_heads=heads,
                                             n_layers=layers, max_len=max_len, loss="full",
                                             popularity_baseline=False)).to(device).train()
    g = torch.Generator().manual_seed(2)
    inputs, targets = (torch.randint(1, items + 1, (b, max_len), generator=g).to(device) for _ in range(2))
    batch = TrainBatch(inputs=inputs, targets=targets)
    figures |= {"streamrec_num_items": items, "streamrec_max_len": max_len, "streamrec_batch_size": b}
    section = Section("streamrec", f"StreamRec training step: {items} items, histories of {max_len}, d_model {d}, "
                      f"{layers} layers, {heads} head(s), batch {b}", "seq_s", b)
    copies = {mode: copy.deepcopy(module) for mode in args.compile}
    opt = dict(lr=module.hparams.lr, betas=(0.9, 0.999), weight_decay=0.0)
    section.add("ours", "ours", module, lambda: module.training_step(batch, 0), None, autocast, device, **opt)
    for mode, mod in copies.items():
        mod.model.encoder.compile(mode=mode)  # in place; trimming, embeddings and the loss stay eager
        section.add("ours", "ours", mod, lambda mod=mod: mod.training_step(batch, 0), mode, autocast, device, **opt)
    return section


def run_section(section: Section, args, device: torch.device, peak: float, figures: dict[str, float], out,
                log) -> None:
    """Warm up (dropping systems that fail), count FLOPs, measure memory, time interleaved rounds, report."""
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    ok: list[System] = []
    for system in section.systems:
        log.log(f"{section.key}: warm-up of {system.label}")
        try:
            for _ in range(max(args.warmup, 1)):  # a compiled row compiles here
                system.step()
            sync()
            ok.append(system)
        except Exception as e:  # a failed compile or peer becomes a note; the run goes on
            section.notes.append(f"{system.label}: skipped, {type(e).__name__}: {str(e).strip()[:200]}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    key = section.key
    eager = next(s for s in ok if s.peer == "ours" and s.mode is None)
    flops = figures[f"{key}_ours_flops_per_step"] = _common.step_flops(eager.step)
    peaks = {s.name: _common.step_peak_bytes(s.step, device.type) + s.static_bytes() for s in ok}
    times = _common.interleave({s.name: s.step for s in ok}, args.rounds, sync=sync, number=args.steps)
    rows = []
    for s in ok:
        step_s = statistics.median(times[s.name])
        fl = _common.flop_figures(flops, step_s, peak)
        f = {"step_ms": 1e3 * step_s, section.unit_key: section.units_per_step / step_s, **fl,
             "peak_mib": peaks[s.name] / 2**20}
        figures.update({f"{key}_{s.name}_{k}": v for k, v in f.items()})
        rows.append([s.label, f"{f['step_ms']:.2f}", f"{f[section.unit_key]:,.0f}",
                     *_common.fmt_flops(fl["flop_s"], fl["mfu"]), f"{f['peak_mib']:,.1f}"])
    rows += [[s.label, "skipped", "", "", "", ""] for s in section.systems if s not in ok]
    unit = "tokens/s" if section.unit_key == "tok_s" else "sequences/s"
    _common.print_table(out, section.title, ["system", "step ms", unit, "GFLOP/s", "MFU", "peak MiB"], rows)
    for note in section.notes:
        out.print(f"[yellow]note[/]: {note}")
    out.print(f"ours: {flops / 1e9:.4g} GFLOP a step (FlopCounterMode, eager); every row's FLOP/s uses that count")

    best, theirs = (min((s for s in ok if s.peer == peer), key=lambda s: statistics.median(times[s.name]), default=None)
                    for peer in ("ours", "hf"))
    for tag, ours in (("eager_speedup", eager), ("speedup", best)) if theirs is not None else ():
        ratio = figures[f"{key}_{tag}_vs_hf"] = _common.median_ratio(times[theirs.name], times[ours.name])
        out.print(f"{ours.label} / {theirs.label}: {ratio:.2f}x (target >= {HF_TARGET}x at d512, d1024)")
    if key == "translate":
        mfu = figures["translate_mfu_best"] = figures[f"{key}_{best.name}_mfu"]
        out.print(f"MFU of {best.label}: {100 * mfu:.1f}% (target >= {100 * MFU_TARGET:.0f}% at d1024)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device, bf16, cpu = torch.device(args.device), args.precision == "bf16", args.device == "cpu"
    if cpu and bf16:
        _common.require_bf16_kernels("--precision bf16")
    if cpu and args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*enable_nested_tensor is True.*")
    warnings.filterwarnings("ignore", ".*self.log.*")  # training_step logs; there is no trainer here
    out, log = _common.console(width=140), _common.console(stderr=True, width=140)
    autocast = partial(torch.autocast, device.type, dtype=torch.bfloat16, enabled=bf16)
    peak = _common.peak_gemm_flops(args.precision, size=512 if args.preset == "tiny" else 1024 if cpu else 8192,
                                   device=device.type)
    where = (f"CPU, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}" if cpu
             else torch.cuda.get_device_name(device))
    out.print(f"[bold]Training step: ours vs HF Marian; StreamRec[/] ({args.preset}) | {where} | torch "
              f"{torch.__version__} | {args.precision} | compile: {', '.join(args.compile) or 'none'}")
    out.print(f"peak GEMM {args.preset}, {args.precision}: {peak / 1e12:.3g} TFLOP/s (MFU's denominator)")
    sizes = ("d_model", "n_heads", "n_layers", "d_ff", "vocab", "batch_size", "length")
    figures: dict[str, float] = {"steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "bf16": int(bf16),
                                 "cuda": int(not cpu), "peak_flop_s": peak, **dict(zip(sizes, args.size, strict=True))}
    builders = {"translate": translator_section, "streamrec": streamrec_section}
    for name in args.sections:
        run_section(builders[name](args, device, autocast, figures, log), args, device, peak, figures, out, log)
        gc.collect()
        if not cpu:
            torch.cuda.empty_cache()
        _common.write_json(args.json, figures)  # after each section: a run stopped by a time limit keeps its figures


if __name__ == "__main__":
    main()
