"""Word alignments from the decoder's cross-attention (`WordAlignment`: JSON lines, Pharaoh links). Method (one extra
pass, exact): the decoder is re-run teacher-forced on [BOS] + hypothesis under `core.nn.explain.AttentionCapture`; the
row of decoder position t (which predicts y_t) is the attention of target subword y_t over the source subwords, averaged
over heads, of one layer or the mean of all.

Subwords to words: the weight of target word j on source word i is the SUM over the source subwords of word
i (so a word split in pieces is not diluted) of the MEAN over the target subwords of word j (so every target
word has one row of total weight 1, or less when attention falls on padding). The hard alignment links each
target word j to its highest-weight source word i, written "i-j" as in the demo corpus' `.align` files.

Legend: B sentences, H heads, T target subwords, S source subwords, Tw / Sw target / source words."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from core.nn import AttentionCapture
from translate.data.vocab import BOS_ID, WORD_BOUNDARY, SubwordVocab
from translate.model.networks import TranslatorNetwork

Layer = int | Literal["mean"]

# The mean of the decoder layers' cross-attention aligns better than any one layer against the demo
# corpus's reference alignments (AER; docs/results.md). The row to take for y_t is the decoder step
# that predicts y_t; the step whose input is y_t is off by one word.
DEFAULT_LAYER: Layer = "mean"


@dataclass
class WordAlignment:
    """One sentence pair's word alignment."""

    src_words: list[str]
    tgt_words: list[str]
    matrix: list[list[float]]  # (Tw, Sw) soft alignment: row j = target word j's weight on each source word
    links: list[tuple[int, int]]  # hard alignment: (source word i, target word j) pairs, sorted

    def pharaoh(self) -> str:
        """The hard alignment as "i-j i-j ..." (source word i, target word j)."""
        return " ".join(f"{i}-{j}" for i, j in self.links)

    def to_json(self, digits: int = 4) -> str:
        """One JSON line: src_words, tgt_words, matrix (rows = target words), alignment (Pharaoh)."""
        matrix = [[round(w, digits) for w in row] for row in self.matrix]
        return json.dumps({"src_words": self.src_words, "tgt_words": self.tgt_words, "matrix": matrix,
                           "alignment": self.pharaoh()}, ensure_ascii=False)


EMPTY = WordAlignment([], [], [], [])


@torch.no_grad()
def cross_attention(model: TranslatorNetwork, src: Tensor, targets: Sequence[Sequence[int]],
                    layer: Layer = DEFAULT_LAYER) -> list[Tensor]:
    """Head-averaged cross-attention of each target subword over the source subwords. `targets`: per sentence the target
    ids without BOS/EOS (a hypothesis or a reference). Returns per sentence a (T_b, S) tensor whose row t is target
    subword t (the decoder step that predicts it)."""
    width = max(1, max((len(t) for t in targets), default=0))
    tgt_in = torch.full((len(targets), width), model.pad_id, dtype=torch.long)
    for row, ids in enumerate(targets):
        tgt_in[row, : len(ids)] = torch.tensor([BOS_ID, *ids][: len(ids)], dtype=torch.long)  # [BOS] + y_<t
    tgt_in = tgt_in.to(src.device)
    memory, src_mask = model.encode(src)
    with AttentionCapture(model.decoder) as cap:
        model.decoder(model.tgt_embed(tgt_in), memory, src_mask)
    layers = cap.layers("cross_attn")  # list over layers of (B, H, T, S)
    if layer == "mean":
        weights = torch.stack([w.float().mean(1) for w in layers]).mean(0)  # (B, T, S)
    else:
        if not -len(layers) <= layer < len(layers):
            raise ValueError(f"`layer` ({layer}) is out of range for a decoder with {len(layers)} layers; "
                             f"use 0..{len(layers) - 1}, a negative index or 'mean'")
        weights = layers[layer].float().mean(1)  # (B, T, S)
    return [weights[b, : len(ids)].cpu() for b, ids in enumerate(targets)]


