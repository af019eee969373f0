"""`translate.infer` and `translate.average`: line bookkeeping, search equivalences, atomic output,
foreign checkpoints, and weight averaging."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from translate import api, average, infer
from translate.api import Translator
from translate.data.vocab import BOS_ID, EOS_ID
from translate.model.module import TranslationModule
from translate.search.decoding import beam_search

MAX_LEN = 32


@pytest.fixture(scope="module")
def trained(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> SimpleNamespace:
    """A tiny model after a few training steps: its checkpoint, data module and trainer."""
    out = tmp_path_factory.mktemp("infer_ckpt")
    path, dm = train_tiny_checkpoint(demo_dir, out, MAX_LEN, n_decoder_layers=2)
    return SimpleNamespace(ckpt=path, dm=dm, dir=out)


def _lines(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _one_by_one_beam1(ckpt: Path, lines: list[str]) -> list[str]:
    """Reference: each line alone (no sorting, no batching) through beam search of width 1."""
    t = Translator.load(ckpt)
    out = []
    for line in lines:
        ids = t.src_vocab.encode(line)[: t.max_src_len] if line.strip() else []
        if not ids:
            out.append("")
            continue
        hyp = beam_search(t.model, torch.tensor([ids]), BOS_ID, EOS_ID, beam_size=1, alpha=0.0)[0][0]
        out.append(t.tgt_vocab.decode(hyp.tokens))
    return out


def test_one_line_per_input_in_order_greedy_equals_beam_one(trained, demo_dir, tmp_path, caplog):
    """Empty and blank lines give empty lines, an over-long line is truncated with a warning naming it,
    and the sorted, batched, chunked greedy output equals beam search of width 1 on each line alone."""
    sources = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:6]
    long_line = " ".join(sources * 2)  # ~80 words: more subwords than max_len
    lines = [sources[0], "", sources[1], "   ", long_line, sources[2], sources[3], "", sources[4]]
    src = _write(tmp_path / "in.en", lines)
    out = tmp_path / "out.de"
    with caplog.at_level(logging.WARNING, logger="translate.infer"):
        infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(out), "--beam-size", "1",
                    "--batch-size", "2", "--chunk-lines", "4"])
    got = _lines(out)
    assert len(got) == len(lines)
    assert got == _one_by_one_beam1(trained.ckpt, lines)
    assert [g == "" for g in got] == [not line.strip() for line in lines]
    assert any(f"line 5: {len(Translator.load(trained.ckpt).src_vocab.encode(long_line))} subwords" in r.message
               for r in caplog.records)


def test_bfloat16_decoding_keeps_lines_and_mostly_the_fp32_output(trained, demo_dir, tmp_path, monkeypatch):
    """bf16 weights change the arithmetic, not the bookkeeping: same line structure, and on this
    tiny model the same text for most lines (the fp32 run is the reference)."""
    monkeypatch.setattr(api, "cpu_has_fast_bf16", lambda: True)  # bf16 even where it is slow: a tiny model
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:20] + [""]
    src = _write(tmp_path / "in.en", lines)
    for dtype in ("float32", "bfloat16"):
        infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / dtype), "--dtype", dtype])
    fp32, bf16 = _lines(tmp_path / "float32"), _lines(tmp_path / "bfloat16")
    assert len(bf16) == len(lines) and bf16[-1] == ""
    assert sum(a == b for a, b in zip(fp32, bf16, strict=True)) >= 0.7 * len(lines)
    assert next(Translator.load(trained.ckpt, dtype="bfloat16").model.parameters()).dtype == torch.bfloat16


def test_bfloat16_on_a_cpu_without_fast_bf16_decodes_in_float32_and_says_so(trained, monkeypatch, caplog):
    monkeypatch.setattr(api, "cpu_has_fast_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="translate.infer"):
        loaded = Translator.load(trained.ckpt, dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert any(r.message.startswith("--dtype bfloat16: ") and r.message.endswith("so decoding runs in float32")
               for r in caplog.records)


def test_int8_decoding_keeps_lines_alignments_and_mostly_the_fp32_output(trained, demo_dir, tmp_path):
    """int8 linear layers change the arithmetic, not the bookkeeping; the fp32 run is the reference."""
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:20] + [""]
    src = _write(tmp_path / "in.en", lines)
    for dtype in ("float32", "int8"):
        infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / dtype), "--dtype", dtype,
                    "--alignments", str(tmp_path / f"{dtype}.jsonl")])
    fp32, int8 = _lines(tmp_path / "float32"), _lines(tmp_path / "int8")
    assert len(int8) == len(lines) and int8[-1] == ""
    assert sum(a == b for a, b in zip(fp32, int8, strict=True)) >= 0.7 * len(lines)
    rows = [json.loads(r) for r in _lines(tmp_path / "int8.jsonl")]
    assert len(rows) == len(lines)
    for row, text in zip(rows, int8, strict=True):
        assert row["tgt_words"] == text.split()
        assert len(row["matrix"]) == len(row["tgt_words"])
    model = Translator.load(trained.ckpt, dtype="int8").model
    assert not any(type(m) is torch.nn.Linear for m in model.modules())  # every linear layer quantised


def test_int8_on_a_gpu_is_a_one_line_error_and_auto_picks_the_cpu(trained, demo_dir, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--dtype int8 runs on the CPU only"):
        Translator.load(trained.ckpt, device="cuda", dtype="int8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # --device auto would pick the GPU
    src = _write(tmp_path / "in.en", (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:3])
    infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / "out"), "--dtype", "int8"])
    assert len(_lines(tmp_path / "out")) == 3


def test_unknown_dtype_is_a_one_line_error(trained):
    with pytest.raises(ValueError, match="--dtype must be one of"):
        Translator.load(trained.ckpt, dtype="float16")


def test_stdin_to_stdout(trained, monkeypatch, capsysbinary):
    data = b"the dog sleeps .\n\nthe man sees the dog .\n"
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(data)))
    infer.main(["--ckpt", str(trained.ckpt), "--beam-size", "2"])
    out = capsysbinary.readouterr().out.decode("utf-8").split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""


def test_output_streams_chunk_by_chunk(trained, demo_dir, monkeypatch, capsysbinary):
    """A chunk's translations are written before the next chunk is read, so memory stays bounded whatever
    the input's length: count the output lines already written each time an input line is read."""
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:6]
    written: list[int] = []
    output = bytearray()

    def stdin():
        for line in lines:
            output.extend(capsysbinary.readouterr().out)
            written.append(output.count(b"\n"))
            yield (line + "\n").encode("utf-8")

    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=stdin()))
    infer.main(["--ckpt", str(trained.ckpt), "--beam-size", "1", "--chunk-lines", "2"])
    output.extend(capsysbinary.readouterr().out)
    assert written == [0, 0, 2, 2, 4, 4]
    assert output.count(b"\n") == len(lines)


