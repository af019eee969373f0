"""StreamRec's option groups (`--model.objective.loss sampled`, nested mappings in YAML, plain dicts in checkpoints).

Each group validates itself; a rule spanning two groups lives in `check_training`, one a network cannot honour in that
network's class (`streamrec.model.network`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from core.nn.blocks import Activation
from core.nn.linear_attention import LinearAttention
from core.nn.mixing import LowPassKind, LowPassMix
from core.nn.options import OptionGroup, check_choice
from core.nn.stacks import Positions
from core.nn.windowed import WindowAttention

LossName = Literal["full", "sampled", "bce", "gbce"]
ItemOptimizer = Literal["adamw", "rowwise_adagrad"]
AttentionName = Literal["full", "window", "linear"]
ResidualName = Literal["plain", "gated"]
FeatureUse = Literal["add", "attention", "stream"]


def _share(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), got {value}")


@dataclass(frozen=True)
class BlockOptions(OptionGroup):
    """The transformer blocks' shape beyond width and depth.

    Args:
        n_kv_heads: key/value heads for grouped-query attention (None: n_heads).
        attn_dropout: dropout on attention weights.
        positions: learned (SASRec), sinusoidal, rope, alibi or none.
        activation: feed-forward activation.
        residual: plain, or gated: each residual update scaled by a learned sigmoid gate of the block's input
            (LiGR's block, eSASRec's with `activation: swiglu`; `core.nn.blocks`). Transformer networks only.
        output_head: a dense layer, GELU and LayerNorm on each hidden state before it is scored: BERT's
            masked-LM head, part of BERT4Rec as published (and of RecBole's); any network takes it."""

    n_kv_heads: int | None = None
    attn_dropout: float = 0.0
    positions: Positions = "learned"
    activation: Activation = "gelu"
    residual: ResidualName = "plain"
    output_head: bool = False

    def __post_init__(self) -> None:
        _share("model.block.attn_dropout", self.attn_dropout)
        check_choice("model.block.residual", self.residual, ("plain", "gated"))


@dataclass(frozen=True)
class MixingOptions(OptionGroup):
    """How each block mixes a history's positions.

    Args:
        attention: full (default); for histories of thousands of items, linear in their length (sasrec only):
            window (each position attends to the last `window` items) or linear (elu + 1 features).
        window: the window of `attention: window`.
        lowpass_alpha: weight of a causal low-pass filter branch mixed with each layer's attention (BSARec's
            "beyond self-attention", made causal: `core.nn.mixing`); 0 (default): attention only. sasrec's.
        lowpass_window: that filter's moving-average length in items (fourier: BSARec's c, `core.nn.mixing`).
        lowpass_kind: causal (default), or fourier: BSARec's own filter over the whole history, which reads each
            position's future, so it needs training at the last position only (`data.prefixes: true`).
        bases: arch tvrec's basis filters per layer (TV-Rec's M, `core.nn.time_variant`), in place of attention."""

    attention: AttentionName = "full"
    window: int = 256
    lowpass_alpha: float = 0.0
    lowpass_window: int = 16
    lowpass_kind: LowPassKind = "causal"
    bases: int = 32

    def __post_init__(self) -> None:
        check_choice("model.mixing.attention", self.attention, ("full", "window", "linear"))
        if self.bases < 1:
            raise ValueError(f"`model.mixing.bases` must be >= 1, got {self.bases}")
        if self.window < 1:
            raise ValueError(f"`model.mixing.window` must be >= 1, got {self.window}")
        if self.lowpass_alpha < 0:
            raise ValueError(f"`model.mixing.lowpass_alpha` must be >= 0 (0: attention only), got {self.lowpass_alpha}")
        LowPassMix(self.lowpass_alpha or 1.0, self.lowpass_window, self.lowpass_kind)  # the mix checks the rest

    def kernel(self) -> WindowAttention | LinearAttention | None:
        """The attention part of `attention` (None: the softmax over every allowed key)."""
        if self.attention == "window":
            return WindowAttention(self.window)
        return LinearAttention() if self.attention == "linear" else None

    def lowpass(self, max_len: int) -> LowPassMix | None:
        """The low-pass branch, or None without one."""
        if self.lowpass_alpha <= 0:
            return None
        return LowPassMix(self.lowpass_alpha, self.lowpass_window, self.lowpass_kind, max_len)


@dataclass(frozen=True)
class ItemOptions(OptionGroup):
    """How items become vectors.

    Args:
        tied: score with the item embedding (True) or a separate output table.
        init_std: standard deviation of the initial item vectors (None: d_model ** -0.5).
        id_dropout: with item features, the share of item id vectors dropped in training, so that items are also
            learnt by their features alone (DropoutNet): cold items have nothing else. 0 (default): none.
        history_dropout: the share of history items blanked in training (position kept; each pass draws its own,
            as CL4SRec's item masks), against leaning on single past items. 0 (default): none.
        features: how item features enter. add (default): their mean embedding joins the item's id vector, in the
            inputs and the scores. attention: DIF-SR's decoupled side information (sasrec only): the mean only
            steers attention, each layer adding logits of its own, so the ids' vectors are not crowded by the
            attributes; inputs, values and scores are ids alone, so a cold item (no training history) keeps an id
            row never trained on a positive, ranked as an id-only model ranks it. stream: FDSA's (Zhang et al.,
            IJCAI 2019) second self-attention stream over the features' means, fused with the ids' stream by a
            linear layer before the scores (sasrec only); scores and cold items as with attention.
        feature_width: the feature embedding width of `features: attention` (None: d_model); n_heads must divide it."""

    tied: bool = True
    init_std: float | None = None
    id_dropout: float = 0.0
    history_dropout: float = 0.0
    features: FeatureUse = "add"
    feature_width: int | None = None

    def __post_init__(self) -> None:
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"`model.items.init_std` must be > 0, got {self.init_std}")
        _share("model.items.id_dropout", self.id_dropout)
        _share("model.items.history_dropout", self.history_dropout)
        check_choice("model.items.features", self.features, ("add", "attention", "stream"))
        if self.features != "add" and self.id_dropout:
            raise ValueError("`model.items.id_dropout` lets features stand in for ids, which `features: "
                             f"{self.features}` never scores by: set it to 0")
        if self.feature_width is not None and (self.features != "attention" or self.feature_width < 1):
            raise ValueError("`model.items.feature_width` sizes `features: attention`'s embeddings: >= 1 with it, "
                             f"unset otherwise; got {self.feature_width}")


