"""core.runtime.checkpoint: a wrong path or a file that is not a checkpoint is one line naming it; every config's
checkpoint callbacks keep a last.ckpt to resume from."""

from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from core.runtime.checkpoint import checkpoint_mismatch, load_checkpoint, stale_last_checkpoint_warnings
from core.runtime.cli import config_chain


def test_reads_what_torch_save_wrote(tmp_path: Path) -> None:
    state = {"state_dict": {"w": torch.arange(3.0)}, "hyper_parameters": {"d_model": 8}}
    torch.save(state, tmp_path / "a.ckpt")
    loaded = load_checkpoint(tmp_path / "a.ckpt", written_by="python -m translate fit")
    assert torch.equal(loaded["state_dict"]["w"], state["state_dict"]["w"])
    assert loaded["hyper_parameters"] == state["hyper_parameters"]


def test_missing_file_names_it_and_the_command_that_writes_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.ckpt: checkpoint not found; .*`python -m streamrec fit`"):
        load_checkpoint(tmp_path / "nope.ckpt", written_by="python -m streamrec fit")


@pytest.mark.parametrize("content", [b"", b"not a checkpoint\n", b"PK\x03\x04garbage"])
def test_unreadable_file_is_one_line_naming_it(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "bad.ckpt").write_bytes(content)
    with pytest.raises(ValueError, match=r"bad\.ckpt: not a readable PyTorch checkpoint") as info:
        load_checkpoint(tmp_path / "bad.ckpt", written_by="python -m translate fit")
    assert "\n" not in str(info.value)
    assert info.value.__cause__ is None  # `from None`: the CLI shows this line, not torch's traceback chain


def test_a_folder_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_checkpoint(tmp_path, written_by="python -m translate fit")


# The data sets' training configs: `predict_*.yaml` are overlays that replace the checkpoint callbacks with a
# writer, an overlay with no `trainer` section (large_catalogue.yaml) leaves the run config's callbacks as they
# are, `configs/overlays/` (hardware and strategy) sets no callbacks, and each `base.yaml` is checked through the
# data sets that build on it.
CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[3] / "configs").glob("*/*.yaml")
                 if not p.name.startswith("predict_") and p.name != "base.yaml" and p.parent.name != "overlays"
                 and "trainer" in (yaml.safe_load(p.read_text()) or {}))


def _trainer(config: Path) -> dict:
    """The `trainer` section of `config` read after its bases: a later file's key wins, a `key+` list appends."""
    trainer: dict = {}
    for name in config_chain(str(config)):
        for key, value in (yaml.safe_load(Path(name).read_text()) or {}).get("trainer", {}).items():
            dest = key.removesuffix("+")
            trainer[dest] = trainer.get(dest, []) + value if key.endswith("+") else value
    return trainer


class _WorseEveryEpoch(LightningModule):
    """Logs each monitored metric worse every epoch, so a best-metric checkpoint stays at epoch 0."""

    def __init__(self, monitors: dict[str, str]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.monitors = monitors

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).square().mean()

    def validation_step(self, batch, batch_idx):
        for name, mode in self.monitors.items():
            self.log(name, float(self.current_epoch) * (-1.0 if mode == "max" else 1.0))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_config_rewrites_last_ckpt_every_epoch(config: Path, tmp_path: Path) -> None:
    """`fit --ckpt_path .../last.ckpt` must resume from the latest epoch, not the best one: since Lightning 2.6
    `save_last` on a monitored ModelCheckpoint writes last.ckpt only when that callback saves a new best."""
    callbacks, monitors = [], {}
    trainer = _trainer(config)
    for spec in trainer["callbacks"]:
        if spec["class_path"].rsplit(".", 1)[-1] != "ModelCheckpoint":
            continue
        dirpath = spec["init_args"]["dirpath"].replace("${trainer.default_root_dir}", trainer["default_root_dir"])
        args = dict(spec["init_args"], dirpath=str(tmp_path / dirpath))
        if args.get("monitor") not in (None, "step", "epoch"):
            monitors[args["monitor"]] = args.get("mode", "min")
        callbacks.append(ModelCheckpoint(**args))
    assert monitors, f"{config.name}: no best-metric checkpoint"
    assert stale_last_checkpoint_warnings(callbacks) == []
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    Trainer(max_epochs=3, callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
            accelerator="cpu", devices=1, num_sanity_val_steps=0).fit(_WorseEveryEpoch(monitors), data, data)
    (last,) = tmp_path.rglob("last.ckpt")
    assert f"--ckpt_path {last.relative_to(tmp_path)}" in config.read_text()  # the resume command the file prints
    assert torch.load(last, weights_only=True)["epoch"] == 2


