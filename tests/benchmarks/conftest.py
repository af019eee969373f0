"""What every benchmark smoke test does: run a script of benchmarks/ at a tiny size with `--json`, check that
it exits 0 and writes one flat JSON object of finite numbers, and check its one-line refusal of a bad argument.

Timings and memory peaks are measured on a shared machine: the tests check the figures' shape and the
quantities that do not depend on the machine (equal outputs, counts, sizes), never one measurement against
another. The StreamRec checkpoint they score is the `tiny_ckpt` every test folder shares (tests/conftest.py).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _command(script: str, args: tuple[object, ...]) -> list[str]:
    return [sys.executable, f"benchmarks/{script}", *map(str, args)]


@pytest.fixture
def run_benchmark(tmp_path: Path) -> Callable[..., SimpleNamespace]:
    """`(script, *args, timeout=300) -> (figures, stdout, json)`: `benchmarks/SCRIPT ARGS --json FILE` run to the end;
    its figures are a flat JSON object of finite ints and floats."""

    def run(script: str, *args: object, timeout: float = 300) -> SimpleNamespace:
        out = tmp_path / f"{Path(script).stem}.json"
        res = subprocess.run([*_command(script, args), "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                             timeout=timeout)
        assert res.returncode == 0, res.stderr[-3000:]
        figures = json.loads(out.read_text())
        assert isinstance(figures, dict)
        for name, value in figures.items():
            assert type(value) in (int, float) and math.isfinite(value), (name, value)
        return SimpleNamespace(figures=figures, stdout=res.stdout, json=out)

    return run


@pytest.fixture
def benchmark_refuses() -> Callable[..., str]:
    """`(script, *args) -> stderr`: the script refuses its arguments (exit status 2, argparse's) and says why."""

    def run(script: str, *args: object) -> str:
        res = subprocess.run(_command(script, args), cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
        return res.stderr

    return run

