"""Fixtures every test folder shares: files built once per run for every xdist worker (the demo data scripts,
a tiny StreamRec log and checkpoint, a Translate demo corpus and tiny translators), hostile checkpoints that would
run code if unpickled, and a headless browser for the HTML pages."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from filelock import FileLock

from core.runtime.errors import skip_exit_collection

REPO = Path(__file__).resolve().parents[1]

# One thread per test process and per program a test starts: the suite runs one xdist worker per core, and a
# second thread per process only makes the workers and their child processes wait on each other.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
torch.set_num_threads(1)
skip_exit_collection()  # each xdist worker ends as the programs do, without walking every object it made
HOSTILE_KINDS = ("zip", "legacy", "in_hparams")


class _RunsCode:
    """Unpickling this calls os.system: the marker file appears only if a loader executed the pickle."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


@pytest.fixture
def hostile(tmp_path: Path) -> Callable[..., tuple[Path, Path]]:
    """`(kind, real=None) -> (checkpoint, marker)`: a .ckpt whose pickle would create `marker`.

    kind: "zip" (torch.save's format), "legacy" (the pre-1.6 format), or "in_hparams" (a real checkpoint,
    `real`, with the payload hidden inside its hyper-parameters dict).
    """

    def make(kind: str, real: Path | None = None) -> tuple[Path, Path]:
        marker = tmp_path / f"MARKER_{kind}"
        payload = _RunsCode(marker)
        path = tmp_path / f"hostile_{kind}.ckpt"
        if kind == "zip":
            torch.save({"state_dict": {}, "hyper_parameters": payload}, path)
        elif kind == "legacy":
            torch.save({"state_dict": {}, "x": payload}, path, _use_new_zipfile_serialization=False)
        elif kind == "in_hparams":
            assert real is not None, "in_hparams hides the payload inside a real checkpoint"
            state = torch.load(real, weights_only=True)
            state["hyper_parameters"] = {**state["hyper_parameters"], "lr": payload}
            torch.save(state, path)
        else:
            raise AssertionError(kind)
        return path, marker

    return make


def _assert_refused(message: str, path: Path, marker: Path) -> None:
    assert "\n" not in message.strip(), message
    assert str(path) in message and "refused" in message and "`posix.system`" in message, message
    assert "never executes code from checkpoints" in message
    assert not marker.exists(), "the checkpoint's code ran"


@pytest.fixture
def assert_refused() -> Callable[[str, Path, Path], None]:
    """`(message, checkpoint, marker)`: the refusal is one line naming the file and the global, and nothing ran."""
    return _assert_refused


