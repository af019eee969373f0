"""Translate against Hugging Face MarianMTModel and CTranslate2 on the same model: beam search and training speed.

One random model (d_model 256, 3+3 layers, 4 heads, FFN 1024 ReLU, vocabulary 8,000, shared embeddings, sinusoidal
positions, post-LN): our weights are copied into a `MarianMTModel`, which CTranslate2 converts (fp32 and int8), so
all compute one function (`max_logit_diff`); every decoder starts from the padding id 0, a zero embedding row
(CTranslate2's Marian convention). Ours runs with the CPU fast path on. Decoding: random sources (lengths 8-30)
sorted by length, batches of 32, beam 5, exactly 20 decoder steps a sentence for everyone. Training: forward +
loss + backward + AdamW on ~4,096-token batches, dropout and label smoothing 0.1 (`--precision bf16`: both under
autocast). Interleaved rounds; ratios are medians of per-round ratios (> 1: ours is faster). FLOP/s: ours'
`FlopCounterMode` count of the same work over each system's time; MFU against this machine's GEMM peak in that
precision at `--threads`, measured in the run (fp32's for CTranslate2's int8 too). The peers live in
`.venv-translate` (`make bench-env-translate`), where the script re-runs itself.

    python benchmarks/translate_speed.py --threads 2 --json runs/translate_speed.json
    python benchmarks/translate_speed.py --skip-train --threads 1      # decoding only

JSON keys: {ours,hf,ct2_fp32,ct2_int8}_decode_{s,tok_s,flop_s,mfu}, decode_speedup_vs_hf, ratio_vs_ct2_{fp32,int8},
agree_ours_hf, agree_ct2_fp32_hf, {ours,hf}_train_{s,tok_s,flop_s,mfu}, train_speedup_vs_hf, train_batches,
train_tokens, decode_gflop, train_gflop, peak_flop_s_{fp32,bf16}, max_logit_diff, plus the setting.
"""

from __future__ import annotations

import os
from pathlib import Path

from _common import ensure_peer_venv

if __name__ == "__main__":
    ensure_peer_venv(__file__, ["transformers", "ctranslate2"], ".venv-translate", "bench-env-translate")

# ruff: noqa: E402  (imports after the venv check on purpose)
import argparse
import statistics
import tempfile
import warnings
from collections.abc import Sequence
from types import SimpleNamespace

import _common
import torch
from torch import Tensor

from core.nn.cpu_fastpath import enable_cpu_fastpath
from translate.data.corpus import Batch, Example, TokenBatchSampler, collate
from translate.data.vocab import EOS_ID, PAD_ID, UNK_ID
from translate.model.module import translation_loss
from translate.model.transformer import TransformerTranslator
from translate.search.decoding import beam_search

START_ID = PAD_ID  # decoder start: a zero embedding in all three systems (see the module docstring)
FIRST_WORD = 4  # ids below are pad, unk, bos, eos
SMOOTHING = 0.1
SIZE = dict(d_model=256, n_heads=4, n_layers=3, d_ff=1024, vocab=8000, min_src=8, max_src=30, batch_size=32, beam=5,
            tgt_len=20, max_tokens=4096, train_batches=4, dropout=0.1)
QUICK = dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, vocab=300, max_src=12, batch_size=4, beam=3, tgt_len=7,
             max_tokens=128, train_batches=2)


def make_sources(n: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(FIRST_WORD, vocab, (t,), generator=g).tolist() for t in lengths]


