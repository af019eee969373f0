"""Smoke test of benchmarks/serve_load.py: both settings on a tiny StreamRec checkpoint, a few clients, flat JSON."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("batch1", "dynamic")
FIGURES = ("rps", "p50_ms", "p95_ms", "p99_ms", "requests", "errors", "server_cpu_ms", "client_cpu_ms")


@pytest.mark.slow
@pytest.mark.parametrize("client", ["async", "threads"])
def test_both_settings_write_flat_json(run_benchmark, tiny_ckpt: Path, client: str) -> None:
    run = run_benchmark("serve_load.py", "--app", "streamrec", "--ckpt", tiny_ckpt, "--clients", "4", "--seconds", "1",
                        "--warmup", "0.2", "--threads", "1", "--k", "5", "--client", client,
                        timeout=600)  # two server starts: minutes on busy cores
    figures = run.figures
    expected = {f"{s}_{f}" for s in SETTINGS for f in FIGURES} | {"throughput_ratio", "clients", "seconds"}
    assert expected <= figures.keys(), sorted(expected - figures.keys())
    for s in SETTINGS:
        assert figures[f"{s}_errors"] == 0 and figures[f"{s}_requests"] > 0
        # percentiles of one run's latencies: ordered by definition, whatever the machine's load
        assert figures[f"{s}_p50_ms"] <= figures[f"{s}_p95_ms"] <= figures[f"{s}_p99_ms"]
        assert figures[f"{s}_server_cpu_ms"] > 0 and figures[f"{s}_client_cpu_ms"] >= 0
    assert figures["throughput_ratio"] == pytest.approx(figures["dynamic_rps"] / figures["batch1_rps"])
    assert figures["async_client"] == (client == "async")
    assert "dynamic batching:" in run.stdout


def test_without_a_checkpoint_it_says_how_to_make_one() -> None:
    res = subprocess.run([sys.executable, "benchmarks/serve_load.py", "--app", "streamrec"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "make demo" in res.stderr and "--ckpt" in res.stderr
