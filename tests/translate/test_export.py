"""Translate export: safetensors round trip (no pickle), and the CTranslate2 conversion against our search."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from core.runtime.errors import InputError
from translate import Translator, export
from translate.data.vocab import BOS_ID, PAD_ID, SubwordVocab
from translate.export import SRC_MODEL, TGT_MODEL, export_safetensors, main, transformer_spec
from translate.model.transformer import TransformerTranslator as TranslatorModel
from translate.search.decoding import max_output_lengths
from translate.search.options import SearchOptions

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them


class CT2Translator:
    """A CTranslate2 export with its sentencepiece models, decoding as our `Translator` does (the tests' reference).

    Args:
        folder: written by `python -m translate.export --format ctranslate2`.
        max_len: the model's max_len (positions), which caps source and output lengths.
        compute_type: CTranslate2's compute type ("default": the stored weights' type).
        threads: intra-op threads.
    """

    def __init__(self, folder: str | Path, max_len: int, compute_type: str = "default", threads: int = 1):
        import ctranslate2

        folder = Path(folder)
        self.translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type,
                                                 intra_threads=threads)
        self.src_vocab = SubwordVocab.from_file(folder / SRC_MODEL)
        tgt = folder / TGT_MODEL
        self.tgt_vocab = SubwordVocab.from_file(tgt) if tgt.is_file() else self.src_vocab
        self.max_len = max_len
        self._suppress = [[p] for p in self.tgt_vocab.pieces([PAD_ID, BOS_ID])]  # as our search: never generated
        self._ids = {p: i for i, p in enumerate(self.tgt_vocab.pieces(range(self.tgt_vocab.vocab_size)))}

    def translate_ids(self, sources: Sequence[Sequence[int]], options: SearchOptions) -> list[list[int]]:
        """Best output ids per source (ours: `Translator.translate_ids`), with our per-sentence length limit.

        Sentences are grouped by their limit (`max_len_a` x length + `max_len_b`, capped by max_len - 1),
        since CTranslate2 takes one `max_decoding_length` per call. As in our search, EOS may come first
        (CTranslate2's `min_decoding_length` defaults to 1) and padding and BOS are never generated (without
        `suppress_sequences` CTranslate2 may emit BOS). `alpha` is passed as CTranslate2's
        `length_penalty`, whose normalisation (length ** alpha) differs from our GNMT penalty; `n_best` and
        `batch_size` are not used.
        """
        o = options
        out: list[list[int]] = [[] for _ in sources]
        limits: dict[int, list[int]] = {}
        for i, s in enumerate(sources):
            if s:
                row = torch.tensor([list(s)[: self.max_len]])
                limit = int(max_output_lengths(row, PAD_ID, o.max_len_a, o.max_len_b, self.max_len - 1)[0])
                limits.setdefault(limit, []).append(i)
        for limit, rows in limits.items():
            results = self.translator.translate_batch(
                [self.src_vocab.pieces(list(sources[i])[: self.max_len]) for i in rows], beam_size=o.beam_size,
                max_decoding_length=limit, min_decoding_length=0, length_penalty=o.alpha,
                suppress_sequences=self._suppress, max_input_length=self.max_len,
            )
            for i, r in zip(rows, results, strict=True):
                out[i] = [self._ids[p] for p in r.hypotheses[0]]
        return out

    def translate(self, sentences: Sequence[str], beam_size: int = 5, alpha: float = 0.6, max_len_a: float = 1.5,
                  max_len_b: int = 10) -> list[str]:
        """Detokenised best translations, one per sentence ("" for a blank one); the options as in ours."""
        ids = self.src_vocab.encode_batch([s if s.strip() else "" for s in sentences])
        options = SearchOptions(beam_size, alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b)
        return [self.tgt_vocab.decode(row) for row in self.translate_ids(ids, options)]


def _train(demo_dir: Path, out: Path, steps: int) -> Path:
    """A small translator trained long enough to end its outputs with EOS (a 20-step one only repeats a word)."""
    import lightning as L

    from translate.data.corpus import TranslationDataModule
    from translate.model.module import TranslationModule

    L.seed_everything(0, verbose=False)
    dm = TranslationDataModule(str(demo_dir / "train"), str(demo_dir / "val"), str(demo_dir / "test"), max_len=32,
                               max_tokens=1024, cache_dir=str(out / "spm"), vocab_size=400)
    module = TranslationModule(dm.src_vocab_size, dm.tgt_vocab_size, pad_id=dm.pad_id, max_len=32,
                               d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, lr=1e-2,
                               optimizer={"warmup_steps": 20}, dropout=0.0)
    trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, use_distributed_sampler=False)
    trainer.fit(module, dm)
    trainer.save_checkpoint(out / "small.ckpt")
    return out / "small.ckpt"


@pytest.fixture(scope="module")
def ckpt(demo_dir, built_once) -> Path:
    """Trained once per run (not once per xdist worker that runs a test of this module); tests only read it."""
    return built_once(f"translate export small {demo_dir}", lambda out: _train(demo_dir, out, steps=300)) / "small.ckpt"


@pytest.fixture(scope="module")
def test_set(demo_dir) -> tuple[list[str], list[str]]:
    return ((demo_dir / "test.en").read_text(encoding="utf-8").splitlines(),
            (demo_dir / "test.de").read_text(encoding="utf-8").splitlines())


def test_safetensors_round_trip_gives_identical_translations(ckpt, test_set, tmp_path):
    out = export_safetensors(ckpt, tmp_path / "st")
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "translate-safetensors" and config["src_vocab"] == "src.model"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "src.model"]
    ours, exported = Translator.load(ckpt), Translator.load(out)
    assert exported.src_vocab == ours.src_vocab and exported.tgt_vocab == ours.tgt_vocab
    lines = [*test_set[0][:8], ""]
    for beam in (1, 5):
        assert exported.translate(lines, beam_size=beam, return_scores=True) == ours.translate(
            lines, beam_size=beam, return_scores=True)


def test_ctranslate2_greedy_and_unpenalised_beam_are_identical(ckpt, test_set, tmp_path):
    """The two length penalties normalise differently (GNMT's against length ** alpha), so beam outputs are
    compared without one, where both rank hypotheses by their summed log-probability."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 not installed: pip install -e '.[export]'")
    main(["--ckpt", str(ckpt), "--format", "ctranslate2", "--output", str(tmp_path / "ct2")])
    ours = Translator.load(ckpt)
    ct2 = CT2Translator(tmp_path / "ct2", ours.max_src_len)
    sources = test_set[0]
    assert ct2.translate(sources, beam_size=1) == ours.translate(sources, beam_size=1)
    assert ct2.translate(sources, beam_size=5, alpha=0.0) == ours.translate(sources, beam_size=5, alpha=0.0)


