"""`TranslationModule`'s option groups: frozen dataclasses that check their own rules (`core.nn.options`).

Each is one constructor argument of the module, `--model.optimizer.warmup_steps` on the command line and a nested
mapping in YAML; checkpoints hold them as plain dicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.nn.blocks import Activation
from core.nn.options import OptionGroup, check_choice
from core.nn.recurrent import Cell, Scoring
from core.nn.stacks import Positions

Schedule = Literal["cosine", "inverse_sqrt"]
BleuTokenize = Literal["13a", "intl", "char", "none"]


def _check_probability(name: str, p: float | None) -> None:
    if p is not None and not 0.0 <= p <= 1.0:
        raise ValueError(f"`model.{name}` ({p}) must be a probability in [0, 1]")


@dataclass(frozen=True)
class TransformerOptions(OptionGroup):
    """The transformer's attention blocks (the rnn reads none of these).

    Args:
        n_kv_heads: key/value heads for grouped-query attention (default n_heads).
        attn_dropout: dropout on attention weights.
        ff_dropout: dropout after the feed-forward activation (fairseq's `activation_dropout`); None: `dropout`.
        positions: position encoding (self-attention only).
        activation: feed-forward activation.
        norm_first: pre-LN (True) or post-LN (False, the original Transformer)."""

    n_kv_heads: int | None = None
    attn_dropout: float = 0.0
    ff_dropout: float | None = None
    positions: Positions = "sinusoidal"
    activation: Activation = "relu"
    norm_first: bool = True

    def __post_init__(self) -> None:
        if self.n_kv_heads is not None and self.n_kv_heads < 1:
            raise ValueError(f"`model.block.n_kv_heads` ({self.n_kv_heads}) must be >= 1, or null for n_heads")
        _check_probability("block.attn_dropout", self.attn_dropout)
        _check_probability("block.ff_dropout", self.ff_dropout)


@dataclass(frozen=True)
class RecurrentOptions(OptionGroup):
    """The rnn's recurrent parts (`model.arch: rnn`; the transformer reads none of these).

    Args:
        cell: the recurrent cell, "gru" or "lstm".
        score: attention score: "additive" (Bahdanau), "general" or "dot" (Luong; needs hidden_size == d_model).
        hidden_size: the recurrent width (each encoder direction's, and the decoder's)."""

    cell: Cell = "gru"
    score: Scoring = "additive"
    hidden_size: int = 256

    def __post_init__(self) -> None:
        check_choice("model.rnn.cell", self.cell, ("gru", "lstm"))
        check_choice("model.rnn.score", self.score, ("additive", "general", "dot"))
        if self.hidden_size < 1:
            raise ValueError(f"`model.rnn.hidden_size` ({self.hidden_size}) must be >= 1")


@dataclass(frozen=True)
class LossOptions(OptionGroup):
    """The training loss: label-smoothed cross-entropy, optionally with R-Drop.

    Args:
        label_smoothing: eps of the label-smoothed cross-entropy (0 = plain cross-entropy).
        rdrop_alpha: R-Drop weight (0 = off): each training batch runs twice, through two dropout masks, and
            the loss adds alpha / 4 times the symmetric KL of their predictions (the paper's alpha)."""

    label_smoothing: float = 0.1
    rdrop_alpha: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"`model.objective.label_smoothing` ({self.label_smoothing}) must be in [0, 1)")
        if self.rdrop_alpha < 0.0:
            raise ValueError(f"`model.objective.rdrop_alpha` ({self.rdrop_alpha}) must be >= 0 (0 turns R-Drop off)")


@dataclass(frozen=True)
class AdamWOptions(OptionGroup):
    """AdamW's betas and the learning-rate schedule around the peak `lr`.

    Args:
        betas: AdamW betas.
        warmup_steps: optimizer steps of linear warmup.
        lr_floor: final learning rate as a fraction of the peak (cosine decay over the whole run).
        schedule: "cosine" (warmup, then cosine decay to `lr_floor` at the run's last step) or "inverse_sqrt"
            (warmup, then lr * sqrt(warmup_steps / step); needs no run length, ignores `lr_floor`)."""

    betas: tuple[float, float] = (0.9, 0.98)
    warmup_steps: int = 400
    lr_floor: float = 0.01
    schedule: Schedule = "cosine"

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))  # a checkpoint's or YAML's list
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"`model.optimizer.betas` ({list(self.betas)}) must be two numbers in [0, 1)")
        if self.warmup_steps < 0:
            raise ValueError(f"`model.optimizer.warmup_steps` ({self.warmup_steps}) must be >= 0")
        if not 0.0 <= self.lr_floor <= 1.0:
            raise ValueError(f"`model.optimizer.lr_floor` ({self.lr_floor}) must be a fraction of the peak in [0, 1]")
        check_choice("model.optimizer.schedule", self.schedule, ("cosine", "inverse_sqrt"))
        if self.schedule == "inverse_sqrt" and self.warmup_steps < 1:
            raise ValueError(f"`model.optimizer.warmup_steps` ({self.warmup_steps}) must be >= 1 with the "
                             "inverse_sqrt schedule")


@dataclass(frozen=True)
class BleuOptions(OptionGroup):
    """How `validate` and `test` decode and score (sacreBLEU's BLEU and chrF).

    Args:
        val_beam_size: beam width when validating (1 = greedy search).
        test_beam_size: beam width when testing and predicting.
        alpha: GNMT length-penalty exponent for beam search.
        bleu_tokenize: sacreBLEU tokenizer ("13a" is the WMT default; "intl", "char", "none").
        bleu_lowercase: score lowercased BLEU (chrF stays cased)."""

    val_beam_size: int = 1
    test_beam_size: int = 5
    alpha: float = 0.6
    bleu_tokenize: BleuTokenize = "13a"
    bleu_lowercase: bool = False

    def __post_init__(self) -> None:
        if self.val_beam_size < 1 or self.test_beam_size < 1:
            raise ValueError(f"`model.evaluation.val_beam_size` ({self.val_beam_size}) and `test_beam_size` "
                             f"({self.test_beam_size}) must be >= 1")
        check_choice("model.evaluation.bleu_tokenize", self.bleu_tokenize, ("13a", "intl", "char", "none"))
