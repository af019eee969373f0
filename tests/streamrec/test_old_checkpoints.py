"""Checkpoints written before the option groups existed load and recommend as they did.

`tests/streamrec/fixtures/` holds one tiny checkpoint per network and training layout (sasrec; sasrec with label
smoothing, the contrastive term, the low-pass mix, gated residuals, swiglu, the output head and history dropout;
sasrec with window attention, an untied output and the sampled loss; bert4rec; gru; sasrec with item features),
each trained for one epoch on `log.csv` by the code before the reshaping, with optimizer states dropped, and
`expected.json`: what `Recommender.recommend` returned then for three histories. Their hyper-parameters use the
old flat names (`contrastive_weight`, `attention_window`, `gated_residual`, ...), which only the loaders map.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from streamrec import Recommender
from streamrec.model.module import StreamRecModule

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CASES = sorted(EXPECTED["top10"])


def _same(got: list[list[tuple[str, float]]], want: list[list[list]]) -> None:
    for row_got, row_want in zip(got, want, strict=True):
        assert [item for item, _ in row_got] == [item for item, _ in row_want]
        assert [score for _, score in row_got] == pytest.approx([score for _, score in row_want], abs=1e-4)


@pytest.mark.parametrize("case", CASES)
def test_an_old_checkpoint_recommends_the_same_items(case: str) -> None:
    rec = Recommender.load(FIXTURES / f"{case}.ckpt")
    _same(rec.recommend(EXPECTED["histories"], top_k=10), EXPECTED["top10"][case])


@pytest.mark.parametrize("case", CASES)
def test_an_old_checkpoint_loads_as_a_module_with_its_settings_in_groups(case: str) -> None:
    old = torch.load(FIXTURES / f"{case}.ckpt", weights_only=True)["hyper_parameters"]
    module = StreamRecModule.load_from_checkpoint(FIXTURES / f"{case}.ckpt")
    hp = module.hparams
    assert hp["arch"] == old["arch"] and hp["d_model"] == old["d_model"]
    assert hp["objective"]["loss"] == old["loss"]
    assert hp["contrastive"]["weight"] == old["contrastive_weight"]
    assert hp["mixing"]["window"] == old["attention_window"]
    assert hp["block"]["residual"] == ("gated" if old["gated_residual"] else "plain")
    assert hp["evaluation"]["exclude_seen"] == old["exclude_seen"]
    assert not any(key in hp for key in ("loss", "contrastive_weight", "attention_window", "filter_seen"))
    scores = module.model.recommend_scores(torch.tensor([[0, 0, 1, 2, 3]]))
    assert torch.isfinite(scores[0, 1:]).all()


def test_the_old_flat_names_are_not_options_of_the_module() -> None:
    with pytest.raises(TypeError, match="contrastive_weight"):
        StreamRecModule(10, contrastive_weight=0.1)  # type: ignore[call-arg]


def test_the_test_command_takes_an_old_checkpoint(tmp_path, monkeypatch, capsys) -> None:
    from streamrec.cli import main

    monkeypatch.chdir(tmp_path)
    main(["test", "--data.path", str(FIXTURES / "log.csv"), "--data.max_len", "8", "--ckpt_path",
          str(FIXTURES / "sasrec_terms.ckpt"), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("test_ndcg@10")]
    assert rows and 0.0 <= float(rows[0][1]) <= 1.0
