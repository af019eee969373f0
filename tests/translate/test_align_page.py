"""The alignment page of `python -m translate.infer --html` in a real headless browser (Playwright driving
Debian's `chromium`): it loads without console errors, shows the sentences, and never scrolls sideways at
1280 or 390 px (a wide heatmap scrolls inside its own box).

Without chromium or Playwright the tests skip, except under CI (CI=true), where they fail: CI must run
them (`.ci/run` installs chromium). `UPDATE_SCREENSHOTS=1` also copies the screenshots to docs/screenshots/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from translate import infer

WIDTHS = (1280, 390)
LONG = "the big dog sees the small cat and the happy woman visits her old friend near the house ."


@pytest.fixture(scope="module")
def align_page(demo_dir, train_tiny_checkpoint, tmp_path_factory) -> tuple[Path, list[str]]:
    """The page `translate.infer --html` writes for three demo lines and a long one."""
    out = tmp_path_factory.mktemp("align_page")
    ckpt, _ = train_tiny_checkpoint(demo_dir, out)
    lines = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:3] + [LONG]
    src = out / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    page = out / "translate_alignments.html"
    infer.main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out / "out.de"), "--beam-size", "2",
                "--html", str(page)])
    return page, lines


@pytest.mark.parametrize("width", WIDTHS)
def test_alignment_page_loads_and_fits_the_width(open_page, align_page, width, tmp_path):
    page_path, lines = align_page
    shot = tmp_path / f"translate_alignments_{width}.png"
    seen = open_page(page_path, width, shot)
    assert seen["errors"] == []
    assert seen["scroll"] <= seen["inner"] == width, "the page scrolls sideways"
    for line in lines:
        assert line in seen["text"]
    assert 0 < shot.stat().st_size < 400_000


def _snowmobiles() -> list:
    from translate.search.align import WordAlignment

    src, tgt = "the snowmobiles are fast .".split(), "die Schneemobile sind schnell .".split()
    matrix = [[1.0 if i == j else 0.0 for i in range(len(src))] for j in range(len(tgt))]
    return [WordAlignment(src, tgt, matrix, [(i, i) for i in range(len(src))])]


def test_column_headers_are_whole_words_not_rotated(tmp_path):
    from translate.alignment_page import alignment_table, write_html

    assert '<th class="col">snowmobiles</th>' in alignment_table(_snowmobiles()[0])
    write_html(tmp_path / "a.html", _snowmobiles())
    html = (tmp_path / "a.html").read_text(encoding="utf-8")
    assert "writing-mode" not in html and "rotate" not in html


@pytest.mark.parametrize("width", WIDTHS)
def test_long_column_headers_are_not_clipped(browser, tmp_path, width):
    from translate.alignment_page import write_html

    path = tmp_path / "snowmobiles.html"
    write_html(path, _snowmobiles())
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(path.resolve().as_uri(), wait_until="load")
    heads = page.evaluate("""[...document.querySelectorAll('th.col')].map(th => {
        const r = document.createRange(); r.selectNodeContents(th);
        const t = r.getBoundingClientRect(), c = th.getBoundingClientRect();
        return {word: th.textContent, text: th.innerText, scroll: th.scrollWidth, client: th.clientWidth,
                inside: t.left >= c.left && t.right <= c.right && t.top >= c.top && t.bottom <= c.bottom,
                across: t.width >= t.height, page: document.documentElement.scrollWidth};
    })""")
    page.close()
    assert [h["word"] for h in heads] == "the snowmobiles are fast .".split()
    for h in heads:
        assert h["text"] == h["word"] and h["scroll"] <= h["client"] and h["inside"], h
    assert next(h for h in heads if h["word"] == "snowmobiles")["across"], "the header is not read across"
    assert heads[0]["page"] <= width
