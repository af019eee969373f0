"""Translate against Hugging Face MarianMTModel and CTranslate2: beam-search and training speed, one run, CPU.

One randomly initialised model of one size for everyone (default d_model 256, 3+3 layers, 4 heads,
FFN 1024 ReLU, vocabulary 8000, shared embeddings, sinusoidal positions, post-LN). OUR random
weights are copied into a `MarianMTModel` (`MarianConfig` of that size) and CTranslate2 converts
that Marian model with its own converter (`TransformersConverter`), loaded as fp32 and as int8. Our
model is also exported with our own converter (`translate.export`, as `python -m translate.export
--format ctranslate2 [--quantization int8]` does): `ct2_export_{fp32,int8}`, whose outputs should equal
CTranslate2's from the Marian conversion (`agree_ct2_export_{fp32,int8}_ct2_{fp32,int8}`).
Our model gets Marian's sinusoid layout (sines then cosines, not interleaved), so all three
compute the same function: the teacher-forced logits of ours and Marian are compared (max |diff|).
Every decoder starts from a zero embedding (CTranslate2's Marian convention): ours and Marian
feed the padding id 0, whose embedding row is zero, as the start token.

- Decoding: random source sentences (lengths 8-30, fixed seed), sorted by length and cut into
  batches of 32 (the same batches for everyone), beam 5, exactly 20 decoder steps per sentence.
  Marian: `generate(min_new_tokens=max_new_tokens=20)`; CTranslate2: `min_decoding_length =
  max_decoding_length = 20`; both then return 20 non-EOS tokens. Ours: `beam_search` with the
  output limit fixed at 19 subwords (`max_len_a=0, max_len_b=19`; search.py's limit does not count
  EOS), so its 20th step is the forced EOS: the same 20 decoder steps, full vocabulary each. Target
  tokens/s = sentences x 20 / seconds, counting the best hypothesis only (not the beam).
- Ours runs with `model.cpu_fastpath` on (`core.nn.cpu_fastpath`: oneDNN fp32 linears, the cheap dropout mask).
- Training: one step = forward + loss + backward + AdamW on token-count batches (~4096 padded
  tokens, `translate.data.corpus.TokenBatchSampler`), dropout 0.1 in both. Ours: `Translator` with
  `translate.model.module.translation_loss` (eps 0.1, `core.linear_cross_entropy`; also timed: the same
  model with logits + `F.cross_entropy`, with `nn.Dropout` in place of `FastDropout`, and,
  where torch has oneDNN's linear op, in fp32 with `nn.Linear` in place of `FastLinear`, i.e. MKL's GEMM);
  Marian: `labels` -> its own loss.
  `--precision bf16`: both under `torch.autocast("cpu", torch.bfloat16)`, and ours is also timed in
  fp32 (what bf16 gains us). Target tokens/s counts non-padding target tokens (EOS included).
- `--int8`: ours and Marian are also timed with int8 linear layers (`core.runtime.precision.quantize_int8`,
  torch's dynamic quantisation, = `python -m translate.infer --dtype int8`), against CTranslate2 int8.
- Systems are interleaved per round (A B C D, A B C D, ...); times are medians, ratios the median
  of per-round ratios. Every system uses `--threads` threads (torch.set_num_threads; CTranslate2
  intra_threads, inter_threads 1).

The peers live in `.venv-translate` (benchmark-only, never a runtime dependency; torch is the same
2.13.0 CPU wheel as `.venv`). Started from another interpreter the script re-runs itself there.

    make bench-env-translate                                     # once: creates .venv-translate
    python benchmarks/translate_speed.py --threads 2
    python benchmarks/translate_speed.py --threads 1 --json runs/translate_speed.json
    python benchmarks/translate_speed.py --precision bf16        # bf16 autocast for both trainings
    python benchmarks/translate_speed.py --profile               # also profile our decode step
    python benchmarks/translate_speed.py --skip-decode --skip-train --no-ct2 --ablate --threads 2  # parts' shares
    python benchmarks/translate_speed.py --skip-decode --skip-train --profile-train --threads 2  # our training step
    python benchmarks/translate_speed.py --skip-train            # decoding only
    python benchmarks/translate_speed.py --skip-train --int8     # also ours and HF with int8 linear layers

Targets (same run, same model, inputs, beam and length): `decode_speedup_vs_hf` >= 2,
`train_speedup_vs_hf` >= 1.5. The ratios against CTranslate2 are reported, with no target.

JSON keys: {ours,hf,ct2_fp32,ct2_int8}_decode_{s,tok_s}, decode_speedup_vs_hf, ratio_vs_ct2_fp32,
ratio_vs_ct2_int8, ct2_export_{fp32,int8}_decode_{s,tok_s}, ratio_vs_ct2_export_{fp32,int8} (ours / our
export in CTranslate2), agree_ct2_export_{fp32,int8}_ct2_{fp32,int8}, with --int8 also
{ours,hf}_int8_decode_{s,tok_s}, int8_speedup_vs_hf (ours int8 / HF fp32),
int8_speedup_vs_hf_int8, int8_ratio_vs_ct2_int8, agree_ours_int8_ours, {ours,hf}_train_{s,tok_s},
train_speedup_vs_hf, train_speedup_vs_logits_loss, train_speedup_vs_torch_dropout, with bf16 also
ours_fp32_train_{s,tok_s} and bf16_speedup_vs_fp32; on AVX-512 CPUs ours_mkl_{decode,train}_{s,tok_s},
decode_speedup_vs_mkl, train_speedup_vs_mkl (ours with plain nn.Linear, fp32) and
agree_ours_mkl_ours; with --ablate ablate_{matmuls,attention,self_attention}_share; max_logit_diff,
agreement figures, plus the setting (threads, sentences, batch_size, beam, tgt_len, d_model, n_layers, ...,
load_avg_start, load_avg_end).

Legend: B batch, S source length, T target length, V vocabulary, K beam.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _common import ensure_peer_venv

if __name__ == "__main__":
    ensure_peer_venv(__file__, ["transformers", "ctranslate2"], ".venv-translate", "bench-env-translate")

# ruff: noqa: E402  (imports after the venv check on purpose)
import argparse
import contextlib
import copy
import statistics
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from _common import interleave, median_ratio, print_table, print_targets, require_bf16_kernels, write_json
from rich.console import Console
from torch import Tensor

from core.nn.cpu_fastpath import FastDropout, FastLinear, enable_cpu_fastpath, onednn_available
from core.runtime.precision import quantize_int8
from translate.data.corpus import Batch, Example, TokenBatchSampler, collate
from translate.data.vocab import EOS_ID, PAD_ID, UNK_ID
from translate.model.module import translation_loss
from translate.model.transformer import Translator
from translate.search.decoding import beam_search

START_ID = PAD_ID  # decoder start: a zero embedding in all three systems (see the module docstring)
FIRST_WORD = 4  # ids below are pad, unk, bos, eos
TARGETS = {"decode_speedup_vs_hf": 2.0, "train_speedup_vs_hf": 1.5}
SMOOTHING = 0.1


# ----------------------------------------------------------------------------- inputs


def make_sources(n: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[list[int]]:
    """`n` random source sentences of uniform lengths in [min_len, max_len], word ids only."""
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


def training_batches(args: argparse.Namespace) -> list[Batch]:
    """`--train-batches` token-count batches (<= `--max-tokens` padded tokens) spread over all lengths.

    Targets are 0.8-1.25x their source's length, like a real language pair.
    """
    n = 4000
    g = torch.Generator().manual_seed(args.seed + 1)
    src = make_sources(n, args.min_src, args.max_src, args.vocab, args.seed + 1)
    ratios = torch.empty(n).uniform_(0.8, 1.25, generator=g).tolist()
    tgt_lens = [max(1, min(args.max_src, round(len(s) * r))) for s, r in zip(src, ratios, strict=True)]
    tgt = [torch.randint(FIRST_WORD, args.vocab, (t,), generator=g).tolist() for t in tgt_lens]
    examples = [Example(i, s, t) for i, (s, t) in enumerate(zip(src, tgt, strict=True))]
    widths = [max(len(s), len(t) + 1) for s, t in zip(src, tgt, strict=True)]
    batches = list(TokenBatchSampler(widths, args.max_tokens))
    step = max(1, len(batches) // args.train_batches)
    return [collate([examples[i] for i in b]) for b in batches[::step][: args.train_batches]]


# ----------------------------------------------------------------------------- models


def build_ours(args: argparse.Namespace) -> Translator:
    """Our translator at the benchmark size: post-LN like Marian, so the weights copy one to one."""
    torch.manual_seed(args.seed)
    return Translator(
        args.vocab, args.vocab, pad_id=PAD_ID, d_model=args.d_model, n_heads=args.n_heads,
        n_encoder_layers=args.n_layers, n_decoder_layers=args.n_layers, d_ff=args.d_ff, dropout=args.dropout,
        max_len=args.max_positions, positions="sinusoidal", norm_first=False,
        activation="relu", share_embeddings=True,
    )


def build_marian(args: argparse.Namespace):
    """A randomly initialised MarianMTModel of the same size (its weights are then replaced by ours)."""
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=args.vocab, decoder_vocab_size=args.vocab, d_model=args.d_model,
        encoder_layers=args.n_layers, decoder_layers=args.n_layers,
        encoder_attention_heads=args.n_heads, decoder_attention_heads=args.n_heads,
        encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff, activation_function="relu",
        dropout=args.dropout, attention_dropout=0.0, activation_dropout=args.dropout,
        max_position_embeddings=args.max_positions, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=START_ID,
        forced_eos_token_id=None,
    )
    return MarianMTModel(config)


@torch.no_grad()
def copy_weights(ours: Translator, hf) -> None:
    """Put our weights into the Marian model, and Marian's sinusoid layout into ours: then both compute one function.

    Ours fuses q/k/v (self-attention) and k/v (cross-attention) into one projection, rows [q; k; v].
    """
    d = ours.tgt_embed.weight.shape[1]
    hf.model.shared.weight.copy_(ours.tgt_embed.weight)  # encoder, decoder and lm_head share it

    def lin(dst, src_w: Tensor, src_b: Tensor) -> None:
        dst.weight.copy_(src_w)
        dst.bias.copy_(src_b)

    def attn(dst, w: Tensor, b: Tensor, out) -> None:
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")[-(w.shape[0] // d):]):
            lin(getattr(dst, name), w[i * d : (i + 1) * d], b[i * d : (i + 1) * d])
        lin(dst.out_proj, out.weight, out.bias)

    def norm(dst, src) -> None:
        lin(dst, src.weight, src.bias)

    for mine, theirs in zip(ours.encoder.layers, hf.model.encoder.layers, strict=True):
        attn(theirs.self_attn, mine.self_attn.qkv.weight, mine.self_attn.qkv.bias, mine.self_attn.out)
        norm(theirs.self_attn_layer_norm, mine.attn_block.norm)
        lin(theirs.fc1, mine.ff.up.weight, mine.ff.up.bias)
        lin(theirs.fc2, mine.ff.down.weight, mine.ff.down.bias)
        norm(theirs.final_layer_norm, mine.ff_block.norm)
    for mine, theirs in zip(ours.decoder.layers, hf.model.decoder.layers, strict=True):
        attn(theirs.self_attn, mine.self_attn.qkv.weight, mine.self_attn.qkv.bias, mine.self_attn.out)
        norm(theirs.self_attn_layer_norm, mine.self_block.norm)
        lin(theirs.encoder_attn.q_proj, mine.cross_attn.q.weight, mine.cross_attn.q.bias)
        attn(theirs.encoder_attn, mine.cross_attn.kv.weight, mine.cross_attn.kv.bias, mine.cross_attn.out)
        norm(theirs.encoder_attn_layer_norm, mine.cross_block.norm)
        lin(theirs.fc1, mine.ff.up.weight, mine.ff.up.bias)
        lin(theirs.fc2, mine.ff.down.weight, mine.ff.down.bias)
        norm(theirs.final_layer_norm, mine.ff_block.norm)
    hf.final_logits_bias.zero_()
    for stack, theirs in ((ours.encoder, hf.model.encoder), (ours.decoder, hf.model.decoder)):
        table = stack.additive.table  # (max_len, D), a non-persistent buffer of this instance
        table.copy_(theirs.embed_positions.weight[: table.shape[0]])


@torch.no_grad()
def max_logit_diff(ours: Translator, hf, batch: Batch) -> float:
    """Largest |ours - Marian| teacher-forced logit on one batch (eval mode, fp32)."""
    tgt_in = batch.tgt_in.clone()
    tgt_in[:, 0] = START_ID
    mine = ours(batch.src, tgt_in)
    theirs = hf(input_ids=batch.src, attention_mask=batch.src != PAD_ID, decoder_input_ids=tgt_in).logits
    real = batch.tgt_out != PAD_ID  # logits after the target's end differ by design (no target mask in ours)
    return float((mine - theirs).abs()[real].max())


class _VocabOnly:
    """What CTranslate2's Marian loader reads from a tokenizer: the vocabulary and two special tokens."""

    def __init__(self, tokens: Sequence[str]):
        self.tokens = list(tokens)
        self.eos_token, self.unk_token = self.tokens[EOS_ID], self.tokens[UNK_ID]

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}


