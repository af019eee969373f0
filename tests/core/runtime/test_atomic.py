"""core.runtime.atomic: a file appears whole or not at all, and a failed write keeps the old one."""

import os
from pathlib import Path

import pytest

from core.runtime.atomic import atomic_path


def test_success_renames_into_place_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    with atomic_path(target) as tmp:
        tmp.write_text("new")
        assert tmp.parent == tmp_path and tmp != target
        assert not target.exists()  # nothing visible before the block ends
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_failure_keeps_the_previous_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"out\.txt: the output folder .*nope does not exist"):
        with atomic_path(tmp_path / "nope" / "out.txt"):
            pass


def test_two_writers_of_one_target_in_one_process_do_not_share_a_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a"
    with atomic_path(target) as outer:
        outer.write_text("outer")
        with atomic_path(target) as inner:
            inner.write_text("inner")
        assert target.read_text() == "inner"
    assert target.read_text() == "outer"  # a shared temporary would have been consumed by the inner rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


@pytest.mark.skipif(os.name != "posix", reason="file modes")
def test_result_gets_umask_permissions_not_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "out.txt") as tmp:
            tmp.write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o644


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real.name)
    with atomic_path(link) as tmp:
        tmp.write_text("new")
    assert link.is_symlink() and os.readlink(link) == "real.txt"
    assert real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_a_fifo_is_written_directly_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with atomic_path(fifo) as tmp:
        assert tmp == fifo
    assert fifo.is_fifo()  # still the pipe a reader may be waiting on
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_folder_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    folder = tmp_path / "sub"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=r"sub: is a folder"), atomic_path(folder):
        pytest.fail("the block must not run")
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_atomic_folder_files_moves_the_companions_and_cleans_up(tmp_path) -> None:
    from core.runtime.atomic import atomic_folder_files

    target = tmp_path / "model.onnx"
    with atomic_folder_files(target) as tmp:
        assert tmp.name == "model.onnx" and tmp.parent != tmp_path
        tmp.write_text("graph")
        tmp.with_name("model.onnx.data").write_text("weights")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
    try:
        with atomic_folder_files(tmp_path / "other.onnx") as tmp:
            tmp.write_text("half")
            raise RuntimeError("the writer failed")
    except RuntimeError:
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]  # nothing left over