def _exit_line(main: Callable[[list[str]], object], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code not in (0, None), "expected a failure exit"
    message = str(exit_.value.code)
    assert "\n" not in message.strip(), message
    return message


@pytest.fixture
def exit_line() -> Callable[[Callable[[list[str]], object], list[str]], str]:
    """`(main, argv) -> message`: a CLI entry point that must exit non-zero with exactly one line."""
    return _exit_line


# ----------------------------------------------------------------------------- built once per run
@pytest.fixture(scope="session")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[Path], object]], Path]:
    """`(key, build) -> folder`: `build(folder)` runs once per test run, in whichever xdist worker asks first.

    Each xdist worker has its own session fixtures, so a tiny model every worker trains would be trained once
    per worker; the pytest-xdist docs' pattern shares it instead: a folder under the run's common base
    temporary directory, built under a file lock. Tests read what it holds and never write into it.
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's folder, which workers share

    def get(key: str, build: Callable[[Path], object]) -> Path:
        folder = root / f"built-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        with FileLock(f"{folder}.lock"):
            if not (folder / ".built").exists():  # a worker that failed half-way left no marker: build again
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)
                (folder / ".built").touch()
        return folder

    return get


def _data_script(name: str) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "data" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def data_script() -> Callable[[str], ModuleType]:
    """`(name) -> module`: `data/NAME.py` imported (data/ is a folder of scripts, not a package)."""
    return _data_script


@pytest.fixture(scope="session")
def tiny_log(built_once) -> Path:
    """A small StreamRec demo log (81 users: an odd count, so DDP ranks cannot split it evenly)."""
    def build(folder: Path) -> None:
        demo = _data_script("make_streamrec_demo")
        demo.write_csv(demo.generate(users=81, items=40, seed=1, min_len=5, max_len=15), folder / "interactions.csv")

    return built_once("streamrec tiny_log", build) / "interactions.csv"


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_log, built_once) -> Path:
    """A StreamRec checkpoint written by a real (one-epoch) fit on `tiny_log`, as `python -m streamrec fit` would."""
    def build(folder: Path) -> None:
        import lightning as L

        from streamrec.data.datamodule import StreamRecDataModule
        from streamrec.model.module import StreamRecModule

        L.seed_everything(0, verbose=False)
        data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=32)
        module = StreamRecModule(num_items=data.num_items, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32)
        trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.fit(module, data)
        trainer.save_checkpoint(folder / "tiny.ckpt")

    return built_once(f"streamrec tiny_ckpt {tiny_log}", build) / "tiny.ckpt"


@pytest.fixture(scope="session")
def demo_dir(built_once) -> Path:
    """A small Translate demo corpus (300/30/30 pairs) written once per run."""
    def build(folder: Path) -> None:
        demo = _data_script("make_translate_demo")
        demo.write_corpus(demo.generate(train_size=300, val_size=30, test_size=30, seed=0), folder)

    return built_once("translate demo_dir", build)


def _translate_data(demo_dir: Path, out: Path, max_len: int):
    from translate.data.corpus import TranslationDataModule

    return TranslationDataModule(str(demo_dir / "train"), str(demo_dir / "val"), str(demo_dir / "test"),
                                 max_len=max_len, max_tokens=512, cache_dir=str(out / "spm"))


def _fit_tiny_translator(demo_dir: Path, out: Path, max_len: int, n_decoder_layers: int) -> None:
    """Fit a tiny translator for 20 steps on the demo corpus and save it as `out/tiny.ckpt` (vocab in out/spm)."""
    import lightning as L

    from translate.model.module import TranslationModule

    L.seed_everything(0, verbose=False)
    dm = _translate_data(demo_dir, out, max_len)
    module = TranslationModule(dm.src_vocab_size, dm.tgt_vocab_size, pad_id=dm.pad_id, max_len=max_len,
                               d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=n_decoder_layers, d_ff=32,
                               lr=3e-3, optimizer={"warmup_steps": 5})
    trainer = L.Trainer(max_steps=20, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, use_distributed_sampler=False)
    trainer.fit(module, dm)
    trainer.save_checkpoint(out / "tiny.ckpt")


@pytest.fixture(scope="session")
def train_tiny_checkpoint(built_once):
    """`(demo_dir, out, max_len=32, n_decoder_layers=1) -> (path, data module)`: a tiny translator from a real fit.

    Each (corpus, max_len, layers) is trained once per run; every caller gets its own copy in `out`
    (`out/tiny.ckpt`, its vocabulary in `out/spm`), so what a test writes beside it stays its own.
    """
    def train(demo_dir: Path, out: Path, max_len: int = 32, n_decoder_layers: int = 1):
        built = built_once(f"translate tiny {demo_dir} {max_len} {n_decoder_layers}",
                           lambda folder: _fit_tiny_translator(demo_dir, folder, max_len, n_decoder_layers))
        shutil.copytree(built, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".built"))
        return out / "tiny.ckpt", _translate_data(demo_dir, out, max_len)

    return train


# ----------------------------------------------------------------------------- a real browser for HTML pages


def _browser_or_skip():
    """Playwright's sync API and the chromium path; skip (fail under CI) when either is missing."""
    import shutil

    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if chromium and sync_playwright:
        return sync_playwright, chromium
    missing = "Debian's chromium (apt-get install chromium)" if not chromium else "playwright (pip install -e .[dev])"
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"browser test under CI, but {missing} is missing; .ci/run installs chromium")
    pytest.skip(f"needs {missing}")


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium through Playwright (skipped without it, failed under CI)."""
    sync_playwright, chromium = _browser_or_skip()
    with sync_playwright() as p:
        # Never `playwright install`: no downloads at test time; --no-sandbox because CI runs as root.
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def open_page(browser) -> Callable[[Path, int, Path], dict]:
    """`(path, width, screenshot) -> {text, scroll, inner, errors}`: the page loaded at a viewport `width` px
    wide, its text, widths and every console or page error; a full-page screenshot is saved. With
    UPDATE_SCREENSHOTS=1 the screenshot is also copied to docs/screenshots/."""

    def load(path: Path, width: int, screenshot: Path) -> dict:
        page = browser.new_page(viewport={"width": width, "height": 900})
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.goto(path.resolve().as_uri(), wait_until="load")
        seen = page.evaluate("({text: document.body.innerText, scroll: document.documentElement.scrollWidth,"
                             " inner: window.innerWidth})")
        page.screenshot(path=str(screenshot), full_page=True)
        page.close()
        if os.environ.get("UPDATE_SCREENSHOTS"):
            import shutil

            (REPO / "docs" / "screenshots").mkdir(exist_ok=True)
            shutil.copyfile(screenshot, REPO / "docs" / "screenshots" / screenshot.name)
        return {**seen, "errors": errors}

    return load


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files that hold `slow` tests (child processes, servers, training) first, each file's tests kept
    together in their order: the parallel workers then end on many short tests instead of one worker finishing
    a long test alone while the others wait. Module-scoped fixtures stay built once, since a file is not split."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the collection order otherwise