def test_progress_bar_goes_to_stderr_only(trained, demo_dir, tmp_path, capfd):
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:5]
    src = _write(tmp_path / "in.en", lines)
    infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "--beam-size", "1", "--progress"])
    captured = capfd.readouterr()
    assert "translating" in captured.err and "5/5" in captured.err
    assert len(captured.out.splitlines()) == 5 and "translating" not in captured.out


def test_nbest_is_tab_separated_best_first(trained, demo_dir, tmp_path):
    lines = (demo_dir / "val.en").read_text(encoding="utf-8").splitlines()[:5] + [""]
    src = _write(tmp_path / "in.en", lines)
    infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / "best"), "--beam-size", "3"])
    infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / "nbest"), "--beam-size", "3",
                "--n-best", "2"])
    best, nbest = _lines(tmp_path / "best"), _lines(tmp_path / "nbest")
    assert len(nbest) == len(lines) and nbest[-1] == ""
    assert [row.split("\t")[0] for row in nbest[:-1]] == best[:-1]
    assert all(len(row.split("\t")) == 2 for row in nbest[:-1])


def test_output_is_atomic_when_the_input_breaks(trained, tmp_path):
    src = tmp_path / "in.en"
    src.write_bytes(b"the dog sleeps .\nthe cat sleeps .\nthe man sings .\nbad \xff byte\n")
    out = tmp_path / "out.de"
    # --chunk-size: the old name of --chunk-lines, still accepted
    with pytest.raises(SystemExit, match=r"^error: .*in\.en:4: invalid UTF-8"):
        infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(out), "--chunk-size", "2"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en"]  # no output, no temporary file left


def test_max_len_options_bound_every_output(trained, demo_dir, tmp_path):
    lines = (demo_dir / "val.en").read_text(encoding="utf-8").splitlines()[:8]
    src = _write(tmp_path / "in.en", lines)
    for beam in ("1", "3"):
        infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / "out"), "--beam-size", beam,
                    "--max-len-a", "0", "--max-len-b", "3"])
        vocab = Translator.load(trained.ckpt).tgt_vocab
        lengths = [len(vocab.encode(line)) for line in _lines(tmp_path / "out")]
        assert len(lengths) == len(lines) and max(lengths) <= 3  # three subwords, then EOS


