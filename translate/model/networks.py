"""The translator networks by name (`model.arch`), built from the module's hyper-parameters.

The training module and the network-only loaders (`translate.api`, export folders) both build through
`build_translator`, so a checkpoint's `arch` decides the class everywhere.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

from translate.model.recurrent import RecurrentTranslator
from translate.model.transformer import Translator

Arch = Literal["transformer", "rnn"]
TranslatorNetwork = Translator | RecurrentTranslator
NETWORKS: dict[str, type[TranslatorNetwork]] = {"transformer": Translator, "rnn": RecurrentTranslator}


def build_translator(src_vocab_size: int, tgt_vocab_size: int, *, arch: Arch = "transformer",
                     **hyper_parameters: Any) -> TranslatorNetwork:
    """The `arch` network, given the hyper-parameters it accepts; the others (training settings, the other
    architecture's) are left out.

    Args:
        src_vocab_size, tgt_vocab_size: the vocabularies' sizes.
        arch: "transformer" or "rnn".
        hyper_parameters: `TranslationModule`'s, by name.
    """
    if arch not in NETWORKS:
        raise ValueError(f"`model.arch` ({arch!r}) must be one of {', '.join(map(repr, NETWORKS))}")
    cls = NETWORKS[arch]
    accepted = inspect.signature(cls).parameters
    return cls(src_vocab_size, tgt_vocab_size, **{k: v for k, v in hyper_parameters.items() if k in accepted})
