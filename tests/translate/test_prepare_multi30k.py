"""data/prepare_multi30k.py against hand-tokenised lines, and translate_bleu's `--prepared` scoring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RAW_EN = ["A man's dog, \"Rex\", runs.", "Two Girls play   soccer!"]
RAW_DE = ["Der Hund eines Mannes, „Rex“, rennt.", "Zwei Mädchen spielen Fußball!"]
# Written by hand from the Moses rules: lowercase, split punctuation and 's, escape quotes and apostrophes;
# English normalisation also moves a comma inside a closing quote ('",' -> ',"'), German's does not.
TOK_EN = ["a man &apos;s dog , &quot; rex , &quot; runs .", "two girls play soccer !"]
TOK_DE = ["der hund eines mannes , &quot; rex &quot; , rennt .", "zwei mädchen spielen fußball !"]


def _write(folder: Path, name: str, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(s + "\n" for s in lines), encoding="utf-8")


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    pytest.importorskip("sacremoses")  # here, not at import: collecting it would cost every worker the import
    raw = tmp_path / "multi30k"
    for split in ("train", "test_2016_flickr"):
        _write(raw, f"{split}.en", RAW_EN)
        _write(raw, f"{split}.de", RAW_DE)
    _write(raw / "tok", "test_2016_flickr.lc.norm.tok.en", TOK_EN)
    _write(raw / "tok", "test_2016_flickr.lc.norm.tok.de", [TOK_DE[0], "something else"])
    return raw


@pytest.fixture()
def prepare(data_script):
    return data_script("prepare_multi30k")


def test_prepared_files_match_hand_tokenised_lines(prepare, corpus: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "prepared"
    prepare.main(["--data", str(corpus), "--out", str(out), "--splits", "train", "test_2016_flickr"])
    for split in ("train", "test_2016_flickr"):
        assert (out / f"{split}.en").read_text(encoding="utf-8").splitlines() == TOK_EN
        assert (out / f"{split}.de").read_text(encoding="utf-8").splitlines() == TOK_DE
    assert not list(out.glob("*.tmp"))
    printed = capsys.readouterr().out
    assert "2 of 2 lines equal the official test_2016_flickr.lc.norm.tok.en" in printed
    assert "1 of 2 lines equal the official test_2016_flickr.lc.norm.tok.de" in printed


def test_missing_split_is_one_line_error(prepare, corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"val\.en not found"):
        prepare.main(["--data", str(corpus), "--out", str(tmp_path / "o"), "--splits", "val"])


def test_translate_bleu_scores_prepared_output_as_it_is(corpus: Path, tmp_path: Path) -> None:
    _write(corpus / "tok", "test_2016_flickr.lc.norm.tok.de", TOK_DE)
    hyp = tmp_path / "hyp.de"
    _write(tmp_path, "hyp.de", [TOK_DE[0], "zwei mädchen spielen ball !"])
    out = tmp_path / "bleu.json"
    cmd = [sys.executable, "benchmarks/translate_bleu.py", "--hyp", str(hyp), "--data", str(corpus),
           "--prepared", str(corpus), "--json", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    figures = json.loads(out.read_text())
    import sacrebleu

    expected = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(
        [TOK_DE[0], "zwei mädchen spielen ball !"], [TOK_DE]).score
    assert figures["bleu_lc_tok"] == pytest.approx(expected)
    assert 0 < figures["bleu_lc_tok"] < 100
    assert "bleu" not in figures  # cased detokenised BLEU does not apply to lowercased tokenised output
