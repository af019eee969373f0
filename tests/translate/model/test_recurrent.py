"""`model.arch: rnn`: the recurrent translator behind the same search, ensembles, alignments, loading and export."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from core.runtime.errors import InputError
from translate import Translator as Api
from translate import export
from translate.data.vocab import BOS_ID, EOS_ID
from translate.model.module import TranslationModule
from translate.model.networks import build_translator
from translate.model.options import RecurrentOptions
from translate.model.recurrent import RecurrentTranslator
from translate.model.transformer import TransformerTranslator
from translate.search.align import cross_attention
from translate.search.decoding import beam_search, greedy_search
from translate.search.ensemble import Ensemble

V = 11


def _rnn(seed: int = 0, cell: str = "gru", score: str = "additive") -> RecurrentTranslator:
    torch.manual_seed(seed)
    model = RecurrentTranslator(V, V, d_model=16, hidden_size=12, n_encoder_layers=2, n_decoder_layers=2,
                                dropout=0.0, max_len=12, cell=cell, score=score).eval()
    with torch.no_grad():  # random init is near-uniform: make the choices clear
        for p in model.parameters():
            p.mul_(3.0)
    return model


SRC = torch.tensor([[4, 5, 6, 7, 8], [6, 5, 4, 0, 0], [9, 0, 0, 0, 0]])


@pytest.mark.parametrize(("cell", "score"), [("gru", "additive"), ("lstm", "general")])
def test_cached_decoding_equals_the_teacher_forced_logits(cell, score):
    model = _rnn(cell=cell, score=score)
    tgt = torch.tensor([[BOS_ID, 5, 6, 7], [BOS_ID, 8, 4, 4], [BOS_ID, 9, 9, 5]])
    memory, src_mask = model.encode(SRC)
    cache = model.new_cache()
    steps = torch.cat([model.decode(tgt[:, t : t + 1], memory, src_mask, cache) for t in range(4)], dim=1)
    torch.testing.assert_close(steps, model(SRC, tgt))


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_beam_one_equals_greedy_and_n_best_runs(cell):
    model = _rnn(cell=cell)
    greedy = greedy_search(model, SRC, BOS_ID, EOS_ID)
    beam = beam_search(model, SRC, BOS_ID, EOS_ID, beam_size=1, alpha=0.0)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam, strict=True):
        assert b[0].log_prob == pytest.approx(g.log_prob, abs=1e-4)
    nbest = beam_search(model, SRC, BOS_ID, EOS_ID, beam_size=4, n_best=3)
    assert [len(row) for row in nbest] == [3, 3, 3]
    assert all(row[0].score >= row[-1].score for row in nbest)


def test_the_best_beam_scores_its_tokens_as_teacher_forcing_does():
    model = _rnn()
    for src, (best, *_) in zip(SRC, beam_search(model, SRC, BOS_ID, EOS_ID, beam_size=3, n_best=2), strict=True):
        ids = best.tokens + [EOS_ID]
        with torch.no_grad():
            logp = model(src[None], torch.tensor([[BOS_ID, *ids[:-1]]]))[0].log_softmax(-1)
        assert float(logp[range(len(ids)), ids].sum()) == pytest.approx(best.log_prob, abs=1e-4)


def test_an_ensemble_of_an_rnn_and_a_transformer_searches():
    torch.manual_seed(1)
    transformer = TransformerTranslator(V, V, d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=16,
                                        max_len=12, dropout=0.0).eval()
    ensemble = Ensemble([_rnn(), transformer, _rnn(2, "lstm")]).eval()
    greedy = greedy_search(ensemble, SRC, BOS_ID, EOS_ID)
    beam = beam_search(ensemble, SRC, BOS_ID, EOS_ID, beam_size=1, alpha=0.0)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    assert all(len(row) == 2 for row in beam_search(ensemble, SRC, BOS_ID, EOS_ID, beam_size=3, n_best=2))


def test_alignments_have_a_row_per_target_token_summing_to_one_over_real_source_tokens():
    model = _rnn()
    targets = [[5, 6, 7], [8], [4, 4]]
    weights = cross_attention(model, SRC, targets)
    for w, ids, src in zip(weights, targets, SRC, strict=True):
        real = int((src != model.pad_id).sum())
        assert w.shape == (len(ids), SRC.shape[1])
        torch.testing.assert_close(w[:, :real].sum(-1), torch.ones(len(ids)))
        assert not w[:, real:].any()


def test_the_factory_builds_the_arch_and_the_defaults_are_the_modules():
    sizes = {"src_vocab_size": V, "tgt_vocab_size": V}
    rnn = build_translator({**sizes, "arch": "rnn", "n_heads": 3, "lr": 0.1, "rnn": {"hidden_size": 8}})
    assert isinstance(rnn, RecurrentTranslator) and rnn.encoder.rnn.hidden_size == 8
    assert type(build_translator(sizes)) is TransformerTranslator
    with pytest.raises(ValueError, match="`model.arch`"):
        build_translator({**sizes, "arch": "lstm"})
    model, module = inspect.signature(RecurrentTranslator).parameters, inspect.signature(TranslationModule).parameters
    defaults = {**{n: p.default for n, p in module.items()}, **vars(RecurrentOptions())}
    shared = [name for name, p in model.items() if p.default is not inspect.Parameter.empty]
    assert {n: model[n].default for n in shared} == {n: defaults[n] for n in shared}


@pytest.fixture(scope="module")
def rnn_ckpt(demo_dir, tmp_path_factory) -> Path:
    """A tiny rnn fitted for a few steps through the Lightning module, saved as a checkpoint."""
    import lightning as L

    from translate.data.corpus import TranslationDataModule

    out = tmp_path_factory.mktemp("rnn_ckpt")
    L.seed_everything(0, verbose=False)
    dm = TranslationDataModule(str(demo_dir / "train"), str(demo_dir / "val"), str(demo_dir / "test"),
                               max_len=32, max_tokens=512, cache_dir=str(out / "spm"))
    module = TranslationModule(dm.src_vocab_size, dm.tgt_vocab_size, pad_id=dm.pad_id, max_len=32, arch="rnn",
                               rnn={"cell": "lstm", "hidden_size": 16}, d_model=16, n_encoder_layers=1,
                               n_decoder_layers=1, lr=3e-3, optimizer={"warmup_steps": 2})
    trainer = L.Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=1, val_check_interval=6,
                        use_distributed_sampler=False)
    trainer.fit(module, dm)
    assert torch.isfinite(trainer.callback_metrics["train_loss"]) and "val_bleu" in trainer.callback_metrics
    trainer.save_checkpoint(out / "tiny.ckpt")
    return out / "tiny.ckpt"


def test_the_checkpoint_loads_translates_aligns_and_exports(rnn_ckpt, demo_dir, tmp_path):
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    t = Api.load(rnn_ckpt)
    assert isinstance(t.model, RecurrentTranslator)
    nbest = t.translate(lines, beam_size=3, n_best=2, return_alignments=True)
    assert [len(row) for row in nbest] == [2, 2, 2]
    for row in nbest:
        a = row[0].alignment
        assert a is not None and len(a.matrix) == len(a.tgt_words)
        assert all(sum(r) == pytest.approx(1.0, abs=1e-4) for r in a.matrix)
    folder = export.export_safetensors(rnn_ckpt, tmp_path / "st")
    assert Api.load(folder).translate(lines, beam_size=3) == t.translate(lines, beam_size=3)
    assert Api.load([rnn_ckpt, rnn_ckpt]).translate(lines, beam_size=2) == t.translate(lines, beam_size=2)
    with pytest.raises(InputError, match="model.arch 'rnn'"):
        export.export_ctranslate2(rnn_ckpt, tmp_path / "ct2")


def test_the_command_line_translates_and_aligns_with_the_rnn(rnn_ckpt, demo_dir, tmp_path):
    """`python -m translate.infer` on an rnn checkpoint: the same lines as the API, alignments from its one
    attention, and `--align-layer` checked against that one layer."""
    from translate import infer

    src = tmp_path / "src.en"
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, aligned = tmp_path / "out.de", tmp_path / "align.jsonl"
    infer.main(["--ckpt", str(rnn_ckpt), "-i", str(src), "-o", str(out), "--alignments", str(aligned),
                "--align-layer", "-1"])
    assert out.read_text(encoding="utf-8").splitlines() == Api.load(rnn_ckpt).translate(lines)
    assert len(aligned.read_text(encoding="utf-8").splitlines()) == 3
    with pytest.raises(InputError, match="has 1 decoder cross-attention layer \\(use 0..0"):
        infer.run(infer.build_parser().parse_args([
            "--ckpt", str(rnn_ckpt), "-i", str(src), "-o", str(tmp_path / "x.de"), "--alignments",
            str(tmp_path / "x.jsonl"), "--align-layer", "1"]))
    assert not (tmp_path / "x.de").exists()