def vocab_tokens(vocab: int) -> list[str]:
    """Token strings for CTranslate2 (it reads and writes tokens, not ids): id i is `w{i}`."""
    return ["<pad>", "<unk>", "<s>", "</s>", *(f"w{i}" for i in range(FIRST_WORD, vocab))]


def convert_ct2(hf, vocab: int, workdir: Path) -> Path:
    """Save the Marian model and convert it with CTranslate2's TransformersConverter (fp32 on disk)."""
    import ctranslate2
    from ctranslate2.converters import transformers as ct2_transformers

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _VocabOnly(vocab_tokens(vocab))  # a random model has no tokenizer files

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


def export_ct2(ours: Translator, args: argparse.Namespace, workdir: Path, quantization: str | None) -> Path:
    """Our model through OUR converter (`python -m translate.export --format ctranslate2`'s), not Marian's."""
    from translate.export import convert_spec, transformer_spec

    tokens = vocab_tokens(args.vocab)
    hparams = {"positions": "sinusoidal", "activation": "relu", "n_heads": args.n_heads, "norm_first": False}
    spec = transformer_spec(ours, hparams, tokens, tokens)
    spec.config.decoder_start_token = tokens[START_ID]  # this benchmark's start token (module docstring)
    return convert_spec(spec, workdir / f"export_{quantization or 'fp32'}", quantization)


