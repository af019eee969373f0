"""Smoke test of benchmarks/serve_load.py: both settings on a tiny StreamRec checkpoint, a few clients, flat JSON."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("batch1", "dynamic")
FIGURES = ("rps", "p50_ms", "p95_ms", "p99_ms", "requests", "errors", "server_cpu_ms", "client_cpu_ms")


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint from a one-epoch fit on a small generated log (as tests/streamrec/conftest.py makes one)."""
    import lightning as L

    from streamrec.data.datamodule import StreamRecDataModule
    from streamrec.model.module import StreamRecModule

    name = "make_streamrec_demo"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "data" / "make_streamrec_demo.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up while it executes
        spec.loader.exec_module(sys.modules[name])
    demo = sys.modules[name]
    out = tmp_path_factory.mktemp("serve_load")
    demo.write_csv(demo.generate(users=60, items=40, seed=1, min_len=5, max_len=15), out / "log.csv")
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(out / "log.csv"), max_len=8, batch_size=32)
    module = StreamRecModule(num_items=data.num_items, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, data)
    trainer.save_checkpoint(out / "tiny.ckpt")
    return out / "tiny.ckpt"


@pytest.mark.slow
@pytest.mark.parametrize("client", ["async", "threads"])
def test_both_settings_write_flat_json(tiny_ckpt: Path, tmp_path: Path, client: str) -> None:
    out = tmp_path / "serve_load.json"
    cmd = [sys.executable, "benchmarks/serve_load.py", "--app", "streamrec", "--ckpt", str(tiny_ckpt), "--clients", "4",
           "--seconds", "3", "--warmup", "0.5", "--threads", "1", "--k", "5", "--client", client, "--json", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)  # two server starts: minutes on busy cores
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    for name, value in figures.items():
        assert type(value) in (int, float) and math.isfinite(value), (name, value)
    expected = {f"{s}_{f}" for s in SETTINGS for f in FIGURES} | {"throughput_ratio", "clients", "seconds"}
    assert expected <= figures.keys(), sorted(expected - figures.keys())
    for s in SETTINGS:
        assert figures[f"{s}_errors"] == 0 and figures[f"{s}_requests"] > 0
        assert figures[f"{s}_p50_ms"] <= figures[f"{s}_p95_ms"] <= figures[f"{s}_p99_ms"]
        assert figures[f"{s}_server_cpu_ms"] > 0 and figures[f"{s}_client_cpu_ms"] >= 0
    assert figures["throughput_ratio"] == pytest.approx(figures["dynamic_rps"] / figures["batch1_rps"])
    assert figures["async_client"] == (client == "async")
    assert "dynamic batching:" in res.stdout


def test_without_a_checkpoint_it_says_how_to_make_one() -> None:
    res = subprocess.run([sys.executable, "benchmarks/serve_load.py", "--app", "streamrec"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "make demo" in res.stderr and "--ckpt" in res.stderr