def _readme_translate(folder: Path):
    """The `translate` function of the folder's README.md, run as a user pastes it: ctranslate2 and sentencepiece
    calls only, no project code."""
    readme = (folder / "README.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0].replace("THIS_FOLDER", str(folder))
    namespace: dict = {}
    exec(compile(code, str(folder / "README.md"), "exec"), namespace)  # noqa: S102 - the README's own example
    return namespace["translate"]


def test_ctranslate2_folder_alone_gives_our_output_with_plain_ctranslate2(ckpt, test_set, tmp_path):
    """The exported folder, copied elsewhere, decoded as its README shows (plain ctranslate2 + sentencepiece):
    our greedy and beam outputs on every test sentence; and one `translate_batch` call with the options
    file's greedy keyword arguments runs (CTranslate2's defaults ran past the position table)."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 not installed: pip install -e '.[export]'")
    import shutil

    import ctranslate2
    import sentencepiece as spm

    main(["--ckpt", str(ckpt), "--format", "ctranslate2", "--output", str(tmp_path / "ct2")])
    folder = Path(shutil.copytree(tmp_path / "ct2", tmp_path / "elsewhere"))
    translate = _readme_translate(folder)
    ours = Translator.load(ckpt)
    sources = [*test_set[0], ""]
    assert [translate(s, beam_search=False) for s in sources] == ours.translate(sources, beam_size=1)
    assert [translate(s) for s in sources] == ours.translate(sources)  # beam 5, alpha 0.6: our defaults

    options = json.loads((folder / "translate_options.json").read_text())
    assert options["greedy"]["max_decoding_length"] == ours.model.max_tgt_len - 1
    sp = spm.SentencePieceProcessor(model_file=str(folder / options["source_model"]))
    plain = ctranslate2.Translator(str(folder)).translate_batch(
        [sp.encode(s, out_type=str) for s in test_set[0]], **options["greedy"])
    assert len(plain) == len(test_set[0])


def test_ctranslate2_int8_quantization_writes_a_model(ckpt, test_set, tmp_path):
    pytest.importorskip("ctranslate2", reason="ctranslate2 not installed: pip install -e '.[export]'")
    main(["--ckpt", str(ckpt), "--format", "ctranslate2", "--output", str(tmp_path / "q"), "--quantization", "int8"])
    assert json.loads((tmp_path / "q" / "config.json").read_text())["decoder_start_token"] == "<s>"
    out = CT2Translator(tmp_path / "q", 32).translate(test_set[0][:5], beam_size=1)
    assert len(out) == 5 and all(isinstance(s, str) for s in out)


def test_a_stopped_ctranslate2_export_keeps_the_earlier_folder_whole(ckpt, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2", reason="ctranslate2 not installed: pip install -e '.[export]'")
    out = tmp_path / "ct2"
    main(["--ckpt", str(ckpt), "--format", "ctranslate2", "--output", str(out)])
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def stopped(options):  # the last file of the folder: everything else is written by now
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "ctranslate2_readme", stopped)
    with pytest.raises(SystemExit) as stop:
        main(["--ckpt", str(ckpt), "--format", "ctranslate2", "--output", str(out), "--quantization", "int8"])
    assert stop.value.code == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the float32 model, not half an int8 one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # no hidden folder left


def test_ctranslate2_refuses_what_its_spec_cannot_express():
    pytest.importorskip("ctranslate2", reason="ctranslate2 not installed: pip install -e '.[export]'")
    model = TranslatorModel(8, 8, d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=16,
                            positions="rope")
    with pytest.raises(InputError, match="positions 'rope'"):
        transformer_spec(model, {"block": {"positions": "rope"}, "n_heads": 2}, [], [])


def test_quantization_needs_the_ctranslate2_format(tmp_path):
    with pytest.raises(SystemExit):
        main(["--ckpt", "x.ckpt", "--format", "safetensors", "--output", str(tmp_path), "--quantization", "int8"])


def test_model_weights_survive_the_export_unchanged(ckpt, tmp_path):
    out = export_safetensors(ckpt, tmp_path / "w")
    a, b = Translator.load(ckpt).model.state_dict(), Translator.load(out).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("variant", [
    dict(norm_first=False, activation="gelu", positions="learned"),
    dict(activation="swiglu", positions="none", share_embeddings=False),
])
def test_ctranslate2_maps_post_ln_gelu_swiglu_learned_and_no_positions(ckpt, test_set, tmp_path, variant):
    pytest.importorskip("ctranslate2", reason="ctranslate2 not installed: pip install -e '.[export]'")
    from translate.export import write_ctranslate2

    trained = Translator.load(ckpt)
    v = trained.src_vocab.vocab_size
    hparams = dict(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32, max_len=32, **variant)
    torch.manual_seed(0)
    model = TranslatorModel(v, v, dropout=0.0, **hparams).eval()
    with torch.no_grad():  # LayerNorms away from (1, 0) and biases away from 0, so a wrong mapping shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    write_ctranslate2(model, hparams, (trained.src_vocab, trained.tgt_vocab), tmp_path / "ct2")
    ours = Translator(model, trained.src_vocab, trained.tgt_vocab)
    sources = test_set[0][:10]
    assert CT2Translator(tmp_path / "ct2", 32).translate(sources, beam_size=1) == ours.translate(sources, beam_size=1)


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_ctranslate2_conversion_leaves_the_live_model_untouched(ckpt, tmp_path, quantization):
    """The converter edits some arrays in place; they must be copies (a shared buffer once rewrote our weights)."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 not installed: pip install -e '.[export]'")
    from translate.export import write_ctranslate2

    trained = Translator.load(ckpt)
    v = trained.src_vocab.vocab_size
    hparams = dict(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, max_len=32)
    torch.manual_seed(0)
    model = TranslatorModel(v, v, dropout=0.0, **hparams).eval()
    before = {k: t.clone() for k, t in model.state_dict().items()}
    write_ctranslate2(model, hparams, (trained.src_vocab, trained.tgt_vocab), tmp_path / "ct2", quantization)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
