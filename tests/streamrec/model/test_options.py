"""StreamRec's option groups and the rules between them: every refusal, met through `StreamRecModule` as a config
or the command line meets it (groups as mappings), is one line that names the key to change."""

from __future__ import annotations

import re

import pytest

from core.nn.options import SpeedOptions
from streamrec.model.module import StreamRecModule
from streamrec.model.options import (
    BlockOptions,
    ContrastiveOptions,
    EvalOptions,
    ItemOptions,
    MixingOptions,
    ObjectiveOptions,
    OptimizerOptions,
    check_training,
    full_softmax_terms,
)

SMALL = dict(d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=6)
FEATURES = dict(num_features=3, features_per_item=2)
ROWWISE = {"item_optimizer": "rowwise_adagrad"}

# (module arguments, a part of the message); the group's own rules first, then the rules across groups
# (`check_training`), then what a network refuses (`refuse`, `refuse_training`) and the network's own checks.
REFUSALS = [
    ({"block": {"attn_dropout": 1.0}}, "`model.block.attn_dropout` must be in [0, 1), got 1.0"),
    ({"block": {"residual": "highway"}}, "`model.block.residual` must be plain or gated, got 'highway'"),
    ({"mixing": {"attention": "sparse"}}, "`model.mixing.attention` must be full, window or linear, got 'sparse'"),
    ({"mixing": {"attention": "window", "window": 0}}, "`model.mixing.window` must be >= 1, got 0"),
    ({"mixing": {"lowpass_alpha": -0.5}}, "`model.mixing.lowpass_alpha` must be >= 0 (0: attention only), got -0.5"),
    ({"mixing": {"lowpass_alpha": 1.5}}, "`alpha` of the low-pass mix must be in (0, 1], got 1.5"),
    ({"mixing": {"lowpass_window": 0}}, "`window` of the low-pass mix must be >= 1, got 0"),
    ({"mixing": {"lowpass_kind": "box"}}, "`kind` of the low-pass mix must be causal or fourier, got 'box'"),
    ({"items": {"init_std": 0.0}}, "`model.items.init_std` must be > 0, got 0.0"),
    ({"items": {"id_dropout": 1.0}, **FEATURES}, "`model.items.id_dropout` must be in [0, 1), got 1.0"),
    ({"items": {"history_dropout": -0.1}}, "`model.items.history_dropout` must be in [0, 1), got -0.1"),
    ({"objective": {"loss": "softmax"}}, "`model.objective.loss` must be full, sampled, bce or gbce, got 'softmax'"),
    ({"objective": {"label_smoothing": 1.0}}, "`model.objective.label_smoothing` must be in [0, 1), got 1.0"),
    ({"objective": {"rdrop_alpha": -1.0}}, "`model.objective.rdrop_alpha` must be >= 0 (0 turns R-Drop off)"),
    ({"objective": {"loss": "gbce", "num_negatives": 0}},
     "`model.objective.num_negatives` must be >= 1 for loss 'gbce', got 0"),
    ({"objective": {"loss": "sampled", "negative_sampling": "zipf"}},
     "`model.objective.negative_sampling` must be uniform or popularity, got 'zipf'"),
    ({"objective": {"negative_sampling": "popularity"}},
     "`model.objective.negative_sampling: popularity` needs `loss: sampled`"),
    ({"objective": {"mask_prob": 0.0}}, "`model.objective.mask_prob` must be in (0, 1), got 0.0"),
    ({"contrastive": {"weight": -0.1}}, "`model.contrastive.weight` must be >= 0 and `model.contrastive.temperature` "
                                        "> 0, got -0.1 and 1.0"),
    ({"contrastive": {"weight": 0.1, "temperature": 0.0}}, "`model.contrastive.temperature` > 0, got 0.1 and 0.0"),
    ({"contrastive": {"weight": 0.1, "second_pass_softmax": False, "positive": "batch"}},
     "`model.contrastive.positive` must be dropout or same_target, got 'batch'"),
    ({"contrastive": {"weight": 0.1, "positive": "same_target"}},
     "`model.contrastive.positive: same_target` needs `second_pass_softmax: false`"),
    ({"contrastive": {"second_pass_softmax": False}},
     "`model.contrastive.second_pass_softmax: false` needs the term on (`model.contrastive.weight` > 0), got 0.0"),
    ({"optimizer": {"item_optimizer": "sparse_adam"}},
     "`model.optimizer.item_optimizer` must be adamw or rowwise_adagrad, got 'sparse_adam'"),
    ({"optimizer": {"item_lr": 0.0}}, "`model.optimizer.item_lr` must be > 0, got 0.0"),
    ({"evaluation": {"ks": []}}, "`model.evaluation.ks` must be cutoffs >= 1, got []"),
    ({"evaluation": {"ks": [10, 0]}}, "`model.evaluation.ks` must be cutoffs >= 1, got [10, 0]"),
    ({"objective": {"loss": "sampled", "label_smoothing": 0.1}},
     "`model.objective.label_smoothing` needs `model.objective.loss: full`, not 'sampled'; "
     "--model.objective.label_smoothing 0 trains without it"),
    ({"objective": {"loss": "gbce", "rdrop_alpha": 1.0}},
     "`model.objective.rdrop_alpha` needs `model.objective.loss: full`, not 'gbce'"),
    ({"objective": {"loss": "bce", "label_smoothing": 0.1}, "contrastive": {"weight": 0.1}},
     "`model.objective.label_smoothing` and `model.contrastive.weight` need `model.objective.loss: full`, not 'bce'; "
     "--model.objective.label_smoothing 0 --model.contrastive.weight 0 trains without them"),
    ({"objective": {"rdrop_alpha": 1.0}, "contrastive": {"weight": 0.1, "second_pass_softmax": False}},
     "`model.contrastive.second_pass_softmax: false` does not work with R-Drop, which needs both passes' softmax "
     "(`model.objective.rdrop_alpha` 1.0); set it to 0"),
    ({"optimizer": ROWWISE}, "`model.optimizer.item_optimizer: rowwise_adagrad` needs a sampled loss"),
    ({"objective": {"loss": "sampled"}, "optimizer": ROWWISE, **FEATURES},
     "`model.optimizer.item_optimizer: rowwise_adagrad` does not work with item features"),
    ({"arch": "transformer"}, "`model.arch` must be sasrec, bert4rec, gru, tvrec; got 'transformer'"),
    ({"arch": "bert4rec", "contrastive": {"weight": 0.1}},
     "`model.contrastive.weight` needs a causal network (sasrec, gru), not bert4rec; "
     "`--model.contrastive.weight 0` trains without it"),
    ({"arch": "bert4rec", "objective": {"loss": "sampled"}, "optimizer": ROWWISE},
     "`model.optimizer.item_optimizer: rowwise_adagrad` does not work with arch bert4rec"),
    ({"arch": "bert4rec", **FEATURES}, "item features are not offered with arch bert4rec"),
    ({"arch": "bert4rec", "mixing": {"attention": "linear"}},
     "`model.mixing.attention: linear` is causal attention for sasrec; use `attention: full` with arch bert4rec"),
    ({"arch": "bert4rec", "mixing": {"lowpass_alpha": 0.5}},
     "`model.mixing.lowpass_alpha` is a causal filter of the sasrec transformer; set it to 0 for arch bert4rec"),
    ({"arch": "gru", "mixing": {"attention": "window"}},
     "`model.mixing.attention: window` is causal attention for sasrec; use `attention: full` with arch gru"),
    ({"arch": "gru", "mixing": {"lowpass_alpha": 0.5}}, "set it to 0 for arch gru"),
    ({"arch": "gru", "block": {"residual": "gated"}},
     "`model.block.residual: gated` gates the transformer blocks' residuals; arch gru has none: set it to plain"),
    ({"num_items": 0}, "`num_items` must be >= 1, got 0"),
    ({"num_features": 3}, "`num_features` (3) and `features_per_item` (0) must both be 0"),
    ({"items": {"id_dropout": 0.3}}, "`model.items.id_dropout` needs item features (`data.item_features`)"),
    ({"items": {"tied": False}, **FEATURES}, "item features need `model.items.tied: true`"),
    ({"objective": {"los": "full"}}, "`model.objective` has no key 'los'; its keys are loss, label_smoothing, "),
    ({"speed": {"compile": "fast"}}, "compile` must be null (off) or one of "),
    ({"speed": {"compile_backend": "no_such_backend"}}, "compile_backend` must be one of "),
    ({"mixing": "window"}, "`model.mixing` must be a mapping of its keys, got 'window'"),
]