@pytest.mark.parametrize("args, match", [
    (["--device", "tpu9"], r"--device 'tpu9': not a device"),
    (["--align-layer", "7", "--alignments", "a.jsonl"],
     r"--align-layer 7: the model has 2 decoder cross-attention layers"),
    (["--max-len-b", "0"], r"`max_len_a` \(1\.5\) must be >= 0 and `max_len_b` \(0\) >= 1"),
    (["--html", "nope/a.html"], r"nope/a\.html: the output folder nope does not exist"),
    (["--alignments", "in.en.d"], r"in\.en\.d: is a folder"),
    (["-o", "in.en.d"], r"in\.en\.d: is a folder"),
    (["-i", "in.en.d"], r"--input in\.en\.d: is a folder; name a file of source lines"),
    (["-i", "missing.en"], r"--input missing\.en: no such file"),
])
def test_bad_options_are_one_line_errors_before_any_output(trained, tmp_path, monkeypatch, args, match):
    monkeypatch.chdir(tmp_path)
    src = _write(tmp_path / "in.en", ["the dog sleeps ."])
    (tmp_path / "in.en.d").mkdir()
    with pytest.raises(SystemExit, match=rf"^error: {match}"):
        infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", "out.de", *args])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en", "in.en.d"]  # nothing written, nothing left
    assert list((tmp_path / "in.en.d").iterdir()) == []


def test_output_through_a_symlink_keeps_the_link(trained, tmp_path):
    src = _write(tmp_path / "in.en", ["the dog sleeps .", "", "the man sees the dog ."])
    real = _write(tmp_path / "real.de", ["old"])
    (tmp_path / "link.de").symlink_to("real.de")
    infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / "link.de"), "--beam-size", "1"])
    assert (tmp_path / "link.de").is_symlink()
    assert len(_lines(real)) == 3 and _lines(real)[1] == ""


def test_dash_input_reads_stdin(trained, monkeypatch, capsysbinary):
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(b"the dog sleeps .\n\n")))
    infer.main(["--ckpt", str(trained.ckpt), "-i", "-", "--beam-size", "1"])
    assert capsysbinary.readouterr().out.decode("utf-8").count("\n") == 2


def test_nbest_keeps_its_columns_at_the_tightest_length_limit(trained, demo_dir, tmp_path):
    lines = (demo_dir / "val.en").read_text(encoding="utf-8").splitlines()[:4]
    src = _write(tmp_path / "in.en", lines)
    infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / "out"), "--beam-size", "3",
                "--n-best", "3", "--max-len-a", "0", "--max-len-b", "1"])
    rows = [row.split("\t") for row in _lines(tmp_path / "out")]
    vocab = Translator.load(trained.ckpt).tgt_vocab
    assert len(rows) == 4 and all(len(row) == 3 for row in rows)
    # At most one subword each: the text of a single piece (a word-inner piece such as "nern" re-encodes as two).
    single = {vocab.decode([i]) for i in range(len(vocab))} | {""}
    assert all(text in single for row in rows for text in row)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_a_one_line_error(trained, tmp_path):
    src = _write(tmp_path / "in.en", ["the dog sleeps ."])
    with pytest.raises(SystemExit, match=r"^error: --device cuda: no CUDA GPU is available here"):
        infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "--device", "cuda"])


@pytest.mark.slow
def test_reader_closing_the_pipe_ends_quietly(trained, demo_dir, tmp_path):
    """`infer ... | head -1`: no BrokenPipeError traceback on stderr."""
    import subprocess

    lines = (demo_dir / "val.en").read_text(encoding="utf-8").splitlines() * 20
    src = _write(tmp_path / "in.en", lines)
    cmd = f"{sys.executable} -m translate.infer --ckpt {trained.ckpt} -i {src} --beam-size 1 --chunk-size 50 | head -1"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert len(done.stdout.splitlines()) == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_alignments_and_html_report(trained, demo_dir, tmp_path):
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:3] + ["", "the dog sleeps .",
                                                                                     "the Ωmega dog sleeps ."]
    vocab = Translator.load(trained.ckpt).src_vocab
    assert "<unk>" in vocab.pieces(vocab.encode(lines[-1]))  # an unseen character: its words still read as written
    src = _write(tmp_path / "in.en", lines)
    align, html = tmp_path / "a.jsonl", tmp_path / "a.html"
    infer.main(["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(tmp_path / "out"), "--beam-size", "2",
                "--alignments", str(align), "--html", str(html)])
    records = [json.loads(line) for line in _lines(align)]
    translations = _lines(tmp_path / "out")
    assert len(records) == len(lines)
    for line, out, rec in zip(lines, translations, records, strict=True):
        assert set(rec) == {"src_words", "tgt_words", "matrix", "alignment"}
        assert rec["src_words"] == line.split() and rec["tgt_words"] == out.split()
        assert len(rec["matrix"]) == len(rec["tgt_words"])
        assert all(len(row) == len(rec["src_words"]) for row in rec["matrix"])
        links = [tuple(map(int, link.split("-"))) for link in rec["alignment"].split()]
        assert sorted(j for _, j in links) == list(range(len(rec["tgt_words"])))  # one link per target word
    page = html.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") == 5
    assert "http" not in page and "<script" not in page and "src=" not in page  # self-contained