# ----------------------------------------------------------------------------- decoding


def decode_ours(model: Translator, batches: Sequence[Tensor], beam: int, steps: int) -> list[list[int]]:
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
            forced_eos_token_id=None, num_return_sequences=1,
        )
        out += ids[:, 1:].tolist()  # drop the start token
    return out


def decode_ct2(translator, token_batches: Sequence[list[list[str]]], beam: int, steps: int,
               index: dict[str, int]) -> list[list[int]]:
    """CTranslate2's beam search with exactly `steps` target tokens."""
    out = []
    for tokens in token_batches:
        results = translator.translate_batch(
            tokens, beam_size=beam, min_decoding_length=steps, max_decoding_length=steps, num_hypotheses=1,
            max_batch_size=0,
        )
        out += [[index[t] for t in r.hypotheses[0]] for r in results]
    return out


def agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], n: int) -> float:
    """Fraction of sentences whose first `n` output tokens agree."""
    return sum(list(x[:n]) == list(y[:n]) for x, y in zip(a, b, strict=True)) / len(a)


# ----------------------------------------------------------------------------- training


def train_step_ours(model: Translator, opt: torch.optim.Optimizer, batch: Batch, bf16: bool,
                    logits_loss: bool = False) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if logits_loss:  # the plain way, kept as a baseline: (tokens, V) logits then F.cross_entropy
            loss = F.cross_entropy(model(batch.src, batch.tgt_in).flatten(0, 1).float(), batch.tgt_out.flatten(),
                                   ignore_index=PAD_ID, label_smoothing=SMOOTHING)
        else:
            loss = translation_loss(model, batch, PAD_ID, SMOOTHING)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def train_step_hf(model, opt: torch.optim.Optimizer, batch: Batch, bf16: bool) -> None:
    labels = batch.tgt_out.masked_fill(batch.tgt_out == PAD_ID, -100)  # Marian's ignore index
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=batch.src, attention_mask=batch.src != PAD_ID, decoder_input_ids=batch.tgt_in,
                     labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def with_torch_dropout(model: Translator) -> Translator:
    """A copy of `model` whose `FastDropout` layers are plain `nn.Dropout` (the baseline mask)."""
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, FastDropout):
                setattr(parent, name, torch.nn.Dropout(child.p, child.inplace).train(child.training))
    return model


