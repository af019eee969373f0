"""The alignment page of `python -m translate.infer --html` in a real headless browser (Playwright driving
Debian's `chromium`): it loads without console errors, shows the sentences, and never scrolls sideways at
1280 or 390 px (a wide heatmap scrolls inside its own box).

Without chromium or Playwright the tests skip, except under CI (CI=true), where they fail: CI must run
them (`.ci/run` installs chromium). `UPDATE_SCREENSHOTS=1` also copies the screenshots to docs/screenshots/.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from translate import infer

REPO = Path(__file__).resolve().parents[2]
WIDTHS = (1280, 390)
LONG = "the big dog sees the small cat and the happy woman visits her old friend near the house ."


def _browser_or_skip():
    """Playwright's sync API and the chromium path; skip (fail under CI) when either is missing."""
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
def browser() -> Iterator[object]:
    sync_playwright, chromium = _browser_or_skip()
    with sync_playwright() as p:
        # Never `playwright install`: no downloads at test time; --no-sandbox because CI runs as root.
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def align_page(demo_dir, train_tiny_checkpoint, tmp_path_factory) -> tuple[Path, list[str]]:
    """The page `translate.infer --html` writes for three demo lines and a long one."""
    out = tmp_path_factory.mktemp("align_page")
    ckpt, _ = train_tiny_checkpoint(demo_dir, out)
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:3] + [LONG]
    src = out / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    page = out / "translate_alignments.html"
    infer.main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out / "out.de"), "--beam", "2", "--html", str(page)])
    return page, lines


@pytest.mark.parametrize("width", WIDTHS)
def test_alignment_page_loads_and_fits_the_width(browser, align_page, width, tmp_path):
    page_path, lines = align_page
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(page_path.resolve().as_uri(), wait_until="load")
    seen = page.evaluate("({text: document.body.innerText, scroll: document.documentElement.scrollWidth,"
                         " inner: window.innerWidth})")
    shot = tmp_path / f"translate_alignments_{width}.png"
    page.screenshot(path=str(shot), full_page=True)
    page.close()
    assert errors == []
    assert seen["scroll"] <= seen["inner"] == width, "the page scrolls sideways"
    for line in lines:
        assert line in seen["text"]
    assert 0 < shot.stat().st_size < 400_000
    if os.environ.get("UPDATE_SCREENSHOTS"):
        (REPO / "docs" / "screenshots").mkdir(exist_ok=True)
        shutil.copyfile(shot, REPO / "docs" / "screenshots" / shot.name)
