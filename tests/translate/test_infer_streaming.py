"""Streaming translation: `translate.infer` in chunks equals one chunk holding the whole file, encoding
is bounded, an interrupted stream leaves no output, and `Translator.translate_iter` equals `translate`."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from translate import api, infer
from translate.api import Translator

WHOLE = "100000"  # one chunk holds the whole file: what infer did on small files before streaming


@pytest.fixture(scope="module")
def trained(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("stream_ckpt")
    path, _ = train_tiny_checkpoint(demo_dir, out, 32, n_decoder_layers=1)
    return SimpleNamespace(ckpt=path, translator=Translator.load(path))


@pytest.fixture(scope="module")
def lines(demo_dir) -> list[str]:
    """Demo sentences of mixed lengths with empty and blank lines and one line over max_len, 17 in all."""
    src = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:12]
    return [src[0], "", src[1], src[2], "   ", " ".join(src * 2), *src[3:8], "", src[8], src[9], src[10], "", src[11]]


def _run(ckpt: Path, src: Path, out: Path, *options: str) -> dict[str, bytes]:
    infer.main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out / "out.de"), "--alignments",
                str(out / "a.jsonl"), "--html", str(out / "a.html"), "--beam-size", "3", "--n-best", "2",
                "--batch-size", "3", *options])
    return {name: (out / name).read_bytes() for name in ("out.de", "a.jsonl", "a.html")}


@pytest.mark.parametrize("chunk_lines", ["1", "4", "7"])  # 17 lines: 4 and 7 leave a short last chunk
def test_streamed_outputs_equal_one_chunk_and_each_line_alone(trained, lines, tmp_path, chunk_lines):
    """Translations (2-best), alignments and the HTML page are byte-identical for every chunk size, and
    each output line equals the API translating that line on its own (no sorting, batching or chunking)."""
    src = tmp_path / "in.en"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (tmp_path / "whole").mkdir()
    (tmp_path / "streamed").mkdir()
    whole = _run(trained.ckpt, src, tmp_path / "whole", "--chunk-lines", WHOLE)
    streamed = _run(trained.ckpt, src, tmp_path / "streamed", "--chunk-lines", chunk_lines)
    assert streamed == whole
    out = whole["out.de"].decode("utf-8").split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    alone = ["\t".join(t.text for t in trained.translator.translate([line], beam_size=3, n_best=2)[0])
             for line in lines]
    assert out[:-1] == alone
    assert [o == "" for o in out[:-1]] == [not line.strip() for line in lines]  # empty and blank lines stay empty
    assert whole["a.jsonl"].count(b"\n") == len(lines)


def test_chunks_cut_by_text_size_give_the_same_output(trained, lines, tmp_path, monkeypatch):
    """A chunk also ends after CHUNK_BYTES of text (here ~2 lines): the output does not change."""
    src = tmp_path / "in.en"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (tmp_path / "whole").mkdir()
    (tmp_path / "small").mkdir()
    whole = _run(trained.ckpt, src, tmp_path / "whole", "--chunk-lines", WHOLE)
    monkeypatch.setattr(infer, "CHUNK_BYTES", 60)
    seen: list[int] = []
    real = infer.read_chunks
    monkeypatch.setattr(infer, "read_chunks", lambda *a: (seen.append(len(c)) or c for c in real(*a)))
    assert _run(trained.ckpt, src, tmp_path / "small", "--chunk-lines", WHOLE) == whole
    assert sum(seen) == len(lines) and 3 < len(seen) < len(lines)  # really cut by size, not one chunk nor per line


def test_read_chunks_by_lines_and_bytes():
    data = b"ab\nc\n\ndef\r\nlast"  # no newline at the end
    assert list(infer.read_chunks(io.BytesIO(data), 2)) == [["ab", "c"], ["", "def"], ["last"]]
    assert list(infer.read_chunks(io.BytesIO(data), 1)) == [["ab"], ["c"], [""], ["def"], ["last"]]
    # bytes with their endings: 3, 2 (5 >= 4: cut), 1, 5 (6: cut), 4
    assert list(infer.read_chunks(io.BytesIO(data), 10, max_bytes=4)) == [["ab", "c"], ["", "def"], ["last"]]
    assert list(infer.read_chunks(io.BytesIO(b"abcdefgh\nx\n"), 10, max_bytes=4)) == [["abcdefgh"], ["x"]]
    assert list(infer.read_chunks(io.BytesIO(b""), 3)) == []


def test_encoding_in_bounded_groups_equals_encoding_each_line(trained, lines, monkeypatch, caplog):
    """Lines are encoded ENCODE_CHARS characters at a time (a longer line alone) and truncated at once:
    the ids equal each line encoded alone and cut to max_len, and warnings name the right lines."""
    t = trained.translator
    monkeypatch.setattr(api, "ENCODE_CHARS", 80)
    calls: list[list[str]] = []
    real = t.src_vocab.encode_batch
    monkeypatch.setattr(t.src_vocab, "encode_batch", lambda texts: calls.append(list(texts)) or real(texts))
    with caplog.at_level(logging.WARNING, logger="translate.api"):
        ids = t.encode_sources(lines, first_line=101)
    expected = [t.src_vocab.encode(line)[: t.max_src_len] if line.strip() else [] for line in lines]
    assert ids == expected
    assert [line for group in calls for line in group] == [line if line.strip() else "" for line in lines]
    assert all(sum(map(len, group)) <= 80 or len(group) == 1 for group in calls) and len(calls) > 3
    long_at = next(k for k, line in enumerate(lines) if len(t.src_vocab.encode(line)) > t.max_src_len)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [f"line {101 + long_at}: {len(t.src_vocab.encode(lines[long_at]))} subwords, truncated to "
                        f"the model's max_len of {t.max_src_len}"]


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_interrupted_stream_leaves_no_output(trained, lines, tmp_path, monkeypatch, error):
    """A failure after the first chunk was written (to the temporary file) leaves no output, no temporary
    file, and an earlier output exactly as it was."""
    src = tmp_path / "in.en"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    previous = tmp_path / "out.de"
    previous.write_text("an earlier run\n", encoding="utf-8")
    real = Translator.translate_ids
    calls = []

    def fail_on_second_chunk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            temporaries = [p for p in tmp_path.iterdir() if p.name.startswith(".out.de.") and p.suffix == ".tmp"]
            assert len(temporaries) == 1 and temporaries[0].read_bytes().count(b"\n") == 4  # chunk 1 was written
            raise error
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_ids", fail_on_second_chunk)
    argv = ["--ckpt", str(trained.ckpt), "-i", str(src), "-o", str(previous), "--alignments",
            str(tmp_path / "a.jsonl"), "--html", str(tmp_path / "a.html"), "--beam-size", "1", "--chunk-lines", "4"]
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(SystemExit) as exit_info:
            infer.main(argv)
        assert exit_info.value.code == 130
    else:
        with pytest.raises(RuntimeError, match="boom"):
            infer.main(argv)
    assert len(calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en", "out.de"]  # the lock is gone too
    assert previous.read_text(encoding="utf-8") == "an earlier run\n"


def test_stdin_streams_with_an_open_ended_progress_bar(trained, lines, monkeypatch, capfd):
    """From stdin the total is unknown: the bar counts lines without one, and stdout gets every line."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(data)))
    infer.main(["--ckpt", str(trained.ckpt), "--beam-size", "1", "--chunk-lines", "5", "--progress"])
    captured = capfd.readouterr()
    assert captured.out.count("\n") == len(lines)
    assert captured.out.split("\n")[:-1] == trained.translator.translate(lines, beam_size=1)
    assert f"{len(lines)}/?" in captured.err and "translating" in captured.err