def source_batches(sources: Sequence[Sequence[int]], batch_size: int) -> list[Tensor]:
    """Sentences sorted by length (as translate.infer does) and cut into (B, S) batches, right-padded with 0."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = [sources[i] for i in order[start : start + batch_size]]
        width = max(len(r) for r in rows)
        batches.append(torch.tensor([list(r) + [PAD_ID] * (width - len(r)) for r in rows]))
    return batches


def training_batches(s: SimpleNamespace, seed: int = 1) -> list[Batch]:
    """`s.train_batches` token-count batches (<= `s.max_tokens` padded tokens) spread over all lengths; targets are
    0.8-1.25x their source's length, like a real language pair."""
    n = 4000
    g = torch.Generator().manual_seed(seed)
    src = make_sources(n, s.min_src, s.max_src, s.vocab, seed)
    ratios = torch.empty(n).uniform_(0.8, 1.25, generator=g).tolist()
    tgt_lens = [max(1, min(s.max_src, round(len(x) * r))) for x, r in zip(src, ratios, strict=True)]
    tgt = [torch.randint(FIRST_WORD, s.vocab, (t,), generator=g).tolist() for t in tgt_lens]
    examples = [Example(i, x, t) for i, (x, t) in enumerate(zip(src, tgt, strict=True))]
    widths = [max(len(x), len(t) + 1) for x, t in zip(src, tgt, strict=True)]
    batches = list(TokenBatchSampler(widths, s.max_tokens))
    step = max(1, len(batches) // s.train_batches)
    return [collate([examples[i] for i in b]) for b in batches[::step][: s.train_batches]]


def build_ours(s: SimpleNamespace) -> TransformerTranslator:
    """Our translator at the benchmark size: post-LN like Marian, so the weights copy one to one."""
    torch.manual_seed(0)
    return TransformerTranslator(
        s.vocab, s.vocab, pad_id=PAD_ID, d_model=s.d_model, n_heads=s.n_heads, n_encoder_layers=s.n_layers,
        n_decoder_layers=s.n_layers, d_ff=s.d_ff, dropout=s.dropout, max_len=s.max_positions, positions="sinusoidal",
        norm_first=False, activation="relu", share_embeddings=True)


def build_marian(s: SimpleNamespace):
    """A randomly initialised MarianMTModel of the same size (its weights are then replaced by ours)."""
    from transformers import MarianConfig, MarianMTModel

    return MarianMTModel(MarianConfig(
        vocab_size=s.vocab, decoder_vocab_size=s.vocab, d_model=s.d_model, encoder_layers=s.n_layers,
        decoder_layers=s.n_layers, encoder_attention_heads=s.n_heads, decoder_attention_heads=s.n_heads,
        encoder_ffn_dim=s.d_ff, decoder_ffn_dim=s.d_ff, activation_function="relu", dropout=s.dropout,
        attention_dropout=0.0, activation_dropout=s.dropout, max_position_embeddings=s.max_positions,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True, pad_token_id=PAD_ID,
        eos_token_id=EOS_ID, decoder_start_token_id=START_ID, forced_eos_token_id=None))


@torch.no_grad()
def copy_weights(ours: TransformerTranslator, hf) -> None:
    """Put our weights into the Marian model, and Marian's sinusoid layout into ours: then both compute one function.
    Ours fuses q/k/v (self-attention) and k/v (cross-attention) into one projection, rows [q; k; v]."""
    d = ours.tgt_embed.weight.shape[1]
    hf.model.shared.weight.copy_(ours.tgt_embed.weight)  # encoder, decoder and lm_head share it

    def lin(dst, src, rows: slice = slice(None)) -> None:  # a Linear, a LayerNorm: any layer with weight and bias
        dst.weight.copy_(src.weight[rows])
        dst.bias.copy_(src.bias[rows])

    def attn(dst, fused, out) -> None:
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")[-(fused.weight.shape[0] // d):]):
            lin(getattr(dst, name), fused, slice(i * d, (i + 1) * d))
        lin(dst.out_proj, out)

    for mine, theirs in [*zip(ours.encoder.layers, hf.model.encoder.layers, strict=True),
                         *zip(ours.decoder.layers, hf.model.decoder.layers, strict=True)]:
        decoder = hasattr(mine, "cross_attn")
        attn(theirs.self_attn, mine.self_attn.qkv, mine.self_attn.out)
        lin(theirs.self_attn_layer_norm, (mine.self_block if decoder else mine.attn_block).norm)
        if decoder:
            lin(theirs.encoder_attn.q_proj, mine.cross_attn.q)
            attn(theirs.encoder_attn, mine.cross_attn.kv, mine.cross_attn.out)
            lin(theirs.encoder_attn_layer_norm, mine.cross_block.norm)
        lin(theirs.fc1, mine.ff.up)
        lin(theirs.fc2, mine.ff.down)
        lin(theirs.final_layer_norm, mine.ff_block.norm)
    hf.final_logits_bias.zero_()
    for stack, theirs in ((ours.encoder, hf.model.encoder), (ours.decoder, hf.model.decoder)):
        table = stack.additive.table  # (max_len, D), a non-persistent buffer of this instance
        table.copy_(theirs.embed_positions.weight[: table.shape[0]])


@torch.no_grad()
def max_logit_diff(ours: TransformerTranslator, hf, batch: Batch) -> float:
    """Largest |ours - Marian| teacher-forced logit on one batch (eval mode, fp32)."""
    tgt_in = batch.tgt_in.clone()
    tgt_in[:, 0] = START_ID
    mine = ours(batch.src, tgt_in)
    theirs = hf(input_ids=batch.src, attention_mask=batch.src != PAD_ID, decoder_input_ids=tgt_in).logits
    real = batch.tgt_out != PAD_ID  # logits after the target's end differ by design (no target mask in ours)
    return float((mine - theirs).abs()[real].max())


def vocab_tokens(vocab: int) -> list[str]:
    """Token strings for CTranslate2 (it reads and writes tokens, not ids): id i is `w{i}`."""
    return ["<pad>", "<unk>", "<s>", "</s>", *(f"w{i}" for i in range(FIRST_WORD, vocab))]


def convert_ct2(hf, vocab: int, workdir: Path) -> Path:
    """Save the Marian model and convert it with CTranslate2's TransformersConverter (fp32 on disk)."""
    import ctranslate2
    from ctranslate2.converters import transformers as ct2_transformers

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):  # a random model has no files for it
            tokens = vocab_tokens(vocab)  # what CTranslate2's Marian loader reads: the vocabulary, two special tokens
            return SimpleNamespace(tokens=tokens, eos_token=tokens[EOS_ID], unk_token=tokens[UNK_ID],
                                   get_vocab=lambda: {t: i for i, t in enumerate(tokens)})

    class Loader(ct2_transformers.MarianMTLoader):
        def _remove_pad_weights(self, spec) -> None:
            # Hub Marian models append <pad> as the last row, which the stock loader drops; ours is id 0
            # (a zero row, like theirs), so every row is a real token and all V are kept.
            pass

    hf_dir, ct2_dir = workdir / "marian", workdir / "ct2"
    hf.save_pretrained(hf_dir)
    loaders = ct2_transformers._MODEL_LOADERS
    stock = loaders["MarianConfig"]
    loaders["MarianConfig"] = Loader()
    try:
        Converter(str(hf_dir)).convert(str(ct2_dir), force=True)
    finally:
        loaders["MarianConfig"] = stock
    return ct2_dir


