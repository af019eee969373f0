"""configs/overlays/: added after a data set's YAML, each sets what it promises and nothing else, for both apps.

Lightning's FSDPStrategy refuses CPU accelerators ("requires a GPU accelerator"), so fsdp.yaml is checked here
by building its strategy object, not by training; ddp.yaml builds a DDP trainer over two CPU processes (the
DDP training itself is tested in tests/streamrec/test_ddp_training.py and tests/translate/test_cli.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, Strategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from core.nn.blocks import DecoderLayer, EncoderLayer
from streamrec.lightning_cli import build_cli

sys.path.insert(0, str(Path(__file__).parent))
import program_help  # noqa: E402 (by name: one cache of the printed configs for this file and test_configs)

REPO = Path(__file__).resolve().parents[1]
OVERLAYS = REPO / "configs" / "overlays"
DATA_SETS = {"streamrec": ["demo", "ml1m", "beauty"], "translate": ["demo", "multi30k_en_de"]}
CASES = [(app, name) for app, names in DATA_SETS.items() for name in names]


def _printed(app: str, configs: list[Path]) -> dict:
    """What `fit --print_config` prints for the configs (tests/test_configs.py prints the data sets alone too)."""
    return program_help.printed_config(app, configs)


@pytest.mark.parametrize(("app", "name"), CASES, ids=lambda x: x)
def test_the_gpu_overlay_sets_gpu_bf16_and_compile_and_keeps_the_rest(app, name):
    data_set = REPO / "configs" / app / f"{name}.yaml"
    before = _printed(app, [data_set])
    after = _printed(app, [data_set, OVERLAYS / "gpu.yaml"])
    want = {("trainer", "accelerator"): "gpu", ("trainer", "devices"): 1, ("trainer", "precision"): "bf16-mixed",
            ("model", "speed", "compile"): "default", ("model", "speed", "cpu_fastpath"): False}
    for (*sections, key), value in want.items():
        got, was = after, before
        for section in sections:
            got, was = got[section], was[section]
        assert got[key] == value, ".".join((*sections, key))
        was[key] = value
    assert after == before  # nothing else changed


# The data sets the overlays' own comments run them on: an overlay sets trainer keys no data set sets (the gpu
# overlay's test above reads every data set), so the stack is the same on the others.
@pytest.mark.parametrize(("app", "name"), [("streamrec", "ml1m"), ("translate", "multi30k_en_de")], ids=lambda x: x)
@pytest.mark.parametrize(("overlay", "strategy"), [("ddp.yaml", "DDPStrategy"), ("fsdp.yaml", "FSDPStrategy")])
def test_the_multi_device_overlays_stack_on_the_gpu_overlay(app, name, overlay, strategy):
    data_set = REPO / "configs" / app / f"{name}.yaml"
    for data_name in DATA_SETS[app]:  # what the comment above relies on
        own = yaml.safe_load((REPO / "configs" / app / f"{data_name}.yaml").read_text(encoding="utf-8"))
        assert not {"strategy", "devices"} & set((own or {}).get("trainer") or {}), data_name
    gpu = _printed(app, [data_set, OVERLAYS / "gpu.yaml"])
    stacked = _printed(app, [data_set, OVERLAYS / "gpu.yaml", OVERLAYS / overlay])
    trainer = stacked["trainer"]
    assert trainer["strategy"]["class_path"] == f"lightning.pytorch.strategies.{strategy}"
    assert (trainer["accelerator"], trainer["devices"], trainer["precision"]) == ("gpu", "auto", "bf16-mixed")
    gpu["trainer"]["strategy"], gpu["trainer"]["devices"] = trainer["strategy"], "auto"
    assert stacked == gpu  # nothing else changed


def test_the_ddp_overlay_builds_a_ddp_trainer_on_two_cpu_processes(tiny_log, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = build_cli(["--config", str(REPO / "configs" / "streamrec" / "demo.yaml"), "--config",
                     str(OVERLAYS / "ddp.yaml"), "--data.path", str(tiny_log), "--data.format", "csv",
                     "--trainer.accelerator", "cpu", "--trainer.devices", "2"], run=False)
    assert type(cli.trainer.strategy) is DDPStrategy and cli.trainer.num_devices == 2
    assert cli.trainer.strategy._ddp_kwargs["gradient_as_bucket_view"] is True


def test_the_fsdp_overlay_builds_an_fsdp_strategy_wrapping_each_block():
    printed = _printed("translate", [REPO / "configs" / "translate" / "demo.yaml", OVERLAYS / "fsdp.yaml"])
    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy)
    strategy = parser.instantiate_classes(parser.parse_object({"strategy": printed["trainer"]["strategy"]})).strategy
    assert type(strategy) is FSDPStrategy
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy) and policy._module_classes == {EncoderLayer, DecoderLayer}
    assert strategy.kwargs["use_orig_params"] is True  # torch.compile and the tied embeddings need it
    assert strategy.sharding_strategy.name == "FULL_SHARD" and strategy._state_dict_type == "full"
