"""Learning-rate schedules as `LambdaLR` subclasses, so YAML can name them directly:

    lr_scheduler:
      class_path: core.nn.schedule.WarmupCosineLR
      init_args: {warmup_steps: 200, total_steps: 2500, floor: 0.1}

They step once per optimizer step (Lightning: `"interval": "step"`). The factor functions are picklable classes, not
lambdas, so `state_dict` saves them and a resumed run continues the same curve."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


@dataclass
class WarmupCosine:
    """LR factor: linear warmup 0 -> 1, then cosine decay 1 -> floor, then floor.

    Args:
        warmup_steps: steps of linear warmup (factor = step / warmup_steps).
        total_steps: step at which the decay reaches the floor.
        floor: final factor, a fraction of the peak learning rate."""

    warmup_steps: int
    total_steps: int
    floor: float = 0.0

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.total_steps <= 0:
            raise ValueError(f"`warmup_steps` ({self.warmup_steps}) must be >= 0 and "
                             f"`total_steps` ({self.total_steps}) > 0")
        if self.warmup_steps > self.total_steps:
            raise ValueError(f"`warmup_steps` ({self.warmup_steps}) exceeds `total_steps` ({self.total_steps})")
        if not 0.0 <= self.floor <= 1.0:
            raise ValueError(f"`floor` must be a fraction of the peak in [0, 1], got {self.floor}")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        decay_steps = self.total_steps - self.warmup_steps
        progress = 1.0 if decay_steps == 0 else min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class InverseSqrt:
    """LR factor: linear warmup to 1, then sqrt(warmup_steps / step) (Vaswani et al., 2017).

    Args:
        warmup_steps: steps of linear warmup (> 0)."""

    warmup_steps: int

    def __post_init__(self) -> None:
        if self.warmup_steps <= 0:
            raise ValueError(f"`warmup_steps` must be > 0, got {self.warmup_steps}")

    def __call__(self, step: int) -> float:
        return step / self.warmup_steps if step < self.warmup_steps else math.sqrt(self.warmup_steps / step)


class WarmupCosineLR(LambdaLR):
    """Linear warmup then cosine decay to `floor` x peak LR.

    Args:
        optimizer: the optimizer whose LR is scaled (injected by LightningCLI).
        warmup_steps: optimizer steps of linear warmup.
        total_steps: optimizer steps until the floor is reached (e.g. epochs x batches).
        floor: final LR as a fraction of the peak."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, *, total_steps: int, floor: float = 0.0):
        super().__init__(optimizer, WarmupCosine(warmup_steps, total_steps, floor))

    @classmethod
    def for_run(cls, optimizer: Optimizer, warmup_steps: int, *, run_steps: float, floor: float = 0.0,
                clock_limited: bool = False, advice: str = "") -> WarmupCosineLR:
        """The schedule over a whole training run, e.g. Lightning's `trainer.estimated_stepping_batches`. A run shorter
        than the warmup keeps the full warmup. An unbounded run (`max_epochs: -1` without `max_steps`) is refused: a
        cosine needs an end. A run a clock may stop (`clock_limited`, e.g. `stops_on_time(trainer.callbacks)`) gets a
        warning, ended by `advice`: the cosine still spans `run_steps`, so the run can end at a high learning rate."""
        if not math.isfinite(run_steps):
            raise ValueError("trainer.max_epochs / trainer.max_steps: the warmup-cosine schedule needs a finite run; "
                             "set one of them (early stopping can still end the run sooner)")
        if clock_limited:
            warnings.warn(f"trainer.max_time: the warmup-cosine schedule spans trainer.max_epochs / max_steps "
                          f"({int(run_steps)} steps), so a run the clock stops first ends before its learning rate "
                          f"has decayed; set max_epochs to what fits the time{advice}", stacklevel=2)
        return cls(optimizer, warmup_steps, total_steps=max(int(run_steps), warmup_steps, 1), floor=floor)


class InverseSqrtLR(LambdaLR):
    """Linear warmup then inverse-square-root decay.

    Args:
        optimizer: the optimizer whose LR is scaled.
        warmup_steps: optimizer steps of linear warmup."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int):
        super().__init__(optimizer, InverseSqrt(warmup_steps))


def stops_on_time(callbacks: Iterable[Any]) -> bool:
    """Whether a callback may stop the run on the clock (Lightning's `Timer`, added by `trainer.max_time`); read by
    attribute, so `core` needs no Lightning import."""
    return any(callable(getattr(cb, "time_remaining", None)) and cb.time_remaining() is not None for cb in callbacks)
