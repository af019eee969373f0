"""`--threads` (YAML `threads:`) in both apps' LightningCLI programs: it sets torch's thread count before any
work, and a wrong value is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamrec.lightning_cli import build_cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def threads_kept():
    before = torch.get_num_threads()
    torch.set_num_threads(3 if before != 3 else 2)  # not what the tests ask for
    yield
    torch.set_num_threads(before)


def test_the_flag_and_the_yaml_key_set_torch_threads(tiny_log, tmp_path, monkeypatch, threads_kept) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["--config", str(REPO / "configs/streamrec/demo.yaml"), "--data.path", str(tiny_log),
            "--trainer.logger", "false"]
    build_cli([*base, "--threads", "1"], run=False)
    assert torch.get_num_threads() == 1
    (tmp_path / "two.yaml").write_text("threads: 2\n")
    build_cli([*base, "--config", "two.yaml"], run=False)
    assert torch.get_num_threads() == 2


def test_zero_threads_is_one_line(tiny_log, tmp_path, monkeypatch, exit_line, threads_kept) -> None:
    from streamrec.cli import main

    monkeypatch.chdir(tmp_path)
    line = exit_line(main, ["fit", "--config", str(REPO / "configs/streamrec/demo.yaml"), "--data.path",
                            str(tiny_log), "--threads", "0"])
    assert "`--threads` must be a whole number >= 1" in line


def test_translate_takes_the_same_flag(tmp_path, monkeypatch, exit_line) -> None:
    from translate.cli import main

    monkeypatch.chdir(tmp_path)
    line = exit_line(main, ["fit", "--config", str(REPO / "configs/translate/demo.yaml"), "--threads", "-1"])
    assert "`--threads` must be a whole number >= 1" in line
