"""core.runtime.summary: the model summary leaves out the FLOPs column and total when no FLOPs were counted; and
`--trainer.max_time` stops training at the first step past the limit."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary, Timer
from lightning.pytorch.callbacks import timer as timer_module
from lightning.pytorch.utilities.model_summary import summarize

from core.runtime.summary import PlainSummary, RichSummary, flops_counted, hook_matches, summary_callback
from streamrec.cli import main

REPO = Path(__file__).resolve().parents[3]


class Tiny(LightningModule):
    def __init__(self, example: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.example_input_array = torch.zeros(1, 4) if example else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def _totals(module: LightningModule) -> tuple:
    summary = summarize(module, max_depth=1)
    return (summary._get_summary_data(), summary.total_parameters, summary.trainable_parameters, summary.model_size,
            summary.total_training_modes, summary.total_flops)


def test_lightnings_summarize_hooks_take_our_arguments_and_have_a_flops_column() -> None:
    """Our `summarize` hooks rely on Lightning's: where these fail, the installed Lightning changed them."""
    assert hook_matches()
    data, *_ = _totals(Tiny(example=False))
    assert "FLOPs" in dict(data)


@pytest.mark.parametrize("example", [False, True], ids=["uncounted", "counted"])
def test_the_plain_summary_shows_flops_only_when_counted(example: bool, caplog) -> None:
    totals = _totals(Tiny(example))
    assert flops_counted(totals[0], totals[-1]) is example
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.callbacks.model_summary"):
        PlainSummary.summarize(*totals)
    assert "Total params" in caplog.text and "layer" in caplog.text
    assert ("FLOPs" in caplog.text and "Total Flops" in caplog.text) is example
    assert ("flops" in caplog.text.lower()) is example


@pytest.mark.parametrize("example", [False, True], ids=["uncounted", "counted"])
def test_the_rich_summary_shows_flops_only_when_counted(example: bool, capsys) -> None:
    RichSummary.summarize(*_totals(Tiny(example)))
    out = capsys.readouterr().out
    assert "Total params" in out and "layer" in out and "Linear" in out
    assert ("FLOPs" in out and "Total FLOPs" in out) is example


def test_lightnings_summary_callbacks_become_ours_with_their_depth_and_a_users_own_stays() -> None:
    rich, plain = summary_callback(RichModelSummary(max_depth=3)), summary_callback(ModelSummary(max_depth=2))
    assert type(rich) is RichSummary and rich._max_depth == 3
    assert type(plain) is PlainSummary and plain._max_depth == 2

    class Own(ModelSummary):
        pass

    own, timer = Own(), Timer()
    assert summary_callback(own) is own and summary_callback(timer) is timer


def _fit(tiny_log: Path, *extra: str):
    """A tiny StreamRec fit from the command line: both apps' CLIs are `AppCLI`s."""
    return main(["fit", "--config", str(REPO / "configs" / "streamrec" / "demo.yaml"), "--data.path", str(tiny_log),
                 "--data.max_len", "8", "--model.d_model", "16", "--model.n_heads", "2", "--model.n_layers", "1",
                 "--model.d_ff", "32", "--trainer.enable_progress_bar", "false", "--trainer.precision", "32-true",
                 "--trainer.accelerator", "cpu", "--trainer.devices", "1", *extra])


def test_a_fit_stops_at_the_first_step_past_max_time_and_its_summary_has_no_flops(tiny_log: Path, tmp_path: Path,
                                                                                  monkeypatch, capfd) -> None:
    """With a fake clock on which each training step takes 1 s: a 3 s limit ends the fit after step 3, mid-epoch
    (Lightning's Timer checks after every step, not only at epoch ends). The same fit prints its summary."""
    clock = [0.0]
    monkeypatch.setattr(timer_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    check = Timer.on_train_batch_end

    def step_of_one_second(self, trainer, *args, **kwargs):
        clock[0] += 1
        check(self, trainer, *args, **kwargs)

    monkeypatch.setattr(Timer, "on_train_batch_end", step_of_one_second)
    monkeypatch.chdir(tmp_path)
    cli = _fit(tiny_log, "--trainer.max_time", "00:00:00:03", "--trainer.max_epochs", "100", "--data.batch_size", "8",
               "--early_stopping", "0")
    out, err = capfd.readouterr()
    assert "Total params" in out + err
    assert "flops" not in (out + err).lower()
    assert [type(cb) for cb in cli.trainer.callbacks if isinstance(cb, ModelSummary)] == [RichSummary]
    timers = [cb for cb in cli.trainer.callbacks if isinstance(cb, Timer)]
    assert len(timers) == 1 and timers[0]._interval == "step"
    assert cli.trainer.global_step == 3
    assert cli.trainer.num_training_batches > 3  # so it stopped inside the first epoch
