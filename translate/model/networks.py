"""The translator networks by name (`model.arch`), and the one handoff from the module's hyper-parameters to them.

Every loader builds through `build_translator`, so a checkpoint's `arch` decides the class everywhere and each network
is given exactly its own arguments (`ARGUMENTS`, `GROUPS`); the module's other settings (`TRAINING`) are not handed
over, and any other key is refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from core.nn.options import OptionGroup, SpeedOptions
from translate.model.hparams import upgrade_hparams
from translate.model.options import AdamWOptions, BleuOptions, LossOptions, RecurrentOptions, TransformerOptions
from translate.model.recurrent import RecurrentTranslator
from translate.model.transformer import TransformerTranslator

Arch = Literal["transformer", "rnn"]
TranslatorNetwork = TransformerTranslator | RecurrentTranslator
NETWORKS: dict[str, type[TranslatorNetwork]] = {"transformer": TransformerTranslator, "rnn": RecurrentTranslator}
# The module's top-level arguments each network reads, besides the vocabulary sizes.
ARGUMENTS: dict[str, tuple[str, ...]] = {
    "transformer": ("pad_id", "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff", "dropout",
                    "max_len", "share_embeddings"),
    "rnn": ("pad_id", "d_model", "n_encoder_layers", "n_decoder_layers", "dropout", "max_len", "share_embeddings"),
}
# The option group whose fields each network takes as keyword arguments.
GROUPS: dict[str, tuple[str, type[OptionGroup]]] = {"transformer": ("block", TransformerOptions),
                                                    "rnn": ("rnn", RecurrentOptions)}
# The module's settings no network reads: its training, evaluation and how it runs.
TRAINING: dict[str, type[OptionGroup] | None] = {"lr": None, "weight_decay": None, "objective": LossOptions,
                                                  "optimizer": AdamWOptions, "evaluation": BleuOptions,
                                                  "speed": SpeedOptions}
VOCABULARY = ("src_vocab_size", "tgt_vocab_size")


def accepted_keys() -> list[str]:
    """Every hyper-parameter of `TranslationModule`, in the order of its signature (a test keeps them equal)."""
    shared = [k for k in ARGUMENTS["transformer"] if k != "pad_id"]
    return [*VOCABULARY, "pad_id", "arch", *shared, "lr", "weight_decay",
            *(name for name, _ in GROUPS.values()), *(k for k in TRAINING if k not in ("lr", "weight_decay"))]


def network_arguments(hparams: Mapping[str, Any]) -> tuple[type[TranslatorNetwork], dict[str, Any]]:
    """The network class `hparams["arch"]` names and exactly the keyword arguments it takes from `hparams`. `hparams` in
    `TranslationModule`'s layout (groups as their dataclass or a mapping); missing ones take the module's defaults. An
    unknown key (top-level or in a group) or `arch` is a one-line `ValueError`."""
    known = accepted_keys()
    if unknown := [k for k in hparams if k not in known]:
        raise ValueError(f"`model.{unknown[0]}` is not a hyper-parameter of TranslationModule; "
                         f"its keys are {', '.join(known)}")
    arch = hparams.get("arch", "transformer")
    if arch not in NETWORKS:
        raise ValueError(f"`model.arch` ({arch!r}) must be one of {', '.join(map(repr, NETWORKS))}")
    groups = {**{name: cls for name, cls in GROUPS.values()},
              **{name: cls for name, cls in TRAINING.items() if cls is not None}}
    checked = {name: cls.of(hparams.get(name), f"model.{name}") for name, cls in groups.items()}  # refuses typos
    kwargs = {k: hparams[k] for k in ARGUMENTS[arch] if k in hparams}
    kwargs.update(dataclasses.asdict(checked[GROUPS[arch][0]]))  # type: ignore[call-overload]
    return NETWORKS[arch], kwargs


def build_translator(hparams: Mapping[str, Any]) -> TranslatorNetwork:
    """The network `hparams` describes (see `network_arguments`), sized by its `src_vocab_size` and `tgt_vocab_size`."""
    cls, kwargs = network_arguments(hparams)
    if missing := [k for k in VOCABULARY if k not in hparams]:
        raise ValueError(f"hyper-parameter `{missing[0]}` is missing; a translator needs both vocabulary sizes")
    return cls(hparams["src_vocab_size"], hparams["tgt_vocab_size"], **kwargs)


def network_from_hparams(**hparams: Any) -> TranslatorNetwork:
    """`build_translator` over a stored checkpoint's or export's hyper-parameters, either layout (`upgrade_hparams`).
    The factory the network-only loaders pass to `core.runtime.checkpoint.load_module` and
    `core.runtime.export.load_folder`, which call it with the stored hyper-parameters by name."""
    return build_translator(upgrade_hparams(hparams))
