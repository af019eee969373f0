"""The Python API against the inference script and search: strings, n-best lists, scores, alignments, ensembles."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch

from core.runtime.errors import InputError
from translate import Translator, infer
from translate.data.vocab import BOS_ID, EOS_ID
from translate.search.decoding import beam_search
from translate.search.ensemble import Ensemble

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@pytest.fixture(scope="module")
def ckpt(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> Path:
    return train_tiny_checkpoint(demo_dir, tmp_path_factory.mktemp("api_ckpt"), n_decoder_layers=2)[0]


@pytest.fixture(scope="module")
def lines(demo_dir) -> list[str]:
    sources = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:7]
    return [sources[0], "", *sources[1:4], "   ", *sources[4:]]


def _infer(ckpt, lines, out: Path, *args) -> list[str]:
    src = out.with_suffix(".in")
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    infer.main(["--ckpt", *map(str, ckpt if isinstance(ckpt, list) else [ckpt]), "-i", str(src), "-o", str(out),
                *args])
    return out.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_equals_the_inference_script(ckpt, lines, tmp_path, beam):
    t = Translator.load(ckpt)
    got = t.translate(lines, beam_size=beam, batch_size=2)
    assert got == _infer(ckpt, lines, tmp_path / "out", "--beam-size", str(beam))
    assert [g == "" for g in got] == [not line.strip() for line in lines]


def test_n_best_scores_and_alignments_equal_search_and_the_script(ckpt, lines, tmp_path):
    t = Translator.load(ckpt)
    nbest = t.translate(lines, beam_size=3, n_best=3, return_alignments=True)
    assert _infer(ckpt, lines, tmp_path / "out", "--beam-size", "3", "--n-best", "3",
                  "--alignments", str(tmp_path / "a.jsonl")) == ["\t".join(h.text for h in row) for row in nbest]
    aligned = [json.loads(r) for r in (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()]
    for line, row, want in zip(lines, nbest, aligned, strict=True):
        if not line.strip():
            assert row == []
            continue
        assert json.loads(row[0].alignment.to_json()) == want and all(h.alignment is None for h in row[1:])
        ids = t.src_vocab.encode(line)[: t.max_src_len]
        ref = beam_search(t.model, torch.tensor([ids]), BOS_ID, EOS_ID, beam_size=3, n_best=3)[0]
        assert [h.text for h in row] == [t.tgt_vocab.decode(h.tokens) for h in ref]
        assert [h.score for h in row] == pytest.approx([h.score for h in ref])
        assert [h.log_prob for h in row] == pytest.approx([h.log_prob for h in ref])
    best = t.translate(lines, beam_size=3, return_scores=True)
    assert [b.text for b in best] == [row[0].text if row else "" for row in nbest]
    assert [b.score for b in best] == pytest.approx([row[0].score if row else 0.0 for row in nbest])


def test_several_checkpoints_load_as_an_ensemble(ckpt, lines):
    """An ensemble of a model with itself averages equal probabilities: it translates as the model alone."""
    pair = Translator.load([ckpt, ckpt])
    assert isinstance(pair.model, Ensemble) and len(pair.model.members) == 2
    assert pair.translate(lines, beam_size=2) == Translator.load(ckpt).translate(lines, beam_size=2)


@pytest.mark.parametrize("call, message", [
    (lambda t: t.translate("one sentence"), "not one string"),
    (lambda t: t.translate(["a"], beam_size=2, n_best=3), "`n_best` \\(3\\) must be between 1 and `beam_size`"),
])
def test_misuse_is_a_one_line_input_error(ckpt, call, message):
    with pytest.raises(InputError, match=message):
        call(Translator.load(ckpt))


@pytest.mark.slow
def test_the_documented_example_runs(ckpt, tmp_path, capsys):
    """docs/api.md's Translate example, on the tiny checkpoint, run as a script (in this process: a second
    interpreter would only import torch again)."""
    section = DOC.read_text(encoding="utf-8").split("## Translate from Python\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(code.replace("runs/translate_demo/checkpoints/best.ckpt", str(ckpt)), encoding="utf-8")
    runpy.run_path(str(script), run_name="__main__")
    assert len(capsys.readouterr().out.splitlines()) == 1 + 2 + 3  # the list, the best one and its alignment, 3 options