@pytest.mark.parametrize("save_last", [True, "link"])
def test_the_warning_names_a_callback_whose_last_ckpt_goes_stale(save_last, tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_bleu", mode="max", save_last=save_last)
    (line,) = stale_last_checkpoint_warnings([callback, ModelCheckpoint(dirpath=tmp_path, filename="last")])
    assert "val_bleu" in line and "filename: last" in line and "\n" not in line
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    Trainer(max_epochs=3, callbacks=[callback], logger=False, enable_progress_bar=False, enable_model_summary=False,
            accelerator="cpu", devices=1, num_sanity_val_steps=0).fit(_WorseEveryEpoch({"val_bleu": "max"}), data, data)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["epoch"] == 0  # what the warning says: stale


def test_no_warning_where_every_epoch_is_saved(tmp_path: Path) -> None:
    assert stale_last_checkpoint_warnings([ModelCheckpoint(dirpath=tmp_path, monitor="step", save_top_k=-1,
                                                           save_last=True)]) == []


class _Tied(LightningModule):
    """A module with a tied weight, a computed buffer and a checkpoint-only buffer, like our two apps."""

    def __init__(self, vocab: int = 11, width: int = 6):
        super().__init__()
        self.save_hyperparameters()
        self.embed = torch.nn.Embedding(vocab, width)
        self.norm = torch.nn.LayerNorm(width)
        self.out = torch.nn.Linear(width, vocab, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("table", torch.arange(vocab, dtype=torch.float32).sin(), persistent=False)
        self.register_buffer("counts", torch.zeros(vocab))


def test_load_module_equals_building_and_copying_and_keeps_ties(tmp_path: Path) -> None:
    from core.runtime.checkpoint import load_module

    torch.manual_seed(0)
    trained = _Tied()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p))
        trained.counts.add_(3)
    path = tmp_path / "m.ckpt"
    torch.save({"hyper_parameters": dict(trained.hparams), "state_dict": trained.state_dict()}, path)

    loaded, _ = load_module(_Tied, path, "python -m tied fit", "Tied")
    reference = _Tied()  # the plain way: random init, then copy
    reference.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    for (name, a), (_, b) in zip(loaded.state_dict(keep_vars=True).items(), reference.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(loaded.table, reference.table)  # computed in the constructor, not in the checkpoint
    assert loaded.out.weight is loaded.embed.weight  # still one Parameter
    assert not loaded.training
    # The initialisers are restored after loading.
    assert not torch.equal(torch.nn.init.normal_(torch.zeros(4)), torch.zeros(4))


def test_load_module_with_mmap_maps_the_weights_from_the_file(tmp_path: Path) -> None:
    """The same module, its weights backed by the checkpoint file (pages read when touched), ties kept."""
    import os

    from core.runtime.checkpoint import load_module

    torch.manual_seed(0)
    path = tmp_path / "m.ckpt"
    torch.save({"hyper_parameters": {"vocab": 50, "width": 4}, "state_dict": _Tied(50, 4).state_dict()}, path)
    plain, _ = load_module(_Tied, path, "python -m tied fit", "Tied")
    mapped, _ = load_module(_Tied, path, "python -m tied fit", "Tied", mmap=True)
    for (name, a), (_, b) in zip(mapped.state_dict().items(), plain.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert mapped.out.weight is mapped.embed.weight
    if os.path.exists("/proc/self/maps"):  # Linux: the weight's address lies in a mapping of the file
        ptr, real = mapped.embed.weight.data_ptr(), os.path.realpath(path)
        spans = [line.split()[0].split("-") for line in open("/proc/self/maps") if line.rstrip().endswith(real)]
        assert any(int(lo, 16) <= ptr < int(hi, 16) for lo, hi in spans)
        assert not any(int(lo, 16) <= plain.embed.weight.data_ptr() < int(hi, 16) for lo, hi in spans)


def test_checkpoint_mismatch_names_the_first_tensor_that_keeps_it_from_loading():
    ours = {"a.weight": torch.zeros(4, 2), "b.bias": torch.zeros(3)}
    assert checkpoint_mismatch(ours, {"a.weight": torch.ones(4, 2), "b.bias": torch.ones(3)}) is None
    shape = checkpoint_mismatch(ours, {"a.weight": torch.ones(5, 2), "b.bias": torch.ones(2)}, "x.ckpt")
    assert shape == ("checkpoint x.ckpt does not fit this model: a.weight is 5 x 2 there but 4 x 2 here (and 1 more); "
                     "it was trained on other data or settings: pass the config and data it was trained with")
    assert "it has no b.bias;" in checkpoint_mismatch(ours, {"a.weight": torch.ones(4, 2)})
    extra = {"a.weight": torch.ones(4, 2), "b.bias": torch.ones(3), "c": torch.ones(())}
    assert "it has c, which this model does not;" in checkpoint_mismatch(ours, extra)
    assert checkpoint_mismatch(ours, {"a.weight": torch.ones(4, 2)}, strict=False) is None  # as load_state_dict
    assert checkpoint_mismatch(ours, extra, strict=False) is None
    # load_state_dict agrees on which of these load
    m = torch.nn.Module()
    m.a, m.b = torch.nn.Linear(2, 4, bias=False), torch.nn.Module()
    m.b.bias = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(RuntimeError):
        m.load_state_dict({"a.weight": torch.ones(5, 2), "b.bias": torch.ones(3)})
    m.load_state_dict({"a.weight": torch.ones(4, 2)}, strict=False)
