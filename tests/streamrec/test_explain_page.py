"""The "because you watched" page in a real headless browser (Playwright driving Debian's `chromium`):
it loads without console errors, shows the items' titles, and never scrolls sideways at 1280 or 390 px.

Without chromium or Playwright the tests skip, except under CI (CI=true), where they fail: CI must run
them (`.ci/run` installs chromium). `UPDATE_SCREENSHOTS=1` also copies the screenshots to docs/screenshots/.
"""

from __future__ import annotations

import csv
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamrec import explain
from streamrec.data import read_interactions

REPO = Path(__file__).resolve().parents[2]
WIDTHS = (1280, 390)
LONG_WORD = "Extraordinarilylongunbrokenmetadatavalue" * 2  # must wrap, not widen the page


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


def open_page(browser, path: Path, width: int, screenshot: Path) -> dict:
    """Load `path` at a viewport `width` px wide: its text, widths and every console or page error."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(path.resolve().as_uri(), wait_until="load")
    seen = page.evaluate("({text: document.body.innerText, scroll: document.documentElement.scrollWidth,"
                         " inner: window.innerWidth})")
    page.screenshot(path=str(screenshot), full_page=True)
    page.close()
    return {**seen, "errors": errors}


def _keep_screenshot(shot: Path) -> None:
    if os.environ.get("UPDATE_SCREENSHOTS"):
        (REPO / "docs" / "screenshots").mkdir(exist_ok=True)
        shutil.copyfile(shot, REPO / "docs" / "screenshots" / shot.name)


@pytest.fixture(scope="module")
def explain_page(demo, tiny_ckpt, tiny_log, tmp_path_factory) -> tuple[Path, dict[str, str], str]:
    """The page `python -m streamrec.explain --items` writes for the user with the longest history."""
    out = tmp_path_factory.mktemp("explain_page")
    items = out / "items.csv"
    with items.open("w", newline="", encoding="utf-8") as f:  # the demo catalogue plus a long unbroken value
        writer = csv.writer(f)
        writer.writerow(["item_id", "title", "genre", "note"])
        for it in demo.make_catalogue(40, seed=1):
            writer.writerow([it.item_id, it.title, f"genre{it.genre:02d}", LONG_WORD])
    titles = {it.item_id: it.title for it in demo.make_catalogue(40, seed=1)}
    histories = read_interactions(tiny_log).items
    user = max(histories, key=lambda u: len(histories[u]))
    page = out / "streamrec_explain.html"
    explain.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--user", user, "--html", str(page),
                  "--items", str(items), "--top-k", "5"])
    return page, titles, user


@pytest.mark.parametrize("width", WIDTHS)
def test_explain_page_shows_titles_and_fits_the_width(browser, explain_page, width, tmp_path):
    page, titles, user = explain_page
    shot = tmp_path / f"streamrec_explain_{width}.png"
    seen = open_page(browser, page, width, shot)
    assert seen["errors"] == []
    assert seen["scroll"] <= seen["inner"] == width, "the page scrolls sideways"
    assert f"user {user}" in seen["text"]
    html = page.read_text(encoding="utf-8")
    shown = [item for item in titles if f"({item})" in html]  # an item shown by title is followed by its id
    assert len(shown) >= 5  # the history and the recommendations
    for item in shown:
        assert titles[item] in seen["text"]
    assert "genre" in seen["text"]  # the metadata
    assert 0 < shot.stat().st_size < 400_000
    _keep_screenshot(shot)
