"""core.nn.compile: the `model.compile` values, the one-line refusals, and the static lengths for CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.nn.compile import COMPILE_MODES, bucket_length, check_backend, compile_in_place, compile_mode, pad_to_bucket


@pytest.mark.parametrize(("value", "mode"), [(None, None), (False, None), (True, "default"),
                                             *((m, m) for m in COMPILE_MODES)])
def test_compile_values_name_a_mode_or_off(value, mode):
    assert compile_mode(value) == mode


@pytest.mark.parametrize(("call", "key"), [(lambda: compile_mode("fast"), "`model.compile`"),
                                           (lambda: check_backend("no_such_backend"), "`model.compile_backend`")])
def test_a_bad_value_is_one_line_naming_the_key_and_the_choices(call, key):
    with pytest.raises(ValueError) as err:
        call()
    message = str(err.value)
    assert message.startswith(key) and "\n" not in message
    assert ("reduce-overhead" in message) if key == "`model.compile`" else ("aot_eager" in message)


@pytest.mark.parametrize(("length", "limit", "want"), [(1, 50, 16), (16, 50, 16), (17, 50, 32), (49, 50, 50),
                                                        (50, 50, 50), (60, 50, 60)])
def test_bucket_lengths_are_multiples_of_16_up_to_the_limit(length, limit, want):
    assert bucket_length(length, limit) == want


def test_pad_to_bucket_appends_the_value_on_the_right():
    x = torch.tensor([[5, 6, 7], [8, 0, 0]])
    got = pad_to_bucket(x, limit=5, value=0, multiple=4)
    assert torch.equal(got, torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]]))
    assert pad_to_bucket(got, limit=5, value=0, multiple=4) is got  # already a bucket length: no copy


def test_compiling_in_place_keeps_the_state_dict_keys_and_the_outputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    keys, x = list(model.state_dict()), torch.randn(3, 4)
    want = model(x)
    compile_in_place([model[0], model[2]], "default", backend="eager")
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(x), want)
