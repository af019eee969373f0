"""What every benchmark smoke test does: run a script of benchmarks/ at a tiny size with `--json`, check that
it exits 0 and writes one flat JSON object of finite numbers, and check its one-line refusal of a bad argument.

Timings and memory peaks are measured on a shared machine: the tests check the figures' shape and the
quantities that do not depend on the machine (equal outputs, counts, sizes), never one measurement against
another. The StreamRec checkpoint they score is the `tiny_ckpt` every test folder shares (tests/conftest.py).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _command(script: str, args: tuple[object, ...]) -> list[str]:
    return [sys.executable, f"benchmarks/{script}", *map(str, args)]


@pytest.fixture(scope="session")
def benchmark_fork_server() -> Iterator[forkserver.ForkServer]:
    """The fork server of the scripts run in this process, apart from the suite's (which keeps the preloads other
    tests gave it); started by the first script that measures in a fresh process, with that script's preloads."""
    server = forkserver.ForkServer()
    yield server
    server._stop()


@pytest.fixture
def run_benchmark(tmp_path: Path, capsys, monkeypatch, benchmark_fork_server) -> Callable[..., SimpleNamespace]:
    """`(script, *args, timeout=300, in_process=False) -> (figures, stdout, json)`: `benchmarks/SCRIPT ARGS --json
    FILE` run to the end; its figures are a flat JSON object of finite ints and floats.

    `in_process`: call the script's `main(argv)` in this process instead of a child (which would import torch
    and the apps again), for scripts that neither fork this process nor keep state beyond their torch threads
    (restored here). A script that measures memory in a fresh process (`_common.in_fresh_process`) forks from
    `benchmark_fork_server`.
    """

    def run(script: str, *args: object, timeout: float = 300, in_process: bool = False) -> SimpleNamespace:
        out = tmp_path / f"{Path(script).stem}.json"
        argv = [*map(str, args), "--json", str(out)]
        if in_process:
            module = import_benchmark(script)
            monkeypatch.chdir(ROOT)
            capsys.readouterr()
            monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the fork server's children unpickle its functions
            for name in ("ensure_running", "connect_to_new_process", "set_forkserver_preload"):
                monkeypatch.setattr(forkserver, name, getattr(benchmark_fork_server, name))
            threads = torch.get_num_threads()
            gc.freeze()  # the scripts' gc.collect() before each memory probe skips this process's heap, not theirs
            try:
                module.main(argv)
            finally:
                gc.unfreeze()
                torch.set_num_threads(threads)
            stdout = capsys.readouterr().out
        else:
            res = subprocess.run([*_command(script, ()), *argv], cwd=ROOT, capture_output=True, text=True,
                                 timeout=timeout)
            assert res.returncode == 0, res.stderr[-3000:]
            stdout = res.stdout
        figures = json.loads(out.read_text())
        assert isinstance(figures, dict)
        for name, value in figures.items():
            assert type(value) in (int, float) and math.isfinite(value), (name, value)
        return SimpleNamespace(figures=figures, stdout=stdout, json=out)

    return run


@pytest.fixture(scope="session")
def python3_shim(tmp_path_factory) -> Iterator[Path]:
    """A folder holding a `python3` whose runs fork from a process that imported torch, lightning and the other
    costly third-party modules once (tests/benchmarks/fork_server.py): for scripts whose fresh interpreters are
    their design but not what their smoke test checks."""
    folder = tmp_path_factory.mktemp("python3_shim")
    address = str(folder / "socket")
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fork_server.py")), address],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline() == "ready\n", "the fork server did not start"
        _load_fork_server().write_shim(folder, address)
        yield folder
    finally:
        server.terminate()
        server.wait(timeout=30)


def _load_fork_server() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmarks_fork_server", Path(__file__).with_name("fork_server.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_benchmark(script: str) -> ModuleType:
    """`benchmarks/SCRIPT` imported as a module of its own name, with benchmarks/ on the path for its `_common`."""
    name = Path(script).stem
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture(scope="session")
def benchmark_module() -> Callable[[str], ModuleType]:
    """`import_benchmark`, for tests that call a script's functions directly."""
    return import_benchmark


@pytest.fixture
def benchmark_refuses(capsys) -> Callable[..., str]:
    """`(script, *args) -> stderr`: the script's `main(args)` refuses its arguments (exit status 2, argparse's) and
    says why. In this process: argparse refuses before any work, and a child would import torch again."""

    def run(script: str, *args: object) -> str:
        module = import_benchmark(script)
        capsys.readouterr()
        threads = torch.get_num_threads()
        try:
            with pytest.raises(SystemExit) as exit_:
                module.main([str(a) for a in args])
        finally:
            torch.set_num_threads(threads)
        err = capsys.readouterr().err
        assert exit_.value.code == 2, (exit_.value.code, err[-3000:])
        return err

    return run
