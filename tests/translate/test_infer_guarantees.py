"""translate.infer and translate.average under bad input and failing disks: one line, a non-zero exit,
earlier outputs untouched, no temporary or lock file left; one writer per output."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from core.runtime.lock import OutputLock
from translate import api, average, infer


@pytest.fixture(scope="module")
def tiny_ckpt(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> Path:
    return train_tiny_checkpoint(demo_dir, tmp_path_factory.mktemp("guarantee_ckpt"))[0]


def _fails(fn, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        fn(argv)
    assert exit_.value.code not in (0, None)
    message = str(exit_.value.code)
    assert "\n" not in message, message
    return message


def _left_behind(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".tmp", ".lock")))


@pytest.mark.parametrize("content", [b"a dog .\nthe \x00cat\n", b"\x00\x00\x00\x00"])
def test_nul_bytes_are_refused_naming_the_line(content, tiny_ckpt, tmp_path):
    src, out = tmp_path / "in.en", tmp_path / "out.de"
    src.write_bytes(content)
    out.write_text("earlier\n")
    message = _fails(infer.main, ["--ckpt", str(tiny_ckpt), "-i", str(src), "-o", str(out)])
    line = content.count(b"\n", 0, content.index(b"\0")) + 1
    assert f"{src}:{line}: NUL byte" in message
    assert out.read_text() == "earlier\n" and _left_behind(tmp_path) == []


def test_missing_output_folder_is_refused_before_any_work(tiny_ckpt, demo_dir, tmp_path):
    message = _fails(infer.main, ["--ckpt", str(tiny_ckpt), "-i", str(demo_dir / "test.en"),
                                  "-o", str(tmp_path / "no" / "out.de")])
    assert "does not exist" in message and not (tmp_path / "no").exists()


def test_full_disk_while_writing_is_one_line(tiny_ckpt, demo_dir, tmp_path, monkeypatch):
    out = tmp_path / "out.de"
    out.write_text("earlier\n")
    real = api.format_line

    def disk_full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(api, "format_line", disk_full)
    message = _fails(infer.main, ["--ckpt", str(tiny_ckpt), "-i", str(demo_dir / "test.en"), "-o", str(out)])
    assert message == f"error: {out}: no space left on the device; free some space and rerun"
    assert out.read_text() == "earlier\n" and _left_behind(tmp_path) == []
    monkeypatch.setattr(api, "format_line", real)


def test_interrupt_leaves_the_earlier_output(tiny_ckpt, demo_dir, tmp_path, monkeypatch):
    out = tmp_path / "out.de"
    out.write_text("earlier\n")

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "format_line", interrupted)
    with pytest.raises(SystemExit) as exit_:
        infer.main(["--ckpt", str(tiny_ckpt), "-i", str(demo_dir / "test.en"), "-o", str(out)])
    assert exit_.value.code == 130
    assert out.read_text() == "earlier\n" and _left_behind(tmp_path) == []


def test_a_second_writer_of_one_output_is_refused(tiny_ckpt, demo_dir, tmp_path):
    out = tmp_path / "out.de"
    with OutputLock(out, "translate.infer"):
        message = _fails(infer.main, ["--ckpt", str(tiny_ckpt), "-i", str(demo_dir / "test.en"), "-o", str(out)])
    assert "another run is writing it (translate.infer, pid" in message and f"lock file {out}.lock" in message
    assert not out.exists()
    avg = tmp_path / "avg.ckpt"
    with OutputLock(avg, "translate.average"):
        message = _fails(average.main, ["--ckpts", str(tiny_ckpt), "--output", str(avg)])
    assert "another run is writing it (translate.average" in message and not avg.exists()


def test_stale_temporaries_of_a_killed_run_are_removed(tiny_ckpt, demo_dir, tmp_path):
    out = tmp_path / "out.de"
    stale = tmp_path / ".out.de.4242.0.tmp"
    stale.write_text("cut short")
    infer.main(["--ckpt", str(tiny_ckpt), "-i", str(demo_dir / "test.en"), "-o", str(out), "--beam-size", "1"])
    assert not stale.exists() and _left_behind(tmp_path) == []
    assert len(out.read_text().splitlines()) == len((demo_dir / "test.en").read_text().splitlines())


def test_average_full_disk_keeps_the_earlier_file(tiny_ckpt, tmp_path, monkeypatch):
    out = tmp_path / "avg.ckpt"
    out.write_bytes(b"earlier")

    def disk_full(checkpoint, f, *a, **kw):
        Path(f).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(f))

    monkeypatch.setattr(average.torch, "save", disk_full)
    message = _fails(average.main, ["--ckpts", str(tiny_ckpt), "--output", str(out)])
    assert "no space left on the device" in message
    assert out.read_bytes() == b"earlier" and _left_behind(tmp_path) == []