def words_of(vocab: SubwordVocab, ids: Sequence[int], text: str | None = None) -> tuple[list[str], list[int]]:
    """The whitespace words of an id sequence and each id's word index (-1 for specials). The words are those of `text`
    (the original line) or else of the decoded ids, so they read as the input and output lines do: a character the
    vocabulary lacks stays itself in the source instead of becoming `<unk>`. When the word counts disagree (e.g. the
    line was truncated, or normalisation turned a character into a space) the pieces' own text is used instead."""
    index = vocab.word_index(ids)
    n_words = max(index, default=-1) + 1
    surface = (vocab.decode(ids) if text is None else text).split()
    if len(surface) == n_words:
        return surface, index
    words: list[str] = [""] * n_words
    for piece, w in zip(vocab.pieces(ids), index, strict=True):
        if w >= 0:
            words[w] += piece.replace(WORD_BOUNDARY, "")
    return words, index


def to_word_matrix(weights: Tensor, tgt_index: Sequence[int], src_index: Sequence[int]) -> Tensor:
    """(T, S) subword weights -> (Tw, Sw) word weights: sum over source pieces, mean over target pieces. Word index -1
    ignores a row or column; `src_index` may be shorter than S (padding columns are ignored)."""
    n_tgt, n_src = max(tgt_index, default=-1) + 1, max(src_index, default=-1) + 1
    src_map = torch.zeros(weights.shape[1], max(n_src, 1))  # (S, Sw) one-hot of each piece's word
    for s, w in enumerate(src_index):
        if w >= 0:
            src_map[s, w] = 1.0
    tgt_map = torch.zeros(max(n_tgt, 1), weights.shape[0])  # (Tw, T) mean over a word's pieces
    for t, w in enumerate(tgt_index):
        if w >= 0:
            tgt_map[w, t] = 1.0
    tgt_map = tgt_map / tgt_map.sum(1, keepdim=True).clamp_min(1.0)
    return (tgt_map @ weights.float() @ src_map)[:n_tgt, :n_src]


def word_alignment(weights: Tensor, src_vocab: SubwordVocab, src_ids: Sequence[int], tgt_vocab: SubwordVocab,
                   tgt_ids: Sequence[int], src_text: str | None = None) -> WordAlignment:
    """Word alignment of one sentence pair from its (T, S) subword cross-attention (`src_text`: the input line)."""
    src_words, src_index = words_of(src_vocab, src_ids, src_text)
    tgt_words, tgt_index = words_of(tgt_vocab, tgt_ids)
    if not src_words or not tgt_words:
        return WordAlignment(src_words, tgt_words, [[0.0] * len(src_words) for _ in tgt_words], [])
    matrix = to_word_matrix(weights, tgt_index, src_index)  # (Tw, Sw)
    links = sorted((i, j) for j, i in enumerate(matrix.argmax(1).tolist()))
    return WordAlignment(src_words, tgt_words, matrix.tolist(), links)


def align_batch(model: TranslatorNetwork, src: Tensor, targets: Sequence[Sequence[int]], src_vocab: SubwordVocab,
                tgt_vocab: SubwordVocab, layer: Layer = DEFAULT_LAYER, src_texts: Sequence[str] | None = None,
                ) -> list[WordAlignment]:
    """Word alignments for a batch of sources and their targets (hypotheses or references); `src_texts`, the
    input lines, show the source words as written (default: decoded ids)."""
    weights = cross_attention(model, src, targets, layer)
    rows = [[i for i in row if i != model.pad_id] for row in src.tolist()]
    texts = [None] * len(rows) if src_texts is None else list(src_texts)
    return [word_alignment(w, src_vocab, s, tgt_vocab, t, x)
            for w, s, t, x in zip(weights, rows, targets, texts, strict=True)]
