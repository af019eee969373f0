"""Translate from Python: a trained translator (or an ensemble) with its vocabularies.

    from translate import Translator

    t = Translator.load("runs/translate_demo/checkpoints/best.ckpt")   # several paths: an ensemble
    t.translate(["the cat sees the dog .", ""])     # ["die katze sieht den hund .", ""]
    best = t.translate(["the cat sees the dog ."], return_scores=True, return_alignments=True)[0]
    best.text, best.score, best.alignment.pharaoh()

`python -m translate.infer` and the server translate through here too, so every program searches alike."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from core.nn.cpu_fastpath import enable_cpu_fastpath
from core.nn.options import SpeedOptions
from core.runtime.checkpoint import load_module
from core.runtime.errors import InputError
from core.runtime.export import is_export_folder, load_folder
from core.runtime.precision import cpu_has_fast_bf16, no_fast_bf16_reason, quantize_int8
from translate.data.vocab import PAD_ID, SubwordVocab, not_a_checkpoint, vocabs_from_checkpoint
from translate.model.hparams import upgrade_hparams
from translate.model.networks import TranslatorNetwork, network_from_hparams
from translate.search.align import DEFAULT_LAYER, EMPTY, Layer, WordAlignment, align_batch
from translate.search.decoding import Hypothesis, search
from translate.search.ensemble import Ensemble
from translate.search.options import SearchOptions

log = logging.getLogger("translate.api")
WRITTEN_BY = "python -m translate fit"
EXPORTED_BY = "python -m translate.export --format safetensors"
MAX_TRUNCATION_WARNINGS = 20  # then one summary line, so a bad file cannot flood stderr
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INT8 = "int8"  # float32 model with int8 linear layers (core.runtime.precision.quantize_int8), CPU only
# Lines are encoded this many characters at a time and truncated at once: a chunk of long lines encoded
# whole would hold every untruncated subword as a Python int (tens of bytes each) until truncation.
ENCODE_CHARS = 1 << 20
CHUNK_LINES = 2_000  # translate_iter's default chunk; translate.infer's --chunk-lines default


@dataclass(frozen=True)
class Translation:
    """One translation of a sentence ("" for a blank one). `score` is what beam search ranks by: the log-probability (of
    the subwords and EOS, `log_prob`) divided by the GNMT length penalty; greedy search's is the log-probability itself.
    `alignment`: the best translation's word alignment with `return_alignments`."""

    text: str
    score: float
    log_prob: float
    alignment: WordAlignment | None = None