def decode_ours(model: TransformerTranslator, batches: Sequence[Tensor], beam: int, steps: int) -> list[list[int]]:
    """Best hypothesis per sentence after exactly `steps` decoder steps (the last one the forced EOS)."""
    out = []
    for src in batches:
        hyps = beam_search(model, src, START_ID, EOS_ID, beam_size=beam, max_len_a=0.0, max_len_b=steps - 1,
                           max_len=steps - 1)
        out += [h[0].tokens for h in hyps]
    return out


@torch.no_grad()
def decode_hf(model, batches: Sequence[Tensor], beam: int, steps: int) -> list[list[int]]:
    """Marian's generate with exactly `steps` new tokens (EOS suppressed before, none forced)."""
    out = []
    for src in batches:
        ids = model.generate(
            input_ids=src, attention_mask=src != PAD_ID, num_beams=beam, do_sample=False, max_new_tokens=steps,
            min_new_tokens=steps, decoder_start_token_id=START_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
            forced_eos_token_id=None, num_return_sequences=1)
        out += ids[:, 1:].tolist()  # drop the start token
    return out


def decode_ct2(translator, token_batches: Sequence[list[list[str]]], beam: int, steps: int,
               index: dict[str, int]) -> list[list[int]]:
    out = []
    for tokens in token_batches:
        results = translator.translate_batch(tokens, beam_size=beam, min_decoding_length=steps,
                                             max_decoding_length=steps, num_hypotheses=1, max_batch_size=0)
        out += [[index[t] for t in r.hypotheses[0]] for r in results]
    return out


def agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], n: int) -> float:
    return sum(list(x[:n]) == list(y[:n]) for x, y in zip(a, b, strict=True)) / len(a)


