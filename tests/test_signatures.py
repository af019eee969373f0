"""Constructor conventions across core and both apps (issue 26, "code shape").

Every constructor takes at most two positional arguments; the rest are keyword-only, so a call
cannot silently swap two ints. The shared vocabulary (docs/core.md, "Constructors") keeps one
relative order in every layer, so a signature reads the same from `MultiHeadAttention` up to the
LightningModules' `--help`.
"""

from __future__ import annotations

import inspect

import pytest

import core.nn as core
from streamrec.model.metrics import RankingMetrics, SampledRankingMetrics
from streamrec.model.module import StreamRecModule
from streamrec.model.sasrec import StreamRecModel
from translate.model.module import TranslationModule
from translate.model.transformer import Translator

VOCABULARY = (
    "pad_id", "d_model", "n_heads", "n_kv_heads", "n_layers", "n_encoder_layers", "n_decoder_layers", "d_ff",
    "dropout", "attn_dropout", "ff_dropout", "max_len", "positions", "activation", "norm_first",
)
CLASSES = [
    *(getattr(core, name) for name in (
        "MultiHeadAttention", "CrossAttention", "FeedForward", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder",
        "TokenEmbedding", "SinusoidalPositions", "LearnedPositions", "RotaryEmbedding", "ALiBi", "KVCache",
        "DecoderCache", "WarmupCosineLR", "InverseSqrtLR",
    )),
    RankingMetrics, SampledRankingMetrics, StreamRecModel, StreamRecModule, Translator, TranslationModule,
]


def _parameters(cls: type) -> list[inspect.Parameter]:
    return list(inspect.signature(cls.__init__).parameters.values())[1:]  # without self


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_constructors_take_at_most_two_positional_arguments(cls: type) -> None:
    positional = [p.name for p in _parameters(cls) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert len(positional) <= 2, f"{cls.__name__}: make {positional[2:]} keyword-only (after `*`)"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_shared_names_keep_one_order(cls: type) -> None:
    """Among the positional arguments (what the object is: sizes, widths) and among the keyword-only ones."""
    for keyword_only in (False, True):
        names = [p.name for p in _parameters(cls)
                 if p.name in VOCABULARY and (p.kind is inspect.Parameter.KEYWORD_ONLY) == keyword_only]
        assert names == sorted(names, key=VOCABULARY.index), f"{cls.__name__}: order {names} as in {VOCABULARY}"