@pytest.mark.parametrize(("arguments", "message"), REFUSALS, ids=lambda v: v if isinstance(v, str) else None)
def test_each_refusal_is_one_line_naming_the_key(arguments, message):
    arguments = {"num_items": 9, **SMALL, **arguments}
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        StreamRecModule(**arguments)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("group", "values"), [
    (BlockOptions, {"residual": "highway"}), (MixingOptions, {"window": 0}), (ItemOptions, {"init_std": -1.0}),
    (ObjectiveOptions, {"loss": "softmax"}), (ContrastiveOptions, {"temperature": 0.0}),
    (OptimizerOptions, {"item_lr": 0.0}), (EvalOptions, {"ks": ()}), (SpeedOptions, {"compile": "fast"}),
])
def test_a_group_refuses_a_bad_value_when_it_is_built(group, values):
    """The same rules hold for a group built in Python, before any module: nothing is built from a bad value."""
    with pytest.raises(ValueError, match="must be"):
        group(**values)


def test_the_bad_compile_values_name_the_grouped_key():
    """`--model.speed.compile` is where a user sets it; the message must say so."""
    with pytest.raises(ValueError, match=re.escape("`model.speed.compile` must be")):
        SpeedOptions(compile="fast")
    with pytest.raises(ValueError, match=re.escape("`model.speed.compile_backend` must be")):
        SpeedOptions(compile_backend="no_such_backend")