def train_step(model, opt: torch.optim.Optimizer, batch: Batch, bf16: bool) -> None:
    """One step of ours (`translation_loss`) or Marian (its own loss on `labels`, -100 its ignore index)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if isinstance(model, TransformerTranslator):
            loss = translation_loss(model, batch, PAD_ID, SMOOTHING)
        else:
            loss = model(input_ids=batch.src, attention_mask=batch.src != PAD_ID, decoder_input_ids=batch.tgt_in,
                         labels=batch.tgt_out.masked_fill(batch.tgt_out == PAD_ID, -100)).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), weight_decay=1e-4)


def run_decode(log, s: SimpleNamespace, ours: TransformerTranslator, hf,
               f: dict[str, float]) -> list[list[str]]:
    sources = make_sources(s.sentences, s.min_src, s.max_src, s.vocab, seed=0)
    batches = source_batches(sources, s.batch_size)
    steps, beam = s.tgt_len, s.beam
    out: dict[str, list[list[int]]] = {}
    fns = {"ours": lambda: out.__setitem__("ours", decode_ours(ours, batches, beam, steps)),
           "hf": lambda: out.__setitem__("hf", decode_hf(hf, batches, beam, steps))}
    tmp = tempfile.TemporaryDirectory(prefix="translate_speed_")
    if not s.no_ct2:
        import ctranslate2

        log.log(f"converting the Marian model with CTranslate2 {ctranslate2.__version__}")
        ct2_dir = convert_ct2(hf, s.vocab, Path(tmp.name))
        tokens = vocab_tokens(s.vocab)
        index = {t: i for i, t in enumerate(tokens)}
        token_batches = [[[tokens[i] for i in row if i != PAD_ID] for row in src.tolist()] for src in batches]
        for kind, compute_type in (("fp32", "float32"), ("int8", "int8")):
            tr = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute_type,
                                        intra_threads=s.threads, inter_threads=1)
            fns[f"ct2_{kind}"] = (lambda tr=tr, kind=kind: out.__setitem__(
                f"ct2_{kind}", decode_ct2(tr, token_batches, beam, steps, index)))
    flops = f["decode_gflop"] = _common.step_flops(fns["ours"]) / 1e9
    log.log(f"decoding {len(sources)} sentences, {s.repeats} interleaved rounds of {', '.join(fns)}")
    times = _common.interleave(fns, s.repeats, warmup=True)  # CTranslate2 loads lazily; a full pass is cheap
    tmp.cleanup()
    rows = []
    for name, ts in times.items():
        f[f"{name}_decode_s"] = statistics.median(ts)
        f[f"{name}_decode_tok_s"] = len(sources) * steps / f[f"{name}_decode_s"]
        fl = _common.flop_figures(1e9 * flops, f[f"{name}_decode_s"], s.peaks["fp32"])
        f |= {f"{name}_decode_{k}": v for k, v in fl.items()}
        key = "decode_speedup_vs_hf" if name == "hf" else f"ratio_vs_{name}"
        if name != "ours":
            f[key] = _common.median_ratio(ts, times["ours"])
        rows.append([f"{name} decoding", f"{f[f'{name}_decode_s']:.2f}", f"{f[f'{name}_decode_tok_s']:.0f}",
                     *_common.fmt_flops(fl["flop_s"], fl["mfu"]), "" if name == "ours" else f"{f[key]:.2f}x"])
    f["agree_ours_hf"] = agreement(out["ours"], out["hf"], steps - 1)
    if not s.no_ct2:
        f["agree_ct2_fp32_hf"] = agreement(out["ct2_fp32"], out["hf"], steps)
    return rows


def run_train(log, s: SimpleNamespace, ours: TransformerTranslator, hf,
              f: dict[str, float]) -> list[list[str]]:
    batches = training_batches(s)
    ours, hf, bf16 = ours.train(), hf.train(), s.precision == "bf16"
    opts = {"ours": adamw(ours), "hf": adamw(hf)}
    fns = {name: lambda m=m, name=name: [train_step(m, opts[name], b, bf16) for b in batches]
           for name, m in (("ours", ours), ("hf", hf))}
    n_tok = sum(int((b.tgt_out != PAD_ID).sum()) for b in batches)
    flops = f["train_gflop"] = _common.step_flops(fns["ours"]) / 1e9
    log.log(f"training: {len(batches)} batches, {n_tok} target tokens, {s.repeats} rounds")
    times = _common.interleave(fns, s.repeats, warmup=True)
    f["train_speedup_vs_hf"] = _common.median_ratio(times["hf"], times["ours"])
    f["train_batches"], f["train_tokens"] = len(batches), n_tok
    rows = []
    for name, ts in times.items():
        f[f"{name}_train_s"] = statistics.median(ts)
        f[f"{name}_train_tok_s"] = n_tok / f[f"{name}_train_s"]
        fl = _common.flop_figures(1e9 * flops, f[f"{name}_train_s"], s.peaks["bf16" if bf16 else "fp32"])
        f |= {f"{name}_train_{k}": v for k, v in fl.items()}
        rows.append([f"{name} training", f"{f[f'{name}_train_s']:.2f}", f"{f[f'{name}_train_tok_s']:.0f}",
                     *_common.fmt_flops(fl["flop_s"], fl["mfu"]),
                     "" if name == "ours" else f"{f['train_speedup_vs_hf']:.2f}x"])
    return rows


def parse_args(argv: list[str] | None = None) -> SimpleNamespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default, what in (("--threads", 1, "threads for every system"), ("--sentences", 500, "sources"),
                                ("--repeats", 3, "interleaved rounds")):
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    p.add_argument("--precision", choices=("32", "bf16"), default="32", help="training precision, both (default 32)")
    p.add_argument("--skip-train", action="store_true", help="decoding only")
    p.add_argument("--skip-decode", action="store_true", help="training only")
    p.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    p.add_argument("--quick", action="store_true", help="a tiny model and batches: checks the script runs")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    for name in ("threads", "sentences", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    s = SimpleNamespace(**SIZE, **vars(args))
    if args.quick:
        vars(s).update(QUICK)
    s.max_positions = max(256, s.max_src + 1, s.tgt_len + 1)
    return s


def main(argv: list[str] | None = None) -> None:
    s = parse_args(argv)
    if s.precision == "bf16" and not s.skip_train:
        _common.require_bf16_kernels("--precision bf16")
    torch.set_num_threads(s.threads)
    warnings.filterwarnings("ignore", ".*generation flags are not valid.*")
    import transformers

    transformers.logging.set_verbosity_error()
    out, log = _common.console(), _common.console(stderr=True)
    s.peaks = {d: _common.peak_gemm_flops(d, s.threads, 256 if s.quick else 1024)
               for d in ("fp32", *(("bf16",) if s.precision == "bf16" else ()))}
    f: dict[str, float] = {"threads": s.threads, "sentences": s.sentences, "repeats": s.repeats, "quick": int(s.quick),
                           "bf16": int(s.precision == "bf16"), "d_model": s.d_model,
                           "load_avg_start": os.getloadavg()[0], **{f"peak_flop_s_{d}": v for d, v in s.peaks.items()}}
    ours = build_ours(s).eval()
    enable_cpu_fastpath(ours)
    hf = build_marian(s).eval()
    copy_weights(ours, hf)
    f["max_logit_diff"] = max_logit_diff(ours, hf, training_batches(SimpleNamespace(**{**vars(s), "max_tokens": 512,
                                                                                       "train_batches": 1}))[0])
    out.print(f"transformers {transformers.__version__}, torch {torch.__version__}, {s.threads} thread(s); max |ours - "
              f"Marian| teacher-forced logit {f['max_logit_diff']:.2e}; peak GEMM "
              + ", ".join(f"{d} {v / 1e9:,.1f} GFLOP/s" for d, v in s.peaks.items()))
    rows = [] if s.skip_decode else run_decode(log, s, ours, hf, f)
    rows += [] if s.skip_train else run_train(log, s, ours, hf, f)
    f["load_avg_end"] = os.getloadavg()[0]
    _common.print_table(out, f"beam {s.beam}, {s.tgt_len} target tokens a sentence; training {s.precision}; load "
                        f"average {f['load_avg_start']:.1f} -> {f['load_avg_end']:.1f}",
                        ["system", "s (median)", "target tok/s", "GFLOP/s", "MFU", "ours / theirs"], rows)
    _common.write_json(s.json, f)


if __name__ == "__main__":
    main()