def test_translate_iter_equals_translate_and_reads_a_chunk_at_a_time(trained, lines):
    t = trained.translator
    pulled: list[int] = []

    def source():
        for k, line in enumerate(lines):
            pulled.append(k)
            yield line

    results = t.translate_iter(source(), beam_size=2, chunk_lines=4)
    assert pulled == []  # nothing read before the first result is asked for
    first = next(results)
    assert len(pulled) == 4  # one chunk read, not the whole input
    assert [first, *results] == t.translate(lines, beam_size=2)
    for options in ({"n_best": 2, "beam_size": 3}, {"return_alignments": True, "beam_size": 2}):
        _assert_same(list(t.translate_iter(lines, chunk_lines=3, **options)), t.translate(lines, **options))
    text = io.StringIO("".join(line + "\r\n" for line in lines))  # a text file's lines keep their endings
    assert list(t.translate_iter(text, beam_size=1, chunk_lines=5)) == t.translate(lines, beam_size=1)


def _assert_same(got: list, expected: list) -> None:
    """Equal texts and alignments; scores equal up to float rounding (a batch's padding changes the sums' order)."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        g, e = (g, e) if isinstance(g, list) else ([g], [e])
        assert [x.text for x in g] == [x.text for x in e]
        assert [x.score for x in g] == pytest.approx([x.score for x in e], abs=1e-4)
        assert [x.log_prob for x in g] == pytest.approx([x.log_prob for x in e], abs=1e-4)
        for x, y in zip(g, e, strict=True):
            assert (x.alignment is None) == (y.alignment is None)
            if x.alignment is not None:
                assert (x.alignment.src_words, x.alignment.tgt_words, x.alignment.links) == (
                    y.alignment.src_words, y.alignment.tgt_words, y.alignment.links)
                assert [w for row in x.alignment.matrix for w in row] == pytest.approx(
                    [w for row in y.alignment.matrix for w in row], abs=1e-5)


def test_translate_iter_checks_its_options_at_once(trained):
    with pytest.raises(ValueError, match="not one string"):
        trained.translator.translate_iter("the dog sleeps .")
    with pytest.raises(ValueError, match=r"`chunk_lines` \(0\) must be >= 1"):
        trained.translator.translate_iter(["the dog sleeps ."], chunk_lines=0)
