"""Checkpoints written before the module's options were grouped still load and translate as they did.

The fixtures in `tests/translate/fixtures/` were written by the code before that change:
`legacy_transformer.ckpt` and `legacy_rnn.ckpt` are tiny models (d_model 16, one encoder and one decoder layer;
the rnn an LSTM with "general" scores and hidden_size 16) fitted for 300 steps on the demo corpus
(`data/make_translate_demo.py`, 300 training pairs, seed 0) with a 120-piece joint vocabulary trained with
sentencepiece's identity normalisation (so the stored vocabulary stays small); both use flat hyper-parameter
names that have since moved (`lr_floor`, `val_beam_size`, `cell`, `attention`, `hidden_size`, ...).
`legacy_outputs.json` holds their sources and what `translate.Translator.load(ckpt).translate(sources)` returned
then, greedy (`beam_size=1`) and with `beam_size=3`, and the hyper-parameters as stored.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from translate import Translator, infer
from translate.export import export_safetensors
from translate.model.hparams import MOVED, upgrade_hparams
from translate.model.module import TranslationModule

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "legacy_outputs.json").read_text(encoding="utf-8"))
ARCHS = ("transformer", "rnn")


@pytest.mark.parametrize("arch", ARCHS)
def test_api_translates_as_before(arch):
    t = Translator.load(FIXTURES / f"legacy_{arch}.ckpt")
    assert t.translate(EXPECTED["sources"], beam_size=1) == EXPECTED[arch]["greedy"]
    assert t.translate(EXPECTED["sources"], beam_size=3) == EXPECTED[arch]["beam3"]


@pytest.mark.parametrize("arch", ARCHS)
def test_infer_translates_as_before(arch, tmp_path):
    src = tmp_path / "in.en"
    src.write_text("".join(line + "\n" for line in EXPECTED["sources"]), encoding="utf-8")
    for beam, key in ((1, "greedy"), (3, "beam3")):
        out = tmp_path / f"out_{key}"
        infer.main(["--ckpt", str(FIXTURES / f"legacy_{arch}.ckpt"), "-i", str(src), "-o", str(out),
                    "--beam-size", str(beam), "--device", "cpu"])
        assert out.read_bytes().decode("utf-8").split("\n")[:-1] == EXPECTED[arch][key]


@pytest.mark.parametrize("arch", ARCHS)
def test_module_loads_as_before(arch):
    """`load_from_checkpoint` rebuilds the training module, which decodes as the network-only loader does."""
    module = TranslationModule.load_from_checkpoint(FIXTURES / f"legacy_{arch}.ckpt")
    t = Translator(module.model, module.src_vocab, module.tgt_vocab)
    assert t.translate(EXPECTED["sources"], beam_size=3) == EXPECTED[arch]["beam3"]
    stored = EXPECTED[arch]["hparams"]  # the flat names, now in their groups
    assert module.optimizer.lr_floor == stored["lr_floor"] and module.evaluation.val_beam_size == 2
    assert (module.rnn.cell, module.rnn.score, module.rnn.hidden_size) == (
        stored["cell"], stored["attention"], stored["hidden_size"])
    assert module.block.n_kv_heads == stored["n_kv_heads"] and module.objective.label_smoothing == stored[
        "label_smoothing"]
    assert not set(module.hparams) & set(MOVED), "the flat names are not options any more"


@pytest.mark.parametrize("arch", ARCHS)
def test_an_export_of_an_older_checkpoint_stores_todays_layout_and_translates_as_before(arch, tmp_path):
    folder = export_safetensors(FIXTURES / f"legacy_{arch}.ckpt", tmp_path / "st")
    stored = json.loads((folder / "config.json").read_text(encoding="utf-8"))["hyper_parameters"]
    assert stored == json.loads(json.dumps(upgrade_hparams(EXPECTED[arch]["hparams"])))
    assert Translator.load(folder).translate(EXPECTED["sources"], beam_size=3) == EXPECTED[arch]["beam3"]


def test_upgrade_moves_every_flat_name_into_its_group():
    stored = EXPECTED["rnn"]["hparams"]
    upgraded = upgrade_hparams({**stored, "_instantiator": "lightning.pytorch.cli.instantiate_module"})
    assert upgraded["rnn"] == {"cell": "lstm", "score": "general", "hidden_size": 16}
    assert upgraded["speed"] == {"cpu_fastpath": False, "compile": None, "compile_backend": "inductor"}
    assert set(upgraded) == set(inspect.signature(TranslationModule).parameters)
    assert upgrade_hparams(upgraded) == upgraded  # today's layout passes through
    with pytest.raises(ValueError, match="`optimizer.lr_floor` is given twice"):
        upgrade_hparams({"lr_floor": 0.1, "optimizer": {"lr_floor": 0.2}})
