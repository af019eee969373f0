"""core.runtime.cli: config mistakes end in one line naming the key and the file (or FILE:LINE:COLUMN)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from jsonargparse import ActionConfigFile

from core.runtime.cli import OneLineErrorParser, check_yaml_syntax, config_files, file_setting, overwrite_refusal


def test_config_files_are_found_in_every_spelling_in_order() -> None:
    argv = ["fit", "--config", "a.yaml", "--model.lr", "1", "-c", "b.yaml", "--config=c.yaml"]
    assert config_files(argv) == ["a.yaml", "b.yaml", "c.yaml"]


def test_yaml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  d_model: 64\n  lr: [0.1\ndata: {}\n")  # the list opened on line 3 never closes
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:4:\d+: not valid YAML: ") as err:
        check_yaml_syntax([str(tmp_path / "missing.yaml"), str(path)])  # a missing file is left to the CLI
    assert "\n" not in str(err.value)
    check_yaml_syntax([])  # nothing to check


def test_file_setting_is_the_last_file_that_sets_the_key(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("model:\n  d_modle: 1\n")
    b.write_text("model:\n  d_modle: 2\n  lr: 0.1\n")
    assert file_setting([str(a), str(b)], "model.d_modle") == str(b)
    assert file_setting([str(a), str(b)], "model.lr") == str(b)
    assert file_setting([str(a)], "model.lr") is None
    assert file_setting([str(a)], "model.d_modle.x") is None  # a value is not a section


def _parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(prog="python -m app")
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--model.d_model", type=int, default=8)
    return parser


@pytest.mark.parametrize("where", ["file", "command line"])
def test_a_rejected_value_is_one_line_naming_key_and_origin(where, tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "my.yaml"
    cfg.write_text("model:\n  d_model: abc\n" if where == "file" else "model:\n  d_model: 4\n")
    argv = ["--config", str(cfg)] + (["--model.d_model", "xyz"] if where == "command line" else [])
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "model.d_model" in err
    assert ("(set in " + str(cfg) + ")" if where == "file" else "(given on the command line)") in err
    assert "`python -m app --help` lists the accepted keys" in err


def test_an_unknown_key_in_a_file_names_the_file(tmp_path: Path, capsys) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("model:\n  d_model: 4\n")
    bad.write_text("model:\n  d_modle: 4\n")
    argv = ["--config", str(good), "--config", str(bad)]
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d_modle" in err and f"(set in {bad})" in err


def test_a_fit_into_a_folder_with_checkpoints_is_refused_unless_it_resumes_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs" / "one"
    ckpts, recent = root / "checkpoints", root / "checkpoints" / "recent"
    assert overwrite_refusal([ckpts, recent], root, None) is None  # a new run folder
    recent.mkdir(parents=True)
    (ckpts / ".best.ckpt.12.tmp").write_bytes(b"")  # a killed save's temporary is no checkpoint
    assert overwrite_refusal([ckpts, recent], root, None) is None
    for name in ("best.ckpt", "last.ckpt"):
        (ckpts / name).write_bytes(b"x")
    assert overwrite_refusal([ckpts, recent], root, None) == (
        "runs/one/checkpoints already holds best.ckpt, last.ckpt from an earlier fit; to keep them, fit into another "
        "folder with --trainer.default_root_dir NEW_FOLDER, resume it with --ckpt_path runs/one/checkpoints/last.ckpt, "
        "or pass --overwrite to replace them")
    for resume in (str(ckpts / "last.ckpt"), "runs/one/checkpoints/best.ckpt", "runs/one/other.ckpt", "last"):
        assert overwrite_refusal([ckpts, recent], root, resume) is None, resume
    # a checkpoint from elsewhere starts a new run in this folder: still refused
    assert "already holds" in overwrite_refusal([ckpts], root, str(tmp_path / "elsewhere" / "best.ckpt"))
    (ckpts / "last.ckpt").unlink()
    assert "resume it" not in overwrite_refusal([ckpts], root, None)