@dataclass(frozen=True)
class ObjectiveOptions(OptionGroup):
    """The training loss and the terms on it.

    Args:
        loss: full (softmax over all items), sampled (softmax over shared negatives with logQ correction), bce
            (SASRec: one negative set per position), gbce (gSASRec).
        label_smoothing: eps of label smoothing in the full softmax (eps / N on every item); 0: none.
        rdrop_alpha: R-Drop's weight (0, the default, is off): the symmetric KL between two dropout passes'
            next-item distributions (`core.nn.rdrop_cross_entropy`). About twice a step; `loss: full`.
        num_negatives: negatives per step (sampled: shared by the batch; bce/gbce: per position).
        negative_sampling: uniform or popularity (popularity only for `sampled`).
        gbce_t: gSASRec calibration t in [0, 1] (0 = plain BCE).
        mask_prob: bert4rec's share of history items masked in each training sequence (at least one per
            sequence); unused by the other networks."""

    loss: LossName = "full"
    label_smoothing: float = 0.0
    rdrop_alpha: float = 0.0
    num_negatives: int = 256
    negative_sampling: Literal["uniform", "popularity"] = "uniform"
    gbce_t: float = 0.75
    mask_prob: float = 0.2

    def __post_init__(self) -> None:
        check_choice("model.objective.loss", self.loss, ("full", "sampled", "bce", "gbce"))
        _share("model.objective.label_smoothing", self.label_smoothing)
        if self.rdrop_alpha < 0.0:
            raise ValueError(f"`model.objective.rdrop_alpha` must be >= 0 (0 turns R-Drop off), got {self.rdrop_alpha}")
        if self.loss != "full" and self.num_negatives < 1:
            raise ValueError(f"`model.objective.num_negatives` must be >= 1 for loss {self.loss!r}, "
                             f"got {self.num_negatives}")
        check_choice("model.objective.negative_sampling", self.negative_sampling, ("uniform", "popularity"))
        if self.negative_sampling == "popularity" and self.loss != "sampled":
            raise ValueError("`model.objective.negative_sampling: popularity` needs `loss: sampled` (it relies on "
                             "the logQ correction)")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"`model.objective.mask_prob` must be in (0, 1), got {self.mask_prob}")


@dataclass(frozen=True)
class ContrastiveOptions(OptionGroup):
    """A contrastive term beside the loss (CL4SRec, DuoRec).

    Args:
        weight: the term's weight (0, the default, is off): each window's last state picks its other view out of
            the batch (`core.nn.contrastive_loss`; DuoRec's same-target rows not negatives). `loss: full`, sasrec/gru.
        temperature: the term's temperature on dot products (1, as CL4SRec and DuoRec).
        positive: the second view: dropout (default; another dropout mask, as CL4SRec), or same_target (another
            window with the same last target, DuoRec's; needs `second_pass_softmax: false`).
        second_pass_softmax: whether the second pass also trains the full softmax. False runs it for the term's
            last state only, a fraction of a step instead of doubling it. R-Drop needs both passes' softmax."""

    weight: float = 0.0
    temperature: float = 1.0
    positive: Literal["dropout", "same_target"] = "dropout"
    second_pass_softmax: bool = True

    def __post_init__(self) -> None:
        if self.weight < 0.0 or self.temperature <= 0.0:
            raise ValueError(f"`model.contrastive.weight` must be >= 0 and `model.contrastive.temperature` > 0, "
                             f"got {self.weight} and {self.temperature}")
        check_choice("model.contrastive.positive", self.positive, ("dropout", "same_target"))
        if self.positive == "same_target" and self.second_pass_softmax:
            raise ValueError("`model.contrastive.positive: same_target` needs `second_pass_softmax: false`: its "
                             "second pass encodes other windows than the first")
        if not self.second_pass_softmax and not self.weight:
            raise ValueError("`model.contrastive.second_pass_softmax: false` needs the term on "
                             f"(`model.contrastive.weight` > 0), got {self.weight}")


