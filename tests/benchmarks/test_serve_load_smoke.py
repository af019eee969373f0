"""Smoke test of benchmarks/serve_load.py: one setting on a tiny StreamRec checkpoint, both clients, flat JSON;
the two-setting summary (ratios, tables) on made-up figures."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("batch1", "dynamic")
CLIENTS = ("async", "threads")
FIGURES = ("rps", "p50_ms", "p95_ms", "p99_ms", "requests", "errors", "server_cpu_ms", "client_cpu_ms")


@pytest.fixture(scope="module")
def bench(benchmark_module) -> ModuleType:
    return benchmark_module("serve_load.py")


@pytest.mark.slow
def test_one_setting_writes_flat_json(run_benchmark, tiny_ckpt: Path) -> None:
    # One server start, measured by the async and then the threaded client: batch size 1, the setting no other
    # test serves over HTTP (tests/streamrec/test_serve.py batches). Both settings' summary: the test below.
    run = run_benchmark("serve_load.py", "--app", "streamrec", "--ckpt", tiny_ckpt, "--clients", "4", "--seconds",
                        "0.5", "--warmup", "0.2", "--threads", "1", "--k", "5", "--client", *CLIENTS,
                        "--setting", "batch1", timeout=600)  # a server start: a minute on busy cores
    figures = run.figures
    for client in CLIENTS:
        expected = {f"{client}_batch1_{f}" for f in FIGURES}
        assert expected <= figures.keys(), sorted(expected - figures.keys())
        assert not any(k.startswith(f"{client}_dynamic_") for k in figures)  # that server was not started
        assert f"{client}_throughput_ratio" not in figures  # nothing to compare with
        assert figures[f"{client}_batch1_errors"] == 0 and figures[f"{client}_batch1_requests"] > 0
        # percentiles of one run's latencies: ordered by definition, whatever the machine's load
        assert figures[f"{client}_batch1_p50_ms"] <= figures[f"{client}_batch1_p95_ms"] \
            <= figures[f"{client}_batch1_p99_ms"]
        assert figures[f"{client}_batch1_server_cpu_ms"] > 0 and figures[f"{client}_batch1_client_cpu_ms"] >= 0
        assert f"4 clients ({client})" in run.stdout
    assert {"clients", "seconds"} <= figures.keys()
    assert figures["async_client"] == 1 and figures["threads_client"] == 1


def test_both_settings_are_summarised_with_ratios(bench: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "x.ckpt").touch()
    args = bench.parse_args(["--ckpt", str(tmp_path / "x.ckpt"), "--client", *CLIENTS])
    assert args.setting == list(SETTINGS)  # both by default
    figures: dict[str, float] = {}
    for i, (client, setting) in enumerate((c, s) for c in CLIENTS for s in SETTINGS):
        figures.update({f"{client}_{setting}_{f}": float(i + j + 1) for j, f in enumerate(FIGURES)})
    out = io.StringIO()
    bench.report(Console(file=out, width=200), args, figures, {c: f"{c}_" for c in CLIENTS})
    for client in CLIENTS:
        assert figures[f"{client}_throughput_ratio"] == pytest.approx(figures[f"{client}_dynamic_rps"]
                                                                     / figures[f"{client}_batch1_rps"])
        assert figures[f"{client}_server_cpu_ratio"] == pytest.approx(figures[f"{client}_batch1_server_cpu_ms"]
                                                                     / figures[f"{client}_dynamic_server_cpu_ms"])
        assert f"dynamic batching ({client} clients):" in out.getvalue()
    assert "batch size 1" in out.getvalue() and "dynamic, <= 32, 2 ms" in out.getvalue()


def test_a_client_or_setting_named_twice_is_refused(benchmark_refuses) -> None:
    assert "name each client once" in benchmark_refuses("serve_load.py", "--client", "async", "async")
    assert "name each setting once" in benchmark_refuses("serve_load.py", "--setting", "batch1", "batch1")


def test_without_a_checkpoint_it_says_how_to_make_one() -> None:
    res = subprocess.run([sys.executable, "benchmarks/serve_load.py", "--app", "streamrec"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "make demo" in res.stderr and "--ckpt" in res.stderr
