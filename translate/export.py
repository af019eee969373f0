"""Export a trained translator: safetensors weights, or a CTranslate2 model (docs/export.md).

    python -m translate.export --ckpt CKPT --format safetensors --output DIR
    python -m translate.export --ckpt CKPT --format ctranslate2 --output DIR [--quantization int8]

`safetensors` writes DIR/model.safetensors, DIR/config.json and the sentencepiece models;
`translate.Translator.load(DIR)` reads it back without pickle. `ctranslate2` writes a CTranslate2 model, the
sentencepiece models, `translate_options.json` (the `translate_batch` arguments that give our search's output) and a
README.md that decodes with plain `ctranslate2` and `sentencepiece` calls; it needs the `export` extra (`pip install -e
".[export]"`). RoPE, ALiBi, grouped-query attention and `model.arch: rnn` have no CTranslate2 form: refused by name."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from core.runtime.checkpoint import load_module
from core.runtime.errors import InputError, exit_on_error
from core.runtime.export import constructor_arguments, run_export, save_folder
from core.runtime.lock import interrupt_on_sigterm
from translate.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SubwordVocab, vocabs_from_checkpoint
from translate.model.hparams import upgrade_hparams
from translate.model.networks import TranslatorNetwork, network_from_hparams
from translate.model.options import TransformerOptions
from translate.model.transformer import TransformerTranslator
from translate.search.options import SearchOptions

WRITTEN_BY = "python -m translate fit"
FORMATS = ("safetensors", "ctranslate2")
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16", "float32")
SRC_MODEL, TGT_MODEL = "src.model", "tgt.model"
CT2_OPTIONS, CT2_README = "translate_options.json", "README.md"
LAYER_NORM_EPS = 1e-5  # torch's nn.LayerNorm default; CTranslate2's own default differs


def load(ckpt: str | Path) -> tuple[TranslatorNetwork, dict[str, Any], tuple[SubwordVocab, SubwordVocab]]:
    """The network, its hyper-parameters (in today's layout, `upgrade_hparams`) and (source, target) vocabularies
    of a `python -m translate fit` checkpoint."""
    model, state = load_module(network_from_hparams, ckpt, WRITTEN_BY, "Translate", prefix="model.")
    return model, upgrade_hparams(state["hyper_parameters"]), vocabs_from_checkpoint(state, ckpt)


def write_vocabs(out: Path, vocabs: tuple[SubwordVocab, SubwordVocab]) -> dict[str, str]:
    """Write src.model (and tgt.model when it differs) into `out`; returns config.json's names for them."""
    src, tgt = vocabs
    src.save(out / SRC_MODEL)
    if tgt != src:
        tgt.save(out / TGT_MODEL)
    return {"src_vocab": SRC_MODEL, "tgt_vocab": SRC_MODEL if tgt == src else TGT_MODEL}


def export_safetensors(ckpt: str | Path, out: str | Path) -> Path:
    """Write DIR/model.safetensors, DIR/config.json and the sentencepiece models; returns the folder."""
    model, hparams, vocabs = load(ckpt)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = write_vocabs(out, vocabs)
    return save_folder(out, model, "translate", constructor_arguments(network_from_hparams, hparams), names)


# ---------------------------------------------------------------------------------------------- CTranslate2
def transformer_spec(model: TransformerTranslator, hparams: dict[str, Any], src_pieces: Sequence[str],
                     tgt_pieces: Sequence[str]):
    """Our float32 eval-mode network as a `ctranslate2.specs.TransformerSpec`, weights set and vocabularies
    (the pieces of each id, in id order) registered; `hparams` in today's layout (`upgrade_hparams`)."""
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as ts

    block = TransformerOptions.of(hparams.get("block"), "model.block")
    positions, activation = block.positions, block.activation
    n_heads, n_kv = hparams.get("n_heads", 4), block.n_kv_heads
    if positions in ("rope", "alibi"):
        raise InputError(f"positions {positions!r}: the CTranslate2 export maps sinusoidal, learned or none only")
    if n_kv not in (None, n_heads):
        raise InputError(f"n_kv_heads ({n_kv}) != n_heads ({n_heads}): the CTranslate2 export maps multi-head "
                         "attention only")
    act = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
           "swiglu": common_spec.Activation.SWISH}[activation]
    spec = ts.TransformerSpec.from_config((len(model.encoder.layers), len(model.decoder.layers)), n_heads,
                                          pre_norm=block.norm_first, no_final_norm=not block.norm_first, activation=act,
                                          ffn_glu=activation == "swiglu")
    _set_stack(spec.encoder, model.encoder, model.src_embed.weight, cross=False)
    _set_stack(spec.decoder, model.decoder, model.tgt_embed.weight, cross=True)
    _set_linear(spec.decoder.projection, model.output.weight)
    spec.register_source_vocabulary(list(src_pieces))
    spec.register_target_vocabulary(list(tgt_pieces))
    pieces = [tgt_pieces[i] for i in (UNK_ID, BOS_ID, EOS_ID)]
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = pieces
    spec.config.decoder_start_token = pieces[1]
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    return spec


