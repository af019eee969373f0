"""Constructor conventions across core and both apps.

Every constructor takes at most two positional arguments; the rest are keyword-only, so a call
cannot silently swap two ints. The shared vocabulary (docs/core.md, "Constructors") keeps one
relative order in every layer, so a signature reads the same from `MultiHeadAttention` up to the
LightningModules' `--help`.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Callable
from types import ModuleType

import pytest

import core.nn as core
from streamrec.model.metrics import RankingMetrics, SampledRankingMetrics
from streamrec.model.module import StreamRecModule
from streamrec.model.network import NETWORKS, StreamRecModel
from translate.model.module import TranslationModule
from translate.model.recurrent import RecurrentTranslator
from translate.model.transformer import TransformerTranslator

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
    RankingMetrics, SampledRankingMetrics, StreamRecModel, *NETWORKS.values(), StreamRecModule,
    TransformerTranslator, RecurrentTranslator, TranslationModule,
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


# One name per concept in function parameters too: an old spelling lives on only as a deprecated alias,
# which `core.runtime.deprecation.renamed_keywords` keeps out of the signature.
TRANSLATE_PROGRAMS = ("translate.api", "translate.export", "translate.infer", "translate.serve",
                      "translate.search.decoding", "translate.search.options", "translate.model.module",
                      "translate.model.networks", "translate.model.recurrent", "translate.model.options")
TRANSLATE_OLD_NAMES = {"beam": "beam_size", "nbest": "n_best", "attention": "rnn.score"}


def _functions(module: ModuleType) -> list[tuple[str, Callable]]:
    """The module's own public functions and the methods (and `__init__`) of its own public classes."""
    found = []
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            found.append((name, obj))
        elif inspect.isclass(obj):
            found += [(f"{name}.{m}", f) for m, f in vars(obj).items() if inspect.isfunction(getattr(f, "__func__", f))
                      and (m == "__init__" or not m.startswith("_"))]
    return found


@pytest.mark.parametrize("name", TRANSLATE_PROGRAMS)
def test_translate_functions_use_one_name_per_concept(name: str) -> None:
    OLD_NAMES = TRANSLATE_OLD_NAMES  # noqa: N806 - refused outright, not kept as aliases
    module = importlib.import_module(name)
    old = [f"{fn}({p})" for fn, f in _functions(module) for p in inspect.signature(getattr(f, "__func__", f)).parameters
           if p in OLD_NAMES]
    assert not old, f"{name}: {old}; use {OLD_NAMES}"
    if name == "translate.serve":  # the JSON fields
        assert not set(module.FIELDS) & set(OLD_NAMES)
    if name == "translate.infer":  # the flags --help shows
        shown = {s for a in module.build_parser()._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
        assert not shown & {f"--{old}" for old in OLD_NAMES}, shown


STREAMREC_MODULES = ("streamrec.api", "streamrec.serve", "streamrec.score", "streamrec.explain", "streamrec.ray_engine",
                     "streamrec.ranking.batch", "streamrec.ranking.predict",
                     "streamrec.ranking.topk", "streamrec.ranking.explain", "streamrec.model.module",
                     "streamrec.model.network", "streamrec.model.losses", "streamrec.model.options")
STREAMREC_OLD_NAMES = {"k": "top_k", "include_seen": "exclude_seen", "filter_seen": "exclude_seen",
                       "predict_exclude_seen": "exclude_seen", "predict_top_k": "top_k"}


@pytest.mark.parametrize("name", STREAMREC_MODULES)
def test_streamrec_functions_use_one_name_per_concept(name: str) -> None:
    """An old name lives on only as a deprecated alias: keyword-only, default None (`core.runtime.deprecation`)."""
    module = importlib.import_module(name)
    old = [f"{fn}({p.name})" for fn, f in _functions(module)
           for p in inspect.signature(getattr(f, "__func__", f)).parameters.values()
           if p.name in STREAMREC_OLD_NAMES and (p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is not None)]
    assert not old, f"{name}: {old}; use {STREAMREC_OLD_NAMES}"