@dataclass(frozen=True)
class OptimizerOptions(OptionGroup):
    """The schedule and how the item tables learn (the peak `lr` and `weight_decay` are the module's own).

    Args:
        warmup_steps: linear warmup steps of the warmup-cosine schedule.
        lr_floor: final learning rate as a fraction of the peak.
        item_optimizer: adamw (default; about 6 item tables at a step's peak), or rowwise_adagrad: sparse gradients
            and one AdaGrad accumulator per row (FBGEMM's), about 1 table; needs a sampled loss, and gloo under DDP.
        item_lr: peak learning rate of the item rows under `rowwise_adagrad`; larger than AdamW's, as AdaGrad's
            steps shrink as a row's squared gradients add up."""

    warmup_steps: int = 100
    lr_floor: float = 0.1
    item_optimizer: ItemOptimizer = "adamw"
    item_lr: float = 0.1

    def __post_init__(self) -> None:
        check_choice("model.optimizer.item_optimizer", self.item_optimizer, ("adamw", "rowwise_adagrad"))
        if self.item_lr <= 0:
            raise ValueError(f"`model.optimizer.item_lr` must be > 0, got {self.item_lr}")

    @property
    def sparse(self) -> bool:
        """Whether the item tables take sparse gradients (`rowwise_adagrad`)."""
        return self.item_optimizer == "rowwise_adagrad"


@dataclass(frozen=True)
class EvalOptions(OptionGroup):
    """What validation and test measure.

    Args:
        ks: cutoffs for HR@K, NDCG@K, MRR@K.
        exclude_seen: leave items already in the history out of the validation and test ranking.
        sampled_metrics: also log the SASRec paper's sampled metrics (100 negatives; for comparison only).
        popularity_baseline: also log a most-popular baseline's metrics (`*_mostpop_*`): what the model adds."""

    ks: tuple[int, ...] = (10, 20)
    exclude_seen: bool = True
    sampled_metrics: bool = False
    popularity_baseline: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "ks", tuple(self.ks))  # a list from YAML or a checkpoint
        if not self.ks or any(int(k) < 1 for k in self.ks):
            raise ValueError(f"`model.evaluation.ks` must be cutoffs >= 1, got {list(self.ks)}")


FULL_SOFTMAX_TERMS = (("objective", "label_smoothing"), ("objective", "rdrop_alpha"), ("contrastive", "weight"))


def full_softmax_terms(hparams: Mapping[str, Any]) -> list[str]:
    """The terms `hparams` (groups as mappings or objects) turns on that need the full softmax, as `group.key`:
    one list for the module's refusal and for `tune`, which then leaves the loss out of its search."""
    def value(group: str, key: str) -> Any:
        options = hparams.get(group)
        return getattr(options, key, None) if not isinstance(options, Mapping) else options.get(key)

    return [f"{group}.{key}" for group, key in FULL_SOFTMAX_TERMS if value(group, key)]


def check_training(objective: ObjectiveOptions, contrastive: ContrastiveOptions,
                   optimizer: OptimizerOptions, num_features: int) -> None:
    """The rules that span groups: terms that ride on the full softmax, and the sparse item optimizer's needs."""
    terms = full_softmax_terms({"objective": objective, "contrastive": contrastive})
    if terms and objective.loss != "full":
        one = len(terms) == 1
        raise ValueError(f"{' and '.join(f'`model.{t}`' for t in terms)} {'needs' if one else 'need'} "
                         f"`model.objective.loss: full`, not {objective.loss!r}; "
                         f"{' '.join(f'--model.{t} 0' for t in terms)} trains without {'it' if one else 'them'}")
    if not contrastive.second_pass_softmax and objective.rdrop_alpha:
        raise ValueError("`model.contrastive.second_pass_softmax: false` does not work with R-Drop, which needs both "
                         f"passes' softmax (`model.objective.rdrop_alpha` {objective.rdrop_alpha}); set it to 0")
    if optimizer.sparse and objective.loss == "full":
        raise ValueError("`model.optimizer.item_optimizer: rowwise_adagrad` needs a sampled loss (sampled, bce or "
                         "gbce): `loss: full` gives every item row a gradient each step")
    if optimizer.sparse and num_features:
        raise ValueError("`model.optimizer.item_optimizer: rowwise_adagrad` does not work with item features: "
                         "every item's vector reads the shared feature table; use `item_optimizer: adamw`")