def pad_batch(rows: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([list(r) + [PAD_ID] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def format_line(hyps: Sequence[Hypothesis], vocab: SubwordVocab) -> str:
    """The output line of one input: its translations, tab-separated (one without --n-best)."""
    return "\t".join(vocab.decode(h.tokens) for h in hyps)


class Translator:
    """A trained translator (or an `Ensemble` of them, on its device and dtype) with its vocabularies."""

    def __init__(self, model: TranslatorNetwork | Ensemble, src_vocab: SubwordVocab, tgt_vocab: SubwordVocab):
        self.model, self.src_vocab, self.tgt_vocab = model.eval(), src_vocab, tgt_vocab

    @classmethod
    def load(cls, ckpt: str | Path | Sequence[str | Path], device: str | torch.device = "cpu",
             dtype: str = "float32") -> Translator:
        """The translator stored in a checkpoint, or an ensemble of several. `ckpt`: a checkpoint from
        `python -m translate fit` or `python -m translate.average`, or a folder from `python -m translate.export
        --format safetensors` (read without pickle); several (a list) make an `Ensemble` (the mean of their
        probabilities), which must share the vocabularies. `dtype`: "float32"; "bfloat16" (scores still normalised in
        float32) for GPUs and CPUs with bf16 units, float32 with a warning on a CPU without them; or "int8" for int8
        linear layers on the CPU (`core.runtime.precision.quantize_int8`). docs/results.md gives their BLEU cost."""
        if isinstance(ckpt, (str, Path)):
            return _load_one(Path(ckpt), device, dtype)
        if not ckpt:
            raise InputError("no checkpoint given; pass --ckpt CKPT [CKPT ...]")
        loaded = [_load_one(Path(p), device, dtype) for p in ckpt]
        for path, other in zip(ckpt[1:], loaded[1:], strict=True):
            if (other.src_vocab, other.tgt_vocab) != (loaded[0].src_vocab, loaded[0].tgt_vocab):
                raise InputError(f"{path}: its vocabularies differ from {ckpt[0]}'s; an ensemble needs models trained "
                                 "with one sentencepiece model (the same data, options and sentencepiece version)")
        first = loaded[0]
        return first if len(loaded) == 1 else cls(Ensemble([t.model for t in loaded]), first.src_vocab, first.tgt_vocab)

    @property
    def max_src_len(self) -> int:
        return self.model.max_src_len

    @property
    def aligner(self) -> TranslatorNetwork:
        """The translator whose cross-attention gives the alignments: an ensemble's first member."""
        return self.model.members[0] if isinstance(self.model, Ensemble) else self.model

    def translate(self, sentences: Sequence[str], beam_size: int = 5, n_best: int = 1, return_scores: bool = False,
                  return_alignments: bool = False, alpha: float = 0.6, max_len_a: float = 1.5, max_len_b: int = 10,
                  batch_size: int = 64, align_layer: Layer = DEFAULT_LAYER,
                  ) -> list[str] | list[Translation] | list[list[Translation]]:
        """Translate sentences; `beam_size`, `n_best`, `alpha`, `max_len_a`, `max_len_b`, `batch_size` are the
        `SearchOptions`, `align_layer` the decoder layer whose cross-attention aligns (an index, or "mean"). Returns a
        string per sentence; with `return_scores` or `return_alignments` (the best one carries its word alignment), a
        `Translation` per sentence; with `n_best` > 1, a list of `n_best` `Translation`s per sentence ([] if blank)."""
        options = SearchOptions(beam_size, n_best, alpha, max_len_a, max_len_b, batch_size)
        return self.translate_with(sentences, options, return_scores, align_layer if return_alignments else None)

    def translate_iter(self, sentences: Iterable[str], beam_size: int = 5, n_best: int = 1, return_scores: bool = False,
                       return_alignments: bool = False, alpha: float = 0.6, max_len_a: float = 1.5, max_len_b: int = 10,
                       batch_size: int = 64, align_layer: Layer = DEFAULT_LAYER,
                       chunk_lines: int = CHUNK_LINES) -> Iterator[str | Translation | list[Translation]]:
        """Translate an iterable of sentences lazily: what `translate` returns, one item at a time, in input order.
        `chunk_lines` sentences are read, sorted by length, translated and yielded before the next are read, so memory
        is bounded by the chunk, not the input (a file object works: its lines' "\\n" endings are stripped); a larger
        chunk fills batches better. The results equal `translate` on the whole list."""
        _check_sentences(sentences)  # now, not at the first next()
        options = SearchOptions(beam_size, n_best, alpha, max_len_a, max_len_b, batch_size)
        if chunk_lines < 1:
            raise InputError(f"`chunk_lines` ({chunk_lines}) must be >= 1")
        return self._iter_chunks(iter(sentences), chunk_lines, options, return_scores,
                                 align_layer if return_alignments else None)

    def _iter_chunks(self, lines: Iterator[str], chunk_lines: int, options: SearchOptions, return_scores: bool,
                     align_layer: Layer | None) -> Iterator[str | Translation | list[Translation]]:
        first, warned = 1, [0]
        while chunk := [s.removesuffix("\n").removesuffix("\r") for s in itertools.islice(lines, chunk_lines)]:
            yield from self.translate_with(chunk, options, return_scores, align_layer, first, warned)
            first += len(chunk)
            chunk = []  # freed before the next chunk is read

    def translate_with(self, sentences: Sequence[str], options: SearchOptions, return_scores: bool = False,
                       align_layer: Layer | None = None, first_line: int = 1, warned: list[int] | None = None,
                       ) -> list[str] | list[Translation] | list[list[Translation]]:
        """`translate` with the search settings as one `SearchOptions` (the server's path); `align_layer` None:
        no alignments; `first_line`, `warned`: as in `encode_sources`."""
        _check_sentences(sentences)
        sources = self.encode_sources(sentences, first_line, warned)
        hyps, aligned = self.translate_ids(sources, options, align_layer, sentences)
        if options.n_best == 1 and not return_scores and aligned is None:
            return [format_line(h, self.tgt_vocab) for h in hyps]
        best_alignment = [None] * len(hyps) if aligned is None else aligned
        results = [[Translation(self.tgt_vocab.decode(h.tokens), h.score, h.log_prob, a if k == 0 else None)
                    for k, h in enumerate(row)] for row, a in zip(hyps, best_alignment, strict=True)]
        if options.n_best > 1:
            return results
        blank = Translation("", 0.0, 0.0, EMPTY if aligned is not None else None)
        return [row[0] if row else blank for row in results]

    def encode_sources(self, lines: Sequence[str], first_line: int = 1, warned: list[int] | None = None,
                       ) -> list[list[int]]:
        """Subword ids per line ([] for a blank line), truncated to `max_src_len` with a warning naming the line.
        `first_line`: the 1-based number of `lines[0]` in the whole input; `warned`: a one-element counter of warnings
        already given, shared across chunks so a long input cannot flood stderr."""
        warned = [0] if warned is None else warned
        ids: list[list[int]] = []
        for start, stop in _spans([len(line) for line in lines], ENCODE_CHARS):
            for row in self.src_vocab.encode_batch([line if line.strip() else "" for line in lines[start:stop]]):
                if len(row) > self.max_src_len:
                    warned[0] += 1
                    if warned[0] <= MAX_TRUNCATION_WARNINGS:
                        log.warning("line %d: %d subwords, truncated to the model's max_len of %d",
                                    first_line + len(ids), len(row), self.max_src_len)
                    row = row[: self.max_src_len]  # a copy: the untruncated list is freed with its group
                ids.append(row)
        return ids

    def translate_chunk(self, lines: Sequence[str], options: SearchOptions, first_line: int = 1,
                        warned: list[int] | None = None, align_layer: Layer | None = None,
                        ) -> tuple[str, list[WordAlignment] | None]:
        """The output text of `lines` (a line each, n-best tab-separated) and their alignments: what
        `translate.infer` writes for a chunk, in this process or on a Ray worker."""
        sources = self.encode_sources(lines, first_line, warned)
        hyps, aligned = self.translate_ids(sources, options, align_layer, lines)
        return "".join(format_line(h, self.tgt_vocab) + "\n" for h in hyps), aligned

    def translate_ids(self, sources: Sequence[Sequence[int]], options: SearchOptions,
                      align_layer: Layer | None = None, source_texts: Sequence[str] | None = None,
                      ) -> tuple[list[list[Hypothesis]], list[WordAlignment] | None]:
        """Translate subword sources, longest first in batches, and return results in input order. Every program's path:
        each batch goes through `translate.search.decoding.search`, as in `predict`. An empty source gives no
        hypothesis; `source_texts` give the alignments' source words."""
        device = next(self.model.parameters()).device
        results: list[list[Hypothesis]] = [[] for _ in sources]
        alignments: list[WordAlignment] | None = None if align_layer is None else [EMPTY] * len(sources)
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: -len(sources[i]))
        for start in range(0, len(order), options.batch_size):
            rows = order[start : start + options.batch_size]
            src = pad_batch([sources[i] for i in rows], device)
            for i, hyps in zip(rows, search(self.model, src, options), strict=True):
                results[i] = hyps
            if alignments is not None:
                best = [results[i][0].tokens for i in rows]
                texts = None if source_texts is None else [source_texts[i] for i in rows]
                aligned = align_batch(self.aligner, src, best, self.src_vocab, self.tgt_vocab, align_layer, texts)
                for i, a in zip(rows, aligned, strict=True):
                    alignments[i] = a
        return results, alignments


def _check_sentences(sentences: object) -> None:
    if isinstance(sentences, str):
        raise InputError("`sentences` takes a list of sentences, not one string; pass [sentence]")


def _spans(lengths: Sequence[int], budget: int) -> Iterator[tuple[int, int]]:
    """(start, stop) ranges of consecutive items whose lengths sum to at most `budget` (at least one item each)."""
    start, held = 0, 0
    for k, n in enumerate(lengths):
        if k > start and held + n > budget:
            yield start, k
            start, held = k, 0
        held += n
    if start < len(lengths):
        yield start, len(lengths)


def _load_one(path: Path, device: str | torch.device, dtype: str) -> Translator:
    # The network alone (not the LightningModule that trained it): translating never imports Lightning.
    if is_export_folder(path):  # model.safetensors + config.json + sentencepiece files: no pickle
        model, config = load_folder(network_from_hparams, path, "translate", EXPORTED_BY)
        vocabs, hparams = _folder_vocabs(path, config), config["hyper_parameters"]
    else:
        model, state = load_module(network_from_hparams, path, WRITTEN_BY, "Translate", prefix="model.")
        vocabs, hparams = vocabs_from_checkpoint(state, path), state["hyper_parameters"]
    if dtype not in (*DTYPES, INT8):
        raise InputError(f"--dtype must be one of {', '.join((*DTYPES, INT8))}, got {dtype!r}")
    on_cpu = torch.device(device).type == "cpu"
    if dtype == INT8:
        if not on_cpu:
            raise InputError(f"--dtype int8 runs on the CPU only, not {device}; use --device cpu, "
                             "or --dtype bfloat16 on a GPU")
        return Translator(quantize_int8(model, inplace=True), *vocabs)
    if dtype == "bfloat16" and on_cpu and not cpu_has_fast_bf16():
        log.warning("--dtype bfloat16: %s, so decoding runs in float32", no_fast_bf16_reason())
        dtype = "float32"
    if SpeedOptions.of(upgrade_hparams(hparams).get("speed"), "model.speed").cpu_fastpath:  # as the module does
        enable_cpu_fastpath(model)
    return Translator(model.to(device=device, dtype=DTYPES[dtype]), *vocabs)


def _folder_vocabs(folder: Path, config: dict) -> tuple[SubwordVocab, SubwordVocab]:
    """The (source, target) sentencepiece models an export folder's config.json names."""
    names = config.get("src_vocab"), config.get("tgt_vocab")
    if not all(isinstance(n, str) and "/" not in n and "\\" not in n for n in names):
        raise not_a_checkpoint(folder)
    src = SubwordVocab.from_file(folder / names[0])
    return src, src if names[1] == names[0] else SubwordVocab.from_file(folder / names[1])
