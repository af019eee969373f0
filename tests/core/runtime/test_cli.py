"""core.runtime.cli: config mistakes end in one line naming the key and the file (or FILE:LINE:COLUMN)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from jsonargparse import ActionConfigFile

from core.runtime.cli import (
    OneLineErrorParser,
    config_chain,
    config_files,
    file_setting,
    overwrite_refusal,
    with_bases,
)
from translate.cli import main as translate_main  # either app: AppCLI builds the parsers


def test_config_files_are_found_in_every_spelling_in_order() -> None:
    argv = ["fit", "--config", "a.yaml", "--model.lr", "1", "-c", "b.yaml", "--config=c.yaml"]
    assert config_files(argv) == ["a.yaml", "b.yaml", "c.yaml"]


def test_yaml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  d_model: 64\n  lr: [0.1\ndata: {}\n")  # the list opened on line 3 never closes
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:4:\d+: not valid YAML: ") as err:
        with_bases(["--config", str(tmp_path / "missing.yaml"), "--config", str(path)])  # missing: jsonargparse's
    assert "\n" not in str(err.value)


def test_file_setting_is_the_last_file_that_sets_the_key(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("model:\n  d_modle: 1\n")
    b.write_text("model:\n  d_modle: 2\n  lr: 0.1\n")
    assert file_setting([str(a), str(b)], "model.d_modle") == str(b)
    assert file_setting([str(a), str(b)], "model.lr") == str(b)
    assert file_setting([str(a)], "model.lr") is None
    assert file_setting([str(a)], "model.d_modle.x") is None  # a value is not a section


def test_each_config_file_comes_after_its_bases_each_relative_to_the_file_naming_it(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "root.yaml").write_text("model:\n  d_model: 1\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "base.yaml").write_text("base: ../shared/root.yaml\n")
    (tmp_path / "app" / "data.yaml").write_text("model:\n  d_model: 2\nbase: base.yaml\n")  # anywhere in the file
    data, base, root = str(tmp_path / "app" / "data.yaml"), str(tmp_path / "app" / "base.yaml"), str(
        tmp_path / "shared" / "root.yaml")
    assert config_chain(data) == [root, base, data]
    assert config_chain(root) == [root] and config_chain("no_such.yaml") == ["no_such.yaml"]  # jsonargparse names it
    assert with_bases(["fit", "-c", data, f"--config={base}", "--model.lr", "1"]) == [
        "fit", "--config", root, "--config", base, "-c", data, "--config", root, f"--config={base}", "--model.lr", "1"]


@pytest.mark.parametrize(("base", "wrong"), [("missing.yaml", "no such file"), ("b.yaml", "comes back to a file"),
                                             ("''", "must name a YAML file"), ("[b.yaml]", "must name a YAML file")])
def test_a_wrong_base_is_one_line_naming_the_file_and_key(base: str, wrong: str, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(f"base: {base}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path))}/[ab]\.yaml: `base") as err:  # b: the cycle
        config_chain(str(tmp_path / "a.yaml"))
    assert wrong in str(err.value) and "\n" not in str(err.value)


def _parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(prog="python -m app")
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--base", type=str | None)
    parser.add_argument("--model.d_model", type=int, default=8)
    return parser


def test_a_data_set_changes_only_what_it_sets_and_a_bad_key_in_its_base_names_the_base(tmp_path: Path, capsys) -> None:
    base, data = tmp_path / "base.yaml", tmp_path / "data.yaml"
    base.write_text("model:\n  d_model: 4\n")
    data.write_text("base: base.yaml\n")
    cfg = _parser().parse_args(["--config", str(data)])
    assert cfg.model.d_model == 4 and "base" not in yaml.safe_load(_parser().dump(cfg))
    base.write_text("model:\n  d_modle: 4\n")
    with pytest.raises(SystemExit):
        _parser().parse_args(["--config", str(data)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d_modle" in err and f"(set in {base})" in err


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


def test_the_metrics_table_puts_the_baseline_beside_the_model_with_4_decimals() -> None:
    from core.runtime.cli import metrics_table

    table = metrics_table({"test_hr@10": 0.123456789, "test_mostpop_hr@10": 0.05, "test_ndcg@10": 0.0612345,
                           "test_mostpop_ndcg@10": 0.0251}, "mostpop", "most popular")
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "model", "most", "popular"] and set(lines[1]) == {"-"}
    assert lines[2].split() == ["test_hr@10", "0.1235", "0.0500"]
    assert lines[3].split() == ["test_ndcg@10", "0.0612", "0.0251"]
    assert len(lines) == 4  # no separate rows for the baseline
    assert metrics_table({"test_bleu": 34.56789}).splitlines()[2].split() == ["test_bleu", "34.5679"]


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test", "predict"])
def test_each_subcommand_parses_alone_and_the_others_are_listed_when_none_is_named(subcommand, capsys) -> None:
    with pytest.raises(SystemExit):
        translate_main([subcommand, "--help"])
    shown = capsys.readouterr().out
    assert shown.startswith(f"usage: python -m translate [options] {subcommand}") and "--trainer" in shown
    for argv in (["--help"], [f"{subcommand}x"]):
        with pytest.raises(SystemExit):
            translate_main(argv)
        out, err = capsys.readouterr()
        assert all(f"{name}" in out + err for name in ("fit", "validate", "test", "predict"))