def test_groups_are_frozen_and_round_trip_through_plain_dicts():
    objective = ObjectiveOptions(loss="sampled", num_negatives=8)
    with pytest.raises(AttributeError):
        objective.loss = "full"  # type: ignore[misc]
    for group in (BlockOptions(residual="gated"), MixingOptions(attention="window", window=16), ItemOptions(tied=False),
                  objective, ContrastiveOptions(weight=0.1), OptimizerOptions(item_lr=0.5),
                  EvalOptions(ks=[5]), SpeedOptions(cpu_fastpath=True)):
        plain = group.as_dict()
        assert all(isinstance(v, int | float | str | bool | list | type(None)) for v in plain.values()), plain
        cls = type(group)
        assert cls.of(plain) == group and cls.of(group) is group and cls.of(None) == cls()
    assert EvalOptions(ks=[5, 10]).ks == (5, 10)  # a list from YAML or a checkpoint becomes the tuple


def test_the_full_softmax_terms_are_read_from_groups_or_mappings():
    assert full_softmax_terms({}) == []
    hparams = {"objective": {"label_smoothing": 0.1, "rdrop_alpha": 0.0}, "contrastive": ContrastiveOptions(weight=1.0)}
    assert full_softmax_terms(hparams) == ["objective.label_smoothing", "contrastive.weight"]


def test_check_training_holds_the_rules_across_groups_alone():
    """Called without a module: the rules that no single group can check."""
    sampled = ObjectiveOptions(loss="sampled")
    check_training(sampled, ContrastiveOptions(), OptimizerOptions(**ROWWISE), num_features=0)  # allowed
    check_training(ObjectiveOptions(rdrop_alpha=1.0), ContrastiveOptions(weight=0.1), OptimizerOptions(), 0)
    with pytest.raises(ValueError, match="needs a sampled loss"):
        check_training(ObjectiveOptions(), ContrastiveOptions(), OptimizerOptions(**ROWWISE), num_features=0)
    with pytest.raises(ValueError, match="does not work with item features"):
        check_training(sampled, ContrastiveOptions(), OptimizerOptions(**ROWWISE), num_features=3)
    with pytest.raises(ValueError, match=r"`model.contrastive.weight` needs `model.objective.loss: full`"):
        check_training(sampled, ContrastiveOptions(weight=0.1), OptimizerOptions(), num_features=0)