@pytest.mark.parametrize("kind", ["random bytes", "streamrec-like dict", "missing"])
def test_foreign_checkpoint_is_a_one_line_error(kind, tmp_path):
    path = tmp_path / "x.ckpt"
    if kind == "random bytes":
        path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    elif kind == "streamrec-like dict":
        torch.save({"state_dict": {"model.w": torch.zeros(2)}, "hyper_parameters": {"num_items": 5},
                    "streamrec_item_vocab": {"items": ["a"]}}, path)
    for entry in (infer.main, lambda a: average.main(["--ckpts", a[1], a[1], "--output", str(tmp_path / "o")])):
        with pytest.raises(SystemExit) as exit_:
            entry(["--ckpt", str(path)])
        message = str(exit_.value.code)
        assert message.startswith("error: ") and str(path) in message and "\n" not in message


# ----------------------------------------------------------------------------- averaging


def _perturbed(ckpt: Path, out: Path, step: int, seed: int) -> Path:
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    g = torch.Generator().manual_seed(seed)
    state["state_dict"] = {k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                           for k, v in state["state_dict"].items()}
    state["global_step"] = step
    torch.save(state, out)
    return out


def test_average_of_identical_checkpoints_is_the_checkpoint(trained, tmp_path):
    out = tmp_path / "avg.ckpt"
    average.main(["--ckpts", str(trained.ckpt), str(trained.ckpt), "--output", str(out)])
    a = torch.load(trained.ckpt, weights_only=True)["state_dict"]
    b = torch.load(out, weights_only=True)
    assert b["state_dict"].keys() == a.keys()
    assert all(torch.equal(a[k], b["state_dict"][k]) for k in a)
    assert "optimizer_states" not in b and b["TranslationDataModule"] == trained.dm.state_dict()
    # tied weights stay one tensor, as in the input: saved once
    tied = [k for k in a if k.endswith(("src_embed.embedding.weight", "tgt_embed.embedding.weight", "output.weight"))]
    assert len(tied) == 3 and a[tied[0]].data_ptr() == a[tied[1]].data_ptr() == a[tied[2]].data_ptr()
    assert len({b["state_dict"][k].data_ptr() for k in tied}) == 1


def test_average_of_two_checkpoints_is_the_mean_and_is_usable(trained, tmp_path):
    first = _perturbed(trained.ckpt, tmp_path / "a.ckpt", 100, seed=1)
    second = _perturbed(trained.ckpt, tmp_path / "b.ckpt", 200, seed=2)
    out = tmp_path / "avg.ckpt"
    average.main(["--ckpts", str(first), str(second), "--output", str(out)])
    a, b = (torch.load(p, weights_only=True)["state_dict"] for p in (first, second))
    avg = torch.load(out, weights_only=True)["state_dict"]
    for k in a:
        assert torch.allclose(avg[k], (a[k] + b[k]) / 2, atol=1e-6), k
    # infer and Lightning's test loop accept it
    lines = _write(tmp_path / "in.en", ["the dog sleeps ."])
    infer.main(["--ckpt", str(out), "-i", str(lines), "-o", str(tmp_path / "out"), "--beam-size", "2"])
    assert len(_lines(tmp_path / "out")) == 1
    module = TranslationModule.load_from_checkpoint(out, evaluation={"test_beam_size": 2})
    assert module.tgt_vocab == trained.dm.tgt_vocab  # vocabularies come with the checkpoint
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, limit_test_batches=1,
                        use_distributed_sampler=False)
    metrics = trainer.test(module, trained.dm, ckpt_path=out, verbose=False)[0]
    assert {"test_loss", "test_bleu", "test_chrf"} <= set(metrics)


def test_average_last_n_of_a_folder_counts_each_step_once(trained, tmp_path):
    folder = tmp_path / "ckpts"
    folder.mkdir()
    for name, step in (("a.ckpt", 10), ("b.ckpt", 20), ("c.ckpt", 30), ("last.ckpt", 30)):
        _perturbed(trained.ckpt, folder / name, step, seed=step)
    assert average.latest_checkpoints(folder, 2) == [folder / "b.ckpt", folder / "c.ckpt"]
    average.main(["--dir", str(folder), "--last", "2", "--output", str(folder / "avg.ckpt")])
    assert average.latest_checkpoints(folder, 3)[0] == folder / "a.ckpt"  # the average itself is skipped
    with pytest.raises(SystemExit, match="distinct steps"):
        average.main(["--dir", str(folder), "--last", "4", "--output", str(tmp_path / "x.ckpt")])
