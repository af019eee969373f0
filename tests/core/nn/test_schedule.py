"""`core.nn.schedule` factors and LR schedulers against values computed by hand."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from core.nn.schedule import InverseSqrt, InverseSqrtLR, WarmupCosine, WarmupCosineLR, stops_on_time

PEAK = 0.5


def warmup_cosine_by_hand(step: int, warmup: int = 10, total: int = 110, floor: float = 0.1) -> float:
    if step < warmup:
        return step / warmup
    if step >= total:
        return floor
    progress = (step - warmup) / (total - warmup)
    return floor + (1 - floor) * (1 + math.cos(math.pi * progress)) / 2


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, 0.0),
        (5, 0.5),  # half-way through warmup
        (10, 1.0),  # peak
        (60, 0.55),  # half-way through the decay: 0.1 + 0.9 * 0.5
        (110, 0.1),  # floor reached
        (111, 0.1),
        (1000, 0.1),
    ],
)
def test_warmup_cosine_hand_values(step: int, expected: float) -> None:
    assert WarmupCosine(warmup_steps=10, total_steps=110, floor=0.1)(step) == pytest.approx(expected, abs=1e-12)


def test_warmup_cosine_whole_curve() -> None:
    f = WarmupCosine(warmup_steps=10, total_steps=110, floor=0.1)
    for step in range(0, 130):
        assert f(step) == pytest.approx(warmup_cosine_by_hand(step), abs=1e-12)
    # Quarter of the decay: cos(pi/4) = sqrt(2)/2.
    assert f(35) == pytest.approx(0.1 + 0.9 * (1 + math.sqrt(2) / 2) / 2, abs=1e-12)


def test_warmup_cosine_without_warmup_or_decay() -> None:
    assert WarmupCosine(0, 10)(0) == pytest.approx(1.0)
    assert WarmupCosine(0, 10)(10) == pytest.approx(0.0)
    f = WarmupCosine(10, 10, floor=0.2)  # no decay phase: straight to the floor after warmup
    assert f(5) == pytest.approx(0.5)
    assert f(10) == pytest.approx(0.2)


def test_warmup_cosine_lr_drives_the_optimizer() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    sched = WarmupCosineLR(opt, warmup_steps=10, total_steps=110, floor=0.1)
    for step in range(130):
        assert opt.param_groups[0]["lr"] == pytest.approx(PEAK * warmup_cosine_by_hand(step), abs=1e-12)
        opt.step()
        sched.step()


def _fresh(lr: float = PEAK) -> tuple[torch.optim.Optimizer, WarmupCosineLR]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    return opt, WarmupCosineLR(opt, warmup_steps=10, total_steps=110, floor=0.1)


def test_warmup_cosine_lr_state_dict_round_trip_continues_identically() -> None:
    opt, sched = _fresh()
    for _ in range(37):
        opt.step()
        sched.step()
    # A resumed run builds its scheduler with other arguments; the state restores the curve.
    state = pickle.loads(pickle.dumps(sched.state_dict()))
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    sched2 = WarmupCosineLR(opt2, warmup_steps=3, total_steps=5, floor=0.0)
    sched2.load_state_dict(state)
    opt2.load_state_dict(opt.state_dict())
    for step in range(37, 130):
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
        assert opt2.param_groups[0]["lr"] == pytest.approx(PEAK * warmup_cosine_by_hand(step), abs=1e-12)
        for o, s in ((opt, sched), (opt2, sched2)):
            o.step()
            s.step()


@pytest.mark.parametrize("step, expected", [(0, 0.0), (2, 0.5), (4, 1.0), (16, 0.5), (64, 0.25), (100, 0.2)])
def test_inverse_sqrt_hand_values(step: int, expected: float) -> None:
    assert InverseSqrt(warmup_steps=4)(step) == pytest.approx(expected, abs=1e-12)


def test_inverse_sqrt_lr_drives_the_optimizer() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    sched = InverseSqrtLR(opt, warmup_steps=4)
    for step in range(30):
        expected = step / 4 if step < 4 else math.sqrt(4 / step)
        assert opt.param_groups[0]["lr"] == pytest.approx(PEAK * expected, abs=1e-12)
        opt.step()
        sched.step()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"warmup_steps": -1, "total_steps": 10}, "`warmup_steps`"),
        ({"warmup_steps": 0, "total_steps": 0}, "`total_steps`"),
        ({"warmup_steps": 20, "total_steps": 10}, "`warmup_steps` \\(20\\) exceeds `total_steps` \\(10\\)"),
        ({"warmup_steps": 1, "total_steps": 10, "floor": 1.5}, "`floor`"),
        ({"warmup_steps": 1, "total_steps": 10, "floor": -0.1}, "`floor`"),
    ],
)
def test_warmup_cosine_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        WarmupCosine(**kwargs)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    with pytest.raises(ValueError, match=match):
        WarmupCosineLR(opt, **kwargs)


@pytest.mark.parametrize("warmup_steps", [0, -3])
def test_inverse_sqrt_bad_arguments(warmup_steps: int) -> None:
    with pytest.raises(ValueError, match="`warmup_steps`"):
        InverseSqrt(warmup_steps)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    with pytest.raises(ValueError, match="`warmup_steps`"):
        InverseSqrtLR(opt, warmup_steps)


def test_for_run_spans_the_whole_run() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupCosineLR.for_run(opt, warmup_steps=10, run_steps=110.0, floor=0.1)
    factors = [sched.lr_lambdas[0](step) for step in (0, 5, 10, 60, 110)]
    # hand values: linear warmup to 1, cosine to the floor at the run's end, half-way at step 60
    assert factors == pytest.approx([0.0, 0.5, 1.0, 0.1 + 0.9 * 0.5, 0.1])


def test_for_run_shorter_than_warmup_keeps_the_warmup() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupCosineLR.for_run(opt, warmup_steps=100, run_steps=3.0)
    assert sched.lr_lambdas[0](3) == pytest.approx(0.03)


def test_for_run_refuses_an_unbounded_run() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r"trainer\.max_epochs / trainer\.max_steps: .* needs a finite run"):
        WarmupCosineLR.for_run(opt, warmup_steps=10, run_steps=math.inf)


def test_stops_on_time_finds_lightnings_timer_only_when_it_has_a_duration() -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint, Timer

    assert stops_on_time([ModelCheckpoint(), Timer(duration="00:00:10:00")])
    assert not stops_on_time([ModelCheckpoint(), Timer(duration=None)])
    assert not stops_on_time([])


def test_for_run_warns_when_a_clock_may_stop_the_run_mid_cosine() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    expected = r"trainer\.max_time: .* \(110 steps\), .*; set max_epochs to what fits the time, or X$"
    with pytest.warns(UserWarning, match=expected):
        WarmupCosineLR.for_run(opt, warmup_steps=10, run_steps=110.0, clock_limited=True, advice=", or X")
