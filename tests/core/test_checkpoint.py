"""core.checkpoint: a wrong path or a file that is not a checkpoint is one line naming it."""

from pathlib import Path

import pytest
import torch

from core.checkpoint import read_checkpoint_file


def test_reads_what_torch_save_wrote(tmp_path: Path) -> None:
    state = {"state_dict": {"w": torch.arange(3.0)}, "hyper_parameters": {"d_model": 8}}
    torch.save(state, tmp_path / "a.ckpt")
    loaded = read_checkpoint_file(tmp_path / "a.ckpt", written_by="python -m translate fit")
    assert torch.equal(loaded["state_dict"]["w"], state["state_dict"]["w"])
    assert loaded["hyper_parameters"] == state["hyper_parameters"]


def test_missing_file_names_it_and_the_command_that_writes_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.ckpt: checkpoint not found; .*`python -m streamrec fit`"):
        read_checkpoint_file(tmp_path / "nope.ckpt", written_by="python -m streamrec fit")


@pytest.mark.parametrize("content", [b"", b"not a checkpoint\n", b"PK\x03\x04garbage"])
def test_unreadable_file_is_one_line_naming_it(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "bad.ckpt").write_bytes(content)
    with pytest.raises(ValueError, match=r"bad\.ckpt: not a readable PyTorch checkpoint") as info:
        read_checkpoint_file(tmp_path / "bad.ckpt", written_by="python -m translate fit")
    assert "\n" not in str(info.value)
    assert info.value.__cause__ is None  # `from None`: the CLI shows this line, not torch's traceback chain


def test_a_folder_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        read_checkpoint_file(tmp_path, written_by="python -m translate fit")
