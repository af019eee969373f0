"""The "because you watched" page in a real headless browser (Playwright driving Debian's `chromium`):
it loads without console errors, shows the items' titles, and never scrolls sideways at 1280 or 390 px.

Without chromium or Playwright the tests skip, except under CI (CI=true), where they fail: CI must run
them (`.ci/run` installs chromium). `UPDATE_SCREENSHOTS=1` also copies the screenshots to docs/screenshots/.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from streamrec import explain
from streamrec.data.readers import read_interactions

WIDTHS = (1280, 390)
LONG_WORD = "Extraordinarilylongunbrokenmetadatavalue" * 2  # must wrap, not widen the page


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
def test_explain_page_shows_titles_and_fits_the_width(open_page, explain_page, width, tmp_path):
    page, titles, user = explain_page
    shot = tmp_path / f"streamrec_explain_{width}.png"
    seen = open_page(page, width, shot)
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


@pytest.mark.parametrize("n_history", [3, 77])
def test_heatmap_title_fits_and_long_histories_show_the_most_recent_items(n_history):
    import torch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    recs = [f"A recommended film with a rather long title {i}" for i in range(5)]
    history = [f"History film {i:02d}" for i in range(n_history)]
    fig = explain._heatmap_figure(torch.rand(5, n_history), recs, history)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    (title,) = [t for t in fig.findobj(Text) if "(occlusion)" in t.get_text()]
    box = title.get_window_extent(renderer)
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
    ax = fig.axes[0]
    shown = min(n_history, explain.HEATMAP_ITEMS)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == history[-shown:]  # the most recent items, oldest -> newest
    assert ax.get_images()[0].get_array().shape == (5, shown)
    assert ax.get_window_extent(renderer).width / shown >= 20  # px per column at the page's 100 dpi
    expected = f"last {shown} of {n_history} items" if n_history > shown else f"all {n_history} items"
    assert expected in title.get_text()


@pytest.mark.parametrize("width", WIDTHS)
def test_heatmap_keeps_its_drawn_size_and_scrolls_in_its_box(browser, explain_page, width):
    page_path, _, _ = explain_page
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(page_path.resolve().as_uri(), wait_until="load")
    img = page.evaluate("(() => { const i = document.querySelector('img.heatmap');"
                        " return {natural: i.naturalWidth, shown: i.clientWidth,"
                        " page: document.documentElement.scrollWidth}; })()")
    page.close()
    assert img["natural"] > 0 and img["shown"] == img["natural"], "the heatmap is shrunk to the screen"
    assert img["page"] <= width  # its own box scrolls, not the page
