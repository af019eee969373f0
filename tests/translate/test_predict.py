"""`python -m translate predict`: the text it writes equals `translate.infer`'s, on one process and under DDP."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from translate import infer
from translate.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "translate" / "predict_demo.yaml"


@pytest.fixture(scope="module")
def trained(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("predict_ckpt")
    ckpt, _ = train_tiny_checkpoint(demo_dir, out)
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:9]
    source = out / "in.en"  # blank lines too: each gives an empty output line
    source.write_text("".join(line + "\n" for line in [lines[0], "", *lines[1:8], "  ", lines[8]]), encoding="utf-8")
    return SimpleNamespace(ckpt=ckpt, spm=out / "spm", source=source)


def _predict(trained, demo_dir, output, *extra):
    main(["predict", "--config", str(CONFIG), *(f"--data.{s}={demo_dir / s}" for s in ("train", "val", "test")),
          "--data.max_len", "32", "--data.max_tokens", "512", "--data.cache_dir", str(trained.spm),
          "--ckpt_path", str(trained.ckpt), "--trainer.callbacks.output", str(output),
          "--trainer.enable_progress_bar", "false", "--trainer.accelerator", "cpu", *extra])


def _infer(trained, source, output, beam):
    infer.main(["--ckpt", str(trained.ckpt), "-i", str(source), "-o", str(output), "--beam-size", str(beam)])
    return output.read_text(encoding="utf-8")


def test_predict_writes_what_the_inference_script_writes(trained, demo_dir, tmp_path, monkeypatch):
    """The checkpoint's test_beam_size (5) decodes, as `infer --beam-size 5`; blank lines stay blank lines."""
    monkeypatch.chdir(tmp_path)
    _predict(trained, demo_dir, tmp_path / "out.de", f"--data.predict={trained.source}", "--trainer.devices", "1")
    got = (tmp_path / "out.de").read_text(encoding="utf-8")
    assert got == _infer(trained, trained.source, tmp_path / "infer.de", 5)
    assert [line == "" for line in got.split("\n")[:-1]] == [
        not line.strip() for line in trained.source.read_text(encoding="utf-8").split("\n")[:-1]]
    assert sorted(p.name for p in tmp_path.glob("out.de*")) == ["out.de"]  # no part, lock or temporary left


@pytest.mark.slow
def test_ddp_predict_merges_the_ranks_parts_in_input_order(trained, demo_dir, tmp_path, monkeypatch):
    """Two ranks (ddp_fork: ddp_spawn without importing torch again; `ddp` would relaunch pytest): each writes its
    part, rank 0 merges, repeats written once."""
    monkeypatch.chdir(tmp_path)
    _predict(trained, demo_dir, tmp_path / "ddp.de", f"--data.predict={trained.source}", "--trainer.devices", "2",
             "--trainer.strategy", "ddp_fork")
    assert (tmp_path / "ddp.de").read_text(encoding="utf-8") == _infer(trained, trained.source,
                                                                       tmp_path / "infer.de", 5)
    assert sorted(p.name for p in tmp_path.glob("ddp.de*")) == ["ddp.de"]


def test_unmerged_part_and_the_test_split_by_default(trained, demo_dir, tmp_path, monkeypatch):
    """Without `data.predict` the test split's source side is translated; `merge: false` keeps the JSON part."""
    monkeypatch.chdir(tmp_path)
    _predict(trained, demo_dir, tmp_path / "out.de", "--data.predict=null", "--trainer.devices", "1",
             "--trainer.callbacks.merge", "false")
    assert not (tmp_path / "out.de").exists()
    pairs = [json.loads(line) for line in (tmp_path / "out.de.rank0.jsonl").read_text(encoding="utf-8").splitlines()]
    want = _infer(trained, demo_dir / "test.en", tmp_path / "infer.de", 5).split("\n")[:-1]
    assert sorted(i for i, _ in pairs) == list(range(len(want)))
    assert [text for _, text in sorted(pairs)] == want


def test_missing_output_folder_is_one_line(exit_line, trained, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = exit_line(lambda argv: _predict(trained, demo_dir, *argv), [tmp_path / "nope" / "out.de"])
    assert "the folder" in message and "nope" in message and "does not exist" in message


def test_predict_needs_only_the_checkpoint_and_the_sentences(trained, tmp_path, monkeypatch):
    """`python -m translate predict --config predict_demo.yaml --data.predict FILE --ckpt_path CKPT`: no training
    text; the vocabularies and max_len come from the checkpoint, and the text is `infer`'s."""
    monkeypatch.chdir(tmp_path)
    main(["predict", "--config", str(CONFIG), f"--data.predict={trained.source}", "--ckpt_path", str(trained.ckpt),
          "--trainer.callbacks.output", str(tmp_path / "out.de"), "--trainer.enable_progress_bar", "false",
          "--trainer.accelerator", "cpu", "--trainer.devices", "1"])
    assert (tmp_path / "out.de").read_text(encoding="utf-8") == _infer(trained, trained.source,
                                                                      tmp_path / "infer.de", 5)