def _np(t: Tensor):
    # A copy: for an fp32 CPU tensor `.numpy()` shares its memory, and CTranslate2's converter edits some
    # arrays in place, which would change the live model's weights (and every later translation of it).
    return t.detach().float().cpu().numpy().copy()


def _set_linear(spec, weight: Tensor, bias: Tensor | None = None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _set_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _set_stack(spec, stack, embedding: Tensor, cross: bool) -> None:
    """Embedding, position table, layers and final norm of one stack (our Encoder or Decoder)."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _np(embedding)
    spec.scale_embeddings = True  # ours: embedding x sqrt(D) (core.TokenEmbedding)
    d_model = embedding.shape[1]
    table = torch.zeros(stack.max_len, d_model)  # positions "none": a table of zeros
    if stack.additive is not None:
        table = stack.additive(torch.zeros(1, stack.max_len, d_model), 0)[0]  # sinusoidal or learned, (T, D)
    spec.position_encodings.encodings = _np(table)
    if hasattr(spec, "layer_norm"):
        _set_norm(spec.layer_norm, stack.norm)
    for layer_spec, layer in zip(spec.layer, stack.layers, strict=True):
        # Our fused projections hold rows [q; k; v] and [k; v], as CTranslate2's do.
        attn = layer.self_attn
        for linear, ours in zip(layer_spec.self_attention.linear, (attn.qkv, attn.out), strict=True):
            _set_linear(linear, ours.weight, ours.bias)
        _set_norm(layer_spec.self_attention.layer_norm, (layer.self_block if cross else layer.attn_block).norm)
        if cross:
            c = layer.cross_attn
            for linear, ours in zip(layer_spec.attention.linear, (c.q, c.kv, c.out), strict=True):
                _set_linear(linear, ours.weight, ours.bias)
            _set_norm(layer_spec.attention.layer_norm, layer.cross_block.norm)
        _set_ffn(layer_spec.ffn, layer.ff, layer.ff_block.norm)


def _set_ffn(spec, ff, norm: torch.nn.LayerNorm) -> None:
    _set_norm(spec.layer_norm, norm)
    if ff.activation == "swiglu":  # ours: silu(gate) * value with up's rows [gate; value]
        gate_w, value_w = ff.up.weight.chunk(2, dim=0)
        gate_b, value_b = (None, None) if ff.up.bias is None else ff.up.bias.chunk(2, dim=0)
        _set_linear(spec.linear_0, gate_w, gate_b)
        _set_linear(spec.linear_0_noact, value_w, value_b)
    else:
        _set_linear(spec.linear_0, ff.up.weight, ff.up.bias)
    _set_linear(spec.linear_1, ff.down.weight, ff.down.bias)


def export_ctranslate2(ckpt: str | Path, out: str | Path, quantization: str | None = None) -> Path:
    return write_ctranslate2(*load(ckpt), out, quantization)


def write_ctranslate2(model: TranslatorNetwork, hparams: dict[str, Any], vocabs: tuple[SubwordVocab, SubwordVocab],
                      out: str | Path, quantization: str | None = None) -> Path:
    """Convert `model` (with its module's hyper-parameters, either layout, and vocabularies) into the folder `out`."""
    hparams = upgrade_hparams(hparams)
    if hparams.get("arch", "transformer") != "transformer":
        raise InputError(f"model.arch {hparams['arch']!r}: the CTranslate2 export converts transformers only; "
                         "use --format safetensors")
    src, tgt = vocabs
    spec = transformer_spec(model.float().eval(), hparams, src.pieces(range(src.vocab_size)),
                            tgt.pieces(range(tgt.vocab_size)))
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--output {out}: is a file; name a folder")
    # Written whole in a hidden folder beside `out`, then swapped in: a stopped export leaves no half a model.
    tmp, old = (out.with_name(f".{out.name}.{os.getpid()}.{kind}") for kind in ("tmpdir", "old"))
    try:
        names = write_vocabs(convert_spec(spec, tmp, quantization), vocabs)
        options = ctranslate2_options(model, tgt, names)
        (tmp / CT2_OPTIONS).write_text(json.dumps(options, indent=2) + "\n", encoding="utf-8")
        (tmp / CT2_README).write_text(ctranslate2_readme(options), encoding="utf-8")
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    finally:
        for folder in (tmp, old):
            shutil.rmtree(folder, ignore_errors=True)
    return out


# CTranslate2 divides a finished hypothesis' log-probability by length ** length_penalty, and with 0 it stops
# as soon as its best beam ends (ours: once beam_size hypotheses ended). A tiny positive penalty keeps our
# stopping rule and leaves the raw log-probability recoverable, so a user ranks by our GNMT penalty.
RAW_LENGTH_PENALTY = 1e-6


def ctranslate2_options(model: TransformerTranslator, tgt: SubwordVocab, names: dict[str, str]) -> dict[str, Any]:
    """What a plain CTranslate2 user needs for our search's output (`translate_options.json`). `greedy` and `beam` are
    `translate_batch` keyword arguments; `output_limit` is our per-sentence limit (CTranslate2 takes one
    `max_decoding_length` per call), `rerank` the GNMT penalty beam hypotheses are ranked by. Beam search keeps padding
    and BOS in the softmax, as ours does (`suppress_sequences` would renormalise without them and change which beams
    survive); a hypothesis holding one is dropped. The model's position tables bound the source and output lengths."""
    o = SearchOptions()
    cap = model.max_tgt_len - 1  # the decoder reads BOS + `cap` pieces to predict EOS
    never = tgt.pieces([PAD_ID, BOS_ID])  # our search never generates them
    common = {"max_input_length": model.max_src_len,  # ours truncates longer sources to the encoder's positions
              "min_decoding_length": 0}  # ours allows EOS first; CTranslate2's default of 1 forbids it
    return {
        "source_model": names["src_vocab"], "target_model": names["tgt_vocab"],
        # CTranslate2's default max_decoding_length (256) runs past the position table.
        "greedy": {"beam_size": 1, "max_decoding_length": cap, "suppress_sequences": [[p] for p in never], **common},
        # One step more than `greedy`: ours decodes `limit` pieces and then EOS.
        "beam": {"beam_size": o.beam_size, "num_hypotheses": o.beam_size, "length_penalty": RAW_LENGTH_PENALTY,
                 "return_scores": True, "return_end_token": True, "max_decoding_length": cap + 1, **common},
        # Per sentence: limit = min(int(max_len_a * source pieces + max_len_b), max); greedy max_decoding_length
        # = limit, beam max_decoding_length = limit + 1.
        "output_limit": {"max_len_a": o.max_len_a, "max_len_b": o.max_len_b, "max": cap},
        "rerank": {"alpha": o.alpha, "eos": tgt.pieces([EOS_ID])[0], "never": never},
    }


def ctranslate2_readme(options: dict[str, Any]) -> str:
    """README.md of a CTranslate2 export folder: how to get our translations with ctranslate2 and sentencepiece."""
    return f"""# A Translate model for CTranslate2

Written by `python -m translate.export --format ctranslate2`. Besides CTranslate2's `model.bin`,
`config.json` and vocabulary, this folder holds the sentencepiece models (`{options["source_model"]}`,
`{options["target_model"]}`) and `{CT2_OPTIONS}`: the `translate_batch` keyword arguments
(`greedy`, `beam`) that give the output of `python -m translate.infer` on the checkpoint, its
per-sentence output limit (`output_limit`) and the length penalty beam hypotheses are ranked by (`rerank`).

```python
import json
from pathlib import Path

import ctranslate2
import sentencepiece as spm

folder = Path("THIS_FOLDER")
options = json.loads((folder / "{CT2_OPTIONS}").read_text())
src = spm.SentencePieceProcessor(model_file=str(folder / options["source_model"]))
tgt = spm.SentencePieceProcessor(model_file=str(folder / options["target_model"]))
translator = ctranslate2.Translator(str(folder))
greedy, beam, limit, rerank = (options[k] for k in ("greedy", "beam", "output_limit", "rerank"))


def translate(line: str, beam_search: bool = True) -> str:
    if not line.strip():
        return ""  # a blank line translates to a blank line
    pieces = src.encode(line, out_type=str)[: greedy["max_input_length"]]
    longest = min(int(limit["max_len_a"] * len(pieces) + limit["max_len_b"]), limit["max"])
    if not beam_search:
        result = translator.translate_batch([pieces], **{{**greedy, "max_decoding_length": longest}})[0]
        return tgt.decode(result.hypotheses[0])
    result = translator.translate_batch([pieces], **{{**beam, "max_decoding_length": longest + 1}})[0]
    ended = [(h, s * len(h) ** beam["length_penalty"])  # the raw log-probability (EOS included)
             for h, s in zip(result.hypotheses, result.scores)
             if h[-1:] == [rerank["eos"]] and not set(h) & set(rerank["never"])]
    best = max(ended, key=lambda e: e[1] / ((5 + len(e[0])) / 6) ** rerank["alpha"],  # GNMT
               default=(result.hypotheses[0] + [rerank["eos"]], 0.0))
    return tgt.decode(best[0][:-1])
```

Sentences with the same limit may share one `translate_batch` call. The limit matters only for a
sentence whose translation reaches it; with `greedy` as written (`max_decoding_length`
{options["greedy"]["max_decoding_length"]}, the model's position table) one call gives the same output for the
others, and a larger value fails ("No position encodings are defined for positions >= ...").

Greedy search gives our output exactly. Beam search does too, with two rare exceptions: a sentence
whose beams reach the output limit (ours then ends each beam with EOS; CTranslate2 keeps its best
continuations, which the ranking above drops), and a beam that would go through padding or `<s>`
(ours never extends one; a trained model gives them almost no probability). CTranslate2's own length
penalty (log-probability / length ** `length_penalty`) ranks differently from ours, which is why the
hypotheses are ranked here: `length_penalty` is tiny but not 0, because 0 makes CTranslate2 stop as
soon as its best beam ends, where ours waits for `beam_size` hypotheses.
"""


def convert_spec(spec, out: str | Path, quantization: str | None = None) -> Path:
    """Write a CTranslate2 spec as a model folder (model.bin, config.json, vocabulary), replacing one there."""
    from ctranslate2.converters import Converter

    class _Ours(Converter):
        def _load(self):
            return spec

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--output {out}: is a file; name a folder")
    _Ours().convert(str(out), quantization=quantization, force=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m translate.export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint written by `python -m translate fit`")
    p.add_argument("--format", required=True, choices=FORMATS, help="safetensors (weights + config.json) or "
                   "ctranslate2")
    p.add_argument("--output", required=True, help="folder to write (created if missing)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, help="ctranslate2 only: weight type (default float32)")
    args = p.parse_args(argv)
    if args.quantization and args.format != "ctranslate2":
        p.error("--quantization applies to --format ctranslate2 only")
    interrupt_on_sigterm()
    with exit_on_error(interrupted=f"rerun the command to export {args.output} whole"):
        run_export(lambda: export_safetensors(args.ckpt, args.output) if args.format == "safetensors" else
                   export_ctranslate2(args.ckpt, args.output, args.quantization), args.format, args.output)


if __name__ == "__main__":
    main()