def with_mkl(model: Translator) -> Translator:
    """A copy of `model` whose `FastLinear` layers are plain `nn.Linear`: every fp32 matmul in MKL's GEMM."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if type(m) is FastLinear:
            m.__class__ = torch.nn.Linear
    return model


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), weight_decay=1e-4)


# ----------------------------------------------------------------------------- profile


@contextlib.contextmanager
def _labelled(obj: object, name: str, label: str) -> Iterator[None]:
    """Temporarily wrap `obj.name` in a profiler range called `label`."""
    original = getattr(obj, name)

    def wrapped(*a, **kw):
        with torch.profiler.record_function(label):
            return original(*a, **kw)

    setattr(obj, name, wrapped)
    try:
        yield
    finally:
        if isinstance(obj, type):
            setattr(obj, name, original)
        else:
            delattr(obj, name)  # the instance attribute; the class's method shows again


CATEGORIES = {  # op -> where its time goes
    "matmul (linear/addmm/mm/bmm)": ("aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear",
                                     "mkldnn::_linear_pointwise"),  # FastLinear's oneDNN GEMM
    "attention kernel (SDPA)": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                "aten::scaled_dot_product_attention"),
    "log_softmax": ("aten::_log_softmax", "aten::log_softmax"),
    "topk": ("aten::topk",),
    "layer_norm": ("aten::native_layer_norm", "aten::layer_norm"),
}


def _print_top_ops(console: Console, prof, label: str, n: int, what: str, whole: str) -> tuple[list, dict, float]:
    """Print the `n` aten ops with the most self CPU time as a share of the `label` range; return
    (events, events by name, the range's total time) for further breakdowns."""
    events = prof.key_averages()
    by_key = {e.key: e for e in events}
    total = by_key[label].cpu_time_total
    top = sorted((e for e in events if e.key.startswith(("aten::", "mkldnn::"))),
                 key=lambda e: -e.self_cpu_time_total)[:n]
    print_table(console, f"{what}: top aten ops by self CPU time", ["op", "calls", "self ms", f"% of {whole}"],
                [[e.key, str(e.count), f"{e.self_cpu_time_total / 1e3:.1f}",
                  f"{100 * e.self_cpu_time_total / total:.1f}"] for e in top])
    return events, by_key, total


def profile_ours(console: Console, model: Translator, batches: Sequence[Tensor], beam: int, steps: int) -> None:
    """torch.profiler over our beam search on `batches`: top ops by self time and a breakdown by cause."""
    from torch.profiler import ProfilerActivity, profile

    from core.nn.kv_cache import KVCache, StaticKV

    decode_ours(model, batches[:1], beam, steps)  # warm-up
    with (_labelled(model, "decode", "model.decode"), _labelled(KVCache, "reorder", "cache.reorder"),
          _labelled(StaticKV, "reorder", "cache.reorder"), profile(activities=[ProfilerActivity.CPU]) as prof):
        with torch.profiler.record_function("beam_search"):
            decode_ours(model, batches, beam, steps)
    events, by_key, total = _print_top_ops(console, prof, "beam_search", 15,
                                           f"our beam-{beam} decode, {len(batches)} batches", "search")
    rows = []
    covered = 0.0
    for name, ops in CATEGORIES.items():
        t = sum(by_key[o].self_cpu_time_total for o in ops if o in by_key)
        covered += t
        rows.append([name, f"{t / 1e3:.1f}", f"{100 * t / total:.1f}"])
    reorder = by_key["cache.reorder"].cpu_time_total  # both kinds of cache, every layer
    reorder_ops = reorder - by_key["cache.reorder"].self_cpu_time_total
    rows.append(["cache reorder (index_select, all layers; incl.)", f"{reorder / 1e3:.1f}",
                 f"{100 * reorder / total:.1f}"])
    all_aten = sum(e.self_cpu_time_total for e in events if e.key.startswith(("aten::", "mkldnn::")))
    rows.append(["other aten ops (copy, index, cat, add, ...)", f"{(all_aten - covered - reorder_ops) / 1e3:.1f}",
                 f"{100 * (all_aten - covered - reorder_ops) / total:.1f}"])
    for label, what in (("model.decode", "python: model/core forward code (outside ops)"),
                        ("beam_search", "python: search.py and this loop (outside ops)"),
                        ("cache.reorder", "python: reorder loop (outside ops)")):
        t = by_key[label].self_cpu_time_total
        rows.append([what, f"{t / 1e3:.1f}", f"{100 * t / total:.1f}"])
    rows.append(["model.decode incl. its ops", f"{by_key['model.decode'].cpu_time_total / 1e3:.1f}",
                 f"{100 * by_key['model.decode'].cpu_time_total / total:.1f}"])
    rows.append(["whole search", f"{total / 1e3:.1f}", "100.0"])
    print_table(console, "where the decode time goes (profiler self times; the profiler inflates Python overhead)",
                ["part", "ms", "%"], rows)


def ablate_ours(console: Console, model: Translator, batches: Sequence[Tensor], beam: int, steps: int,
                repeats: int, f: dict[str, float]) -> None:
    """Wall-clock share of each part of our decode: the search timed with that part replaced by zeros of its
    output's shape (or, for the cache reorder, skipped). Outputs change; the steps and the rest of the work do
    not, as every sentence decodes exactly `steps` steps. Unlike profiler self times, nothing is inflated."""
    from unittest import mock

    import core.nn.cpu_fastpath
    from core.nn.kv_cache import KVCache

    reorder = KVCache.reorder

    def keep_rows(cache: KVCache, index: Tensor, moved: Tensor | None = None) -> None:
        if cache._k is None or index.shape[0] != cache._k.shape[0]:  # beams stay put; batch changes still apply
            reorder(cache, index, moved)

    parts = {
        "matmuls (every linear layer)": mock.patch.object(
            core.nn.cpu_fastpath, "linear", lambda x, w, b=None: x.new_zeros(*x.shape[:-1], w.shape[0])),
        "attention kernel (SDPA)": mock.patch.object(
            F, "scaled_dot_product_attention", lambda q, k, v, **kw: torch.zeros_like(q)),
        "self-attention cache reorder": mock.patch.object(KVCache, "reorder", keep_rows),
    }
    fns: dict[str, Callable[[], object]] = {"whole search": lambda: decode_ours(model, batches, beam, steps)}
    for name, patch in parts.items():
        def without(patch=patch) -> None:
            with patch:
                decode_ours(model, batches, beam, steps)
        fns[name] = without
    for fn in fns.values():  # warm-up
        fn()
    times = interleave(fns, repeats)
    whole = statistics.median(times["whole search"])
    rows = [["whole search", f"{whole:.2f}", "100.0"]]
    for name in parts:
        share = 1.0 - 1.0 / median_ratio(times["whole search"], times[name])
        f[f"ablate_{name.split()[0].replace('-', '_')}_share"] = share
        rows.append([f"without {name}", f"{statistics.median(times[name]):.2f}", f"{100 * share:.1f}"])
    print_table(console, f"where our decode time goes: each part removed in turn ({len(batches)} batches, "
                f"{torch.get_num_threads()} thread(s), {repeats} rounds)", ["search", "s (median)", "% of the search"],
                rows)


def profile_train(console: Console, model: Translator, batches: Sequence[Batch]) -> None:
    """torch.profiler over our training steps: top ops by self time, then inclusive parts of a step."""
    from torch.profiler import ProfilerActivity, profile

    model = copy.deepcopy(model).train()
    opt = adamw(model)
    train_step_ours(model, opt, batches[0], False)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("train_steps"):
            for batch in batches:
                train_step_ours(model, opt, batch, False)
    _, by_key, total = _print_top_ops(console, prof, "train_steps", 12, f"our fp32 training, {len(batches)} steps",
                                      "steps")

    def incl(*keys: str) -> float:
        return sum(by_key[k].cpu_time_total for k in keys if k in by_key)

    def self_time(*keys: str) -> float:
        return sum(by_key[k].self_cpu_time_total for k in keys if k in by_key)

    parts = {
        "output layer + loss, forward and gradients (core.linear_cross_entropy)": incl("_ChunkedCrossEntropy"),
        "dropout masks and products, forward + backward (FastDropout)": incl("_KeepScale", "_KeepScaleBackward"),
        "attention kernels, forward + backward (SDPA)": self_time(
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
        "layer norms, forward + backward": self_time("aten::native_layer_norm", "aten::native_layer_norm_backward"),
        "AdamW step": incl("Optimizer.step#AdamW.step"),
        "every matmul (self time, the loss's included)": self_time(*CATEGORIES["matmul (linear/addmm/mm/bmm)"]),
    }
    print_table(console, "where a training step goes (inclusive times; rows overlap: the last counts the loss's "
                "matmuls too)", ["part", "ms", "%"],
                [[name, f"{t / 1e3:.1f}", f"{100 * t / total:.1f}"] for name, t in parts.items()]
                + [["whole steps", f"{total / 1e3:.1f}", "100.0"]])


# ----------------------------------------------------------------------------- report


def report(console: Console, f: dict[str, float], decode: bool, train: bool, ct2: bool) -> None:
    if decode:
        rows = [["ours (beam_search)", f"{f['ours_decode_s']:.2f}", f"{f['ours_decode_tok_s']:.0f}",
                 "1.00x"],
                ["HF MarianMTModel.generate", f"{f['hf_decode_s']:.2f}", f"{f['hf_decode_tok_s']:.0f}",
                 f"{f['decode_speedup_vs_hf']:.2f}x"]]
        if "decode_speedup_vs_mkl" in f:
            rows.insert(1, ["ours with MKL's GEMM (F.linear)", f"{f['ours_mkl_decode_s']:.2f}",
                            f"{f['ours_mkl_decode_tok_s']:.0f}", f"{f['decode_speedup_vs_mkl']:.2f}x"])
        if ct2:
            for kind in ("fp32", "int8"):
                rows.append([f"CTranslate2 {kind}", f"{f[f'ct2_{kind}_decode_s']:.2f}",
                             f"{f[f'ct2_{kind}_decode_tok_s']:.0f}", f"{f[f'ratio_vs_ct2_{kind}']:.2f}x"])
            for kind in ("fp32", "int8"):
                rows.append([f"CTranslate2 {kind}, ours exported (translate.export)",
                             f"{f[f'ct2_export_{kind}_decode_s']:.2f}", f"{f[f'ct2_export_{kind}_decode_tok_s']:.0f}",
                             f"{f[f'ratio_vs_ct2_export_{kind}']:.2f}x"])
        if "ours_int8_decode_s" in f:
            rows.append(["ours int8 (translate.infer --dtype int8)", f"{f['ours_int8_decode_s']:.2f}",
                         f"{f['ours_int8_decode_tok_s']:.0f}", "ours int8 / theirs:"])
            rows.append(["  vs HF MarianMTModel.generate (fp32)", "", "", f"{f['int8_speedup_vs_hf']:.2f}x"])
            rows.append(["  vs HF with the same int8 layers", f"{f['hf_int8_decode_s']:.2f}",
                         f"{f['hf_int8_decode_tok_s']:.0f}", f"{f['int8_speedup_vs_hf_int8']:.2f}x"])
            if ct2:
                rows.append(["  vs CTranslate2 int8", "", "", f"{f['int8_ratio_vs_ct2_int8']:.2f}x"])
        print_table(console, f"beam-{f['beam']:.0f} decoding, {f['sentences']:.0f} sentences x {f['tgt_len']:.0f} "
                    f"target tokens, batch {f['batch_size']:.0f}, {f['threads']:.0f} thread(s)",
                    ["system", "s (median)", "target tok/s", "ours / theirs"], rows)
    if train:
        prec = "bf16 autocast" if f["bf16"] else "fp32"
        rows = [["ours (Translator + linear_cross_entropy)", f"{f['ours_train_s']:.2f}",
                 f"{f['ours_train_tok_s']:.0f}", "1.00x"],
                ["ours, logits + F.cross_entropy", f"{f['ours_logits_train_s']:.2f}",
                 f"{f['ours_logits_train_tok_s']:.0f}", f"{f['train_speedup_vs_logits_loss']:.2f}x"],
                ["ours, F.dropout masks (nn.Dropout)", f"{f['ours_torch_dropout_train_s']:.2f}",
                 f"{f['ours_torch_dropout_train_tok_s']:.0f}", f"{f['train_speedup_vs_torch_dropout']:.2f}x"],
                ["HF MarianMTModel(labels=...)", f"{f['hf_train_s']:.2f}", f"{f['hf_train_tok_s']:.0f}",
                 f"{f['train_speedup_vs_hf']:.2f}x"]]
        if "train_speedup_vs_mkl" in f:
            rows.insert(1, ["ours with MKL's GEMM (F.linear)", f"{f['ours_mkl_train_s']:.2f}",
                            f"{f['ours_mkl_train_tok_s']:.0f}", f"{f['train_speedup_vs_mkl']:.2f}x"])
        if "bf16_speedup_vs_fp32" in f:
            rows.insert(1, ["ours in fp32 (no autocast)", f"{f['ours_fp32_train_s']:.2f}",
                            f"{f['ours_fp32_train_tok_s']:.0f}", f"{f['bf16_speedup_vs_fp32']:.2f}x"])
        print_table(console, f"training steps (forward + backward + AdamW), {f['train_batches']:.0f} batches, "
                    f"{f['train_tokens']:.0f} target tokens, {prec}, {f['threads']:.0f} thread(s)",
                    ["system", "s per pass (median)", "target tok/s", "ours / theirs"], rows)
    print_targets(console, TARGETS, f)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="threads for every system (default 1)")
    p.add_argument("--sentences", type=int, default=500, help="source sentences to translate (default 500)")
    p.add_argument("--min-src", type=int, default=8, help="shortest source sentence, tokens (default 8)")
    p.add_argument("--max-src", type=int, default=30, help="longest source sentence, tokens (default 30)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per decoding batch (default 32)")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    p.add_argument("--tgt-len", type=int, default=20, help="decoder steps = target tokens per sentence (default 20)")
    p.add_argument("--d-model", type=int, default=256, help="model width (default 256)")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--n-layers", type=int, default=3, help="encoder and decoder layers, each (default 3)")
    p.add_argument("--d-ff", type=int, default=1024, help="feed-forward width (default 1024)")
    p.add_argument("--vocab", type=int, default=8000, help="joint vocabulary size (default 8000)")
    p.add_argument("--dropout", type=float, default=0.1, help="training dropout, both models (default 0.1)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds for decoding and training (default 3)")
    p.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per training batch (default 4096)")
    p.add_argument("--train-batches", type=int, default=4, help="training steps per round and system (default 4)")
    p.add_argument("--precision", choices=("32", "bf16"), default="32", help="training precision, both (default 32)")
    p.add_argument("--decode-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="weights and activations of ours and HF when decoding (CTranslate2 stays fp32/int8); "
                        "bfloat16 = `python -m translate.infer --dtype bfloat16`")
    p.add_argument("--int8", action="store_true",
                   help="also decode with ours and HF in int8 linear layers (core.runtime.precision.quantize_int8)")
    p.add_argument("--skip-train", action="store_true", help="decoding only")
    p.add_argument("--skip-decode", action="store_true", help="training only")
    p.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    p.add_argument("--ablate", action="store_true",
                   help="time our decode with each part (matmuls, SDPA, cache reorder) removed in turn: its wall-clock "
                        "share, at --threads")
    p.add_argument("--profile", action="store_true",
                   help="profile our decode (1 thread, --decode-dtype) and print where time goes")
    p.add_argument("--profile-batches", type=int, default=2, help="batches in the profile (default 2)")
    p.add_argument("--profile-train", action="store_true",
                   help="profile our fp32 training steps (--threads, the --train-batches batches) and print where "
                        "time goes")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    p.add_argument("--json", metavar="PATH", help="write every figure as one flat JSON object name -> number")
    args = p.parse_args(argv)
    for name in ("threads", "sentences", "batch_size", "beam", "tgt_len", "repeats", "train_batches", "min_src"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_src < args.min_src:
        p.error(f"--max-src ({args.max_src}) must be >= --min-src ({args.min_src})")
    if args.int8 and args.decode_dtype != "float32":
        p.error("--int8 quantises the float32 models; leave --decode-dtype at float32")
    if args.vocab <= FIRST_WORD:
        p.error(f"--vocab must be > {FIRST_WORD}, got {args.vocab}")
    args.max_positions = max(256, args.max_src + 1, args.tgt_len + 1)
    return args


def run_decode(console: Console, log: Console, args: argparse.Namespace, ours: Translator, hf,
               f: dict[str, float]) -> None:
    sources = make_sources(args.sentences, args.min_src, args.max_src, args.vocab, args.seed)
    batches = source_batches(sources, args.batch_size)
    steps, beam = args.tgt_len, args.beam
    out: dict[str, list[list[int]]] = {}
    fns: dict[str, Callable[[], None]] = {
        "ours": lambda: out.__setitem__("ours", decode_ours(ours, batches, beam, steps)),
        "hf": lambda: out.__setitem__("hf", decode_hf(hf, batches, beam, steps)),
    }
    models = {"ours": ours, "hf": hf}
    if onednn_available():  # what FastLinear's oneDNN GEMM gains over MKL's
        models["ours_mkl"] = with_mkl(ours)
        fns["ours_mkl"] = lambda: out.__setitem__("ours_mkl", decode_ours(models["ours_mkl"], batches, beam, steps))
    if args.int8:
        models |= {"ours_int8": quantize_int8(ours), "hf_int8": quantize_int8(hf)}
        fns["ours_int8"] = lambda: out.__setitem__("ours_int8", decode_ours(models["ours_int8"], batches, beam, steps))
        fns["hf_int8"] = lambda: out.__setitem__("hf_int8", decode_hf(models["hf_int8"], batches, beam, steps))
    tmp = None
    if not args.no_ct2:
        import ctranslate2

        tmp = tempfile.TemporaryDirectory(prefix="translate_speed_")
        log.log(f"converting the Marian model with CTranslate2 {ctranslate2.__version__}")
        ct2_dir = convert_ct2(hf, args.vocab, Path(tmp.name))
        tokens = vocab_tokens(args.vocab)
        index = {t: i for i, t in enumerate(tokens)}
        token_batches = [[[tokens[i] for i in row if i != PAD_ID] for row in src.tolist()] for src in batches]
        for kind, compute_type in (("fp32", "float32"), ("int8", "int8")):
            tr = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute_type,
                                        intra_threads=args.threads, inter_threads=1)
            fns[f"ct2_{kind}"] = (lambda tr=tr, kind=kind: out.__setitem__(
                f"ct2_{kind}", decode_ct2(tr, token_batches, beam, steps, index)))
        log.log("exporting our model with translate.export's converter (fp32 and int8 weights)")
        for kind, quantization in (("fp32", None), ("int8", "int8")):
            tr = ctranslate2.Translator(str(export_ct2(ours, args, Path(tmp.name), quantization)), device="cpu",
                                        intra_threads=args.threads, inter_threads=1)
            fns[f"ct2_export_{kind}"] = (lambda tr=tr, kind=kind: out.__setitem__(
                f"ct2_export_{kind}", decode_ct2(tr, token_batches, beam, steps, index)))
    log.log("warm-up: one batch each")
    for name, fn in fns.items():
        if name.startswith("ours"):
            decode_ours(models[name], batches[:1], beam, steps)
        elif name.startswith("hf"):
            decode_hf(models[name], batches[:1], beam, steps)
        else:
            fn()  # CTranslate2 loads lazily; one full pass is cheap
    log.log(f"decoding {len(sources)} sentences, {args.repeats} interleaved rounds of {', '.join(fns)}")
    times = interleave(fns, args.repeats)
    n_tok = len(sources) * steps
    for name, ts in times.items():
        f[f"{name}_decode_s"] = statistics.median(ts)
        f[f"{name}_decode_tok_s"] = n_tok / f[f"{name}_decode_s"]
    f["decode_speedup_vs_hf"] = median_ratio(times["hf"], times["ours"])
    if "ours_mkl" in times:
        f["decode_speedup_vs_mkl"] = median_ratio(times["ours_mkl"], times["ours"])
        f["agree_ours_mkl_ours"] = agreement(out["ours_mkl"], out["ours"], steps - 1)
    lengths = {name: [len(o) for o in outs] for name, outs in out.items()}
    f["ours_short_outputs"] = sum(n != steps - 1 for n in lengths["ours"])  # stopped by an early EOS
    f["hf_short_outputs"] = sum(n != steps for n in lengths["hf"])
    f["agree_ours_hf"] = agreement(out["ours"], out["hf"], steps - 1)
    if args.int8:
        f["int8_speedup_vs_hf"] = median_ratio(times["hf"], times["ours_int8"])
        f["int8_speedup_vs_hf_int8"] = median_ratio(times["hf_int8"], times["ours_int8"])
        f["agree_ours_int8_ours"] = agreement(out["ours_int8"], out["ours"], steps - 1)
        if not args.no_ct2:
            f["int8_ratio_vs_ct2_int8"] = median_ratio(times["ct2_int8"], times["ours_int8"])
    if not args.no_ct2:
        for kind in ("fp32", "int8"):
            f[f"ratio_vs_ct2_{kind}"] = median_ratio(times[f"ct2_{kind}"], times["ours"])
            f[f"ct2_{kind}_short_outputs"] = sum(n != steps for n in lengths[f"ct2_{kind}"])
            f[f"agree_ct2_{kind}_hf"] = agreement(out[f"ct2_{kind}"], out["hf"], steps)
            f[f"ratio_vs_ct2_export_{kind}"] = median_ratio(times[f"ct2_export_{kind}"], times["ours"])
            f[f"agree_ct2_export_{kind}_ct2_{kind}"] = agreement(out[f"ct2_export_{kind}"], out[f"ct2_{kind}"], steps)
        tmp.cleanup()
    console.print(f"outputs: ours/HF agree on the first {steps - 1} tokens of the best hypothesis for "
                  f"{f['agree_ours_hf']:.0%} of sentences"
                  + ("" if args.no_ct2 else f"; CTranslate2 fp32/HF on all {steps}: {f['agree_ct2_fp32_hf']:.0%}, "
                     f"int8/HF {f['agree_ct2_int8_hf']:.0%}")
                  + (f"; ours int8/ours {f['agree_ours_int8_ours']:.0%}" if args.int8 else "")
                  + f"; outputs of the wrong length: ours {f['ours_short_outputs']:.0f}, HF {f['hf_short_outputs']:.0f}"
                  + ("" if args.no_ct2 else f", CTranslate2 {f['ct2_fp32_short_outputs']:.0f}/"
                     f"{f['ct2_int8_short_outputs']:.0f}"))


def run_train(log: Console, args: argparse.Namespace, ours: Translator, hf, f: dict[str, float]) -> None:
    batches = training_batches(args)
    ours, hf = copy.deepcopy(ours).train(), copy.deepcopy(hf).train()
    bf16 = args.precision == "bf16"
    opts = {"ours": adamw(ours), "hf": adamw(hf)}
    plain = copy.deepcopy(ours)
    opts["ours_logits"] = adamw(plain)
    torch_drop = with_torch_dropout(ours)
    opts["ours_torch_dropout"] = adamw(torch_drop)
    fns = {
        "ours": lambda: [train_step_ours(ours, opts["ours"], b, bf16) for b in batches],
        "ours_logits": lambda: [train_step_ours(plain, opts["ours_logits"], b, bf16, logits_loss=True)
                                for b in batches],
        "ours_torch_dropout": lambda: [train_step_ours(torch_drop, opts["ours_torch_dropout"], b, bf16)
                                       for b in batches],
        "hf": lambda: [train_step_hf(hf, opts["hf"], b, bf16) for b in batches],
    }
    if onednn_available() and not bf16:
        mkl = with_mkl(ours)
        opts["ours_mkl"] = adamw(mkl)
        fns["ours_mkl"] = lambda: [train_step_ours(mkl, opts["ours_mkl"], b, False) for b in batches]
        train_step_ours(mkl, opts["ours_mkl"], batches[0], False)
    if bf16:
        fp32 = copy.deepcopy(ours)
        opts["ours_fp32"] = adamw(fp32)
        fns["ours_fp32"] = lambda: [train_step_ours(fp32, opts["ours_fp32"], b, False) for b in batches]
        train_step_ours(fp32, opts["ours_fp32"], batches[0], False)
    log.log("warm-up: one training step each")
    train_step_ours(ours, opts["ours"], batches[0], bf16)
    train_step_ours(plain, opts["ours_logits"], batches[0], bf16, logits_loss=True)
    train_step_ours(torch_drop, opts["ours_torch_dropout"], batches[0], bf16)
    train_step_hf(hf, opts["hf"], batches[0], bf16)
    n_tok = sum(int((b.tgt_out != PAD_ID).sum()) for b in batches)
    log.log(f"training: {len(batches)} batches ({n_tok} target tokens, shapes "
            f"{', '.join(f'{b.src.shape[0]}x{b.tgt_in.shape[1]}' for b in batches)}), {args.repeats} rounds")
    times = interleave(fns, args.repeats)
    for name, ts in times.items():
        f[f"{name}_train_s"] = statistics.median(ts)
        f[f"{name}_train_tok_s"] = n_tok / f[f"{name}_train_s"]
    f["train_speedup_vs_hf"] = median_ratio(times["hf"], times["ours"])
    f["train_speedup_vs_logits_loss"] = median_ratio(times["ours_logits"], times["ours"])
    f["train_speedup_vs_torch_dropout"] = median_ratio(times["ours_torch_dropout"], times["ours"])
    if bf16:
        f["bf16_speedup_vs_fp32"] = median_ratio(times["ours_fp32"], times["ours"])
    if "ours_mkl" in times:
        f["train_speedup_vs_mkl"] = median_ratio(times["ours_mkl"], times["ours"])
    f["train_batches"], f["train_tokens"] = len(batches), n_tok


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.precision == "bf16" and not args.skip_train:
        require_bf16_kernels("--precision bf16")
    if args.decode_dtype == "bfloat16" and not args.skip_decode:
        require_bf16_kernels("--decode-dtype bfloat16")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*generation flags are not valid.*")
    import transformers

    transformers.logging.set_verbosity_error()
    console = Console(width=None if sys.stdout.isatty() else 132)
    log = Console(stderr=True, log_path=False, width=None if sys.stderr.isatty() else 132)
    load_start = os.getloadavg()[0]
    ct2_version = "" if args.no_ct2 else f", CTranslate2 {__import__('ctranslate2').__version__}"
    console.print(f"[bold]Translate vs HF MarianMTModel (transformers {transformers.__version__}){ct2_version}[/]")
    console.print(f"model: d_model {args.d_model}, {args.n_layers}+{args.n_layers} layers, {args.n_heads} heads, "
                  f"FFN {args.d_ff} ReLU, vocab {args.vocab} shared, sinusoidal, post-LN; our random weights "
                  "copied into Marian (and converted for CTranslate2)")
    console.print(f"torch {torch.__version__} | threads {torch.get_num_threads()} | "
                  f"load average {load_start:.2f} on {os.cpu_count()} cores")
    if load_start > (os.cpu_count() or 1) - args.threads + 0.5:
        console.print(f"[yellow]load average {load_start:.1f} on {os.cpu_count()} cores: other jobs share the CPU, "
                      "absolute numbers are inflated; compare the ratios[/]")

    ours = build_ours(args).eval()
    enable_cpu_fastpath(ours)  # as a run with `model.cpu_fastpath: true` trains and decodes
    hf = build_marian(args).eval()
    copy_weights(ours, hf)
    check = training_batches(SimpleNamespace(**{**vars(args), "train_batches": 1, "max_tokens": 512}))[0]
    f: dict[str, float] = {
        "threads": args.threads, "sentences": args.sentences, "batch_size": args.batch_size, "beam": args.beam,
        "tgt_len": args.tgt_len, "d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
        "d_ff": args.d_ff, "vocab": args.vocab, "bf16": int(args.precision == "bf16"), "repeats": args.repeats,
        "weights_copied": 1, "max_logit_diff": max_logit_diff(ours, hf, check),
    }
    console.print(f"same function: max |ours - Marian| teacher-forced logit {f['max_logit_diff']:.2e}")
    f["decode_bf16"] = int(args.decode_dtype == "bfloat16")
    if not args.skip_decode:
        if f["decode_bf16"]:  # both PyTorch systems in bf16; the fp32 originals stay for training
            run_decode(console, log, args, copy.deepcopy(ours).bfloat16(), copy.deepcopy(hf).bfloat16(), f)
        else:
            run_decode(console, log, args, ours, hf, f)
    if args.profile or args.ablate:
        batches = source_batches(make_sources(args.sentences, args.min_src, args.max_src, args.vocab, args.seed),
                                 args.batch_size)
        model = copy.deepcopy(ours).bfloat16() if f["decode_bf16"] else ours
    if args.profile:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        step = max(1, len(batches) // args.profile_batches)
        profile_ours(console, model, batches[::step][: args.profile_batches], args.beam, args.tgt_len)
        torch.set_num_threads(threads)
    if args.ablate:
        ablate_ours(console, model, batches, args.beam, args.tgt_len, args.repeats, f)
    if args.profile_train:
        profile_train(console, ours, training_batches(args))
    if not args.skip_train:
        run_train(log, args, ours, hf, f)
    f["load_avg_start"], f["load_avg_end"] = load_start, os.getloadavg()[0]
    report(console, f, not args.skip_decode, not args.skip_train, not args.no_ct2)
    console.print(f"load average: {f['load_avg_start']:.2f} at the start, {f['load_avg_end']:.2f} at the end")
    if args.json:
        write_json(args.json, f)
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
