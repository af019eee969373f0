"""Smoke test of benchmarks/serve_load.py: both settings on a tiny StreamRec checkpoint, a few clients, flat JSON."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("batch1", "dynamic")
CLIENTS = ("async", "threads")
FIGURES = ("rps", "p50_ms", "p95_ms", "p99_ms", "requests", "errors", "server_cpu_ms", "client_cpu_ms")


@pytest.mark.slow
def test_both_settings_write_flat_json(run_benchmark, tiny_ckpt: Path) -> None:
    # Both clients in one run: each of the two server starts is measured by the async and then the threaded client.
    run = run_benchmark("serve_load.py", "--app", "streamrec", "--ckpt", tiny_ckpt, "--clients", "4", "--seconds",
                        "0.5", "--warmup", "0.2", "--threads", "1", "--k", "5", "--client", *CLIENTS,
                        timeout=600)  # two server starts: minutes on busy cores
    figures = run.figures
    for client in CLIENTS:
        expected = {f"{client}_{s}_{f}" for s in SETTINGS for f in FIGURES} | {f"{client}_throughput_ratio"}
        assert expected <= figures.keys(), sorted(expected - figures.keys())
        for s in SETTINGS:
            assert figures[f"{client}_{s}_errors"] == 0 and figures[f"{client}_{s}_requests"] > 0
            # percentiles of one run's latencies: ordered by definition, whatever the machine's load
            assert figures[f"{client}_{s}_p50_ms"] <= figures[f"{client}_{s}_p95_ms"] <= figures[f"{client}_{s}_p99_ms"]
            assert figures[f"{client}_{s}_server_cpu_ms"] > 0 and figures[f"{client}_{s}_client_cpu_ms"] >= 0
        assert figures[f"{client}_throughput_ratio"] == pytest.approx(figures[f"{client}_dynamic_rps"]
                                                                     / figures[f"{client}_batch1_rps"])
        assert f"dynamic batching ({client} clients):" in run.stdout
    assert {"clients", "seconds"} <= figures.keys()
    assert figures["async_client"] == 1 and figures["threads_client"] == 1


def test_a_client_named_twice_is_refused(benchmark_refuses) -> None:
    assert "name each client once" in benchmark_refuses("serve_load.py", "--client", "async", "async")


def test_without_a_checkpoint_it_says_how_to_make_one() -> None:
    res = subprocess.run([sys.executable, "benchmarks/serve_load.py", "--app", "streamrec"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "make demo" in res.stderr and "--ckpt" in res.stderr
