"""`regroup`, the one mover of old flat hyper-parameter names into their option groups (both apps' loaders)."""

from __future__ import annotations

import pytest

from core.nn.options import regroup

MOVED = {"lr_floor": ("optimizer", "lr_floor"), "attention": ("rnn", "score")}


def test_flat_names_move_into_their_groups_and_the_rest_stays() -> None:
    old = {"lr": 1e-3, "lr_floor": 0.1, "attention": "dot", "optimizer": {"betas": [0.9, 0.98]}}
    assert regroup(old, MOVED) == {"lr": 1e-3, "optimizer": {"betas": [0.9, 0.98], "lr_floor": 0.1},
                                   "rnn": {"score": "dot"}}
    assert regroup(regroup(old, MOVED), MOVED) == regroup(old, MOVED)  # today's layout passes through


@pytest.mark.parametrize(("hparams", "wrong"), [({"lr_floor": 0.1, "optimizer": {"lr_floor": 0.2}}, "given twice"),
                                                ({"lr_floor": 0.1, "optimizer": 3}, "must be a mapping")])
def test_a_setting_given_twice_or_a_group_that_is_no_mapping_is_refused(hparams, wrong) -> None:
    with pytest.raises(ValueError, match=wrong):
        regroup(hparams, MOVED)
