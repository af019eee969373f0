""""Because you watched X" as a self-contained HTML page: one user's recommendations with their reasons.

The input is read the way the checkpoint's training log was (its columns, delimiter, header, time format,
filter; `streamrec.reading`); the reading flags override that.

The page draws `streamrec.Recommender.explain`'s two views (`streamrec.ranking.explain`: rolled-out attention and
occlusion). With `--items` (see `streamrec.data.items`: CSV/TSV with item_id,title,... or MovieLens' movies.dat) it
shows titles and metadata instead of raw ids. It fits narrow screens (390 px phones) without sideways scrolling."""

from __future__ import annotations

import argparse
import base64
import html
import io
from pathlib import Path

from matplotlib.figure import Figure
from torch import Tensor

from core.runtime.atomic import atomic_write_text
from core.runtime.errors import InputError, check_output_file, exit_on_error
from streamrec.api import Explanation, Recommender
from streamrec.reading import add_read_arguments, read_overrides

HEATMAP_ITEMS = 30  # the heatmap's columns: the most recent history items, each wide enough to read


def _heatmap_figure(drops: Tensor, rows: list[str], cols: list[str], last: int = HEATMAP_ITEMS) -> Figure:
    """Occlusion heatmap (recommendations x history) as a matplotlib Figure (no pyplot state): only the `last`
    most recent history items, so each column keeps a readable width; the title wraps to fit a narrow figure."""
    total = len(cols)
    if total > last:
        drops, cols = drops[:, -last:], cols[-last:]
    rows, cols = ([t if len(t) <= 24 else t[:23] + "\u2026" for t in ts] for ts in (rows, cols))  # keep its size
    fig = Figure(figsize=(max(5.0, 0.35 * len(cols) + 3), max(3.0, 0.35 * len(rows) + 2.5)), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(drops.float().numpy(), cmap="magma", aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("history item (oldest -> newest)")
    ax.set_ylabel("recommended item")
    shown = f"last {len(cols)} of {total} items" if total > len(cols) else f"all {total} items"
    fig.suptitle(f"score drop when the history item is removed (occlusion)\n{shown}", fontsize=10, wrap=True)
    fig.colorbar(im, ax=ax)
    return fig


# Narrow screens: containers cap the width, long words break anywhere, a table turns into one card per
# row below 40em, and whatever is still too wide scrolls inside its own box, never the page: the heatmap keeps
# its drawn size there (shrunk to fit a phone, its columns could not be read).
_STYLE = """*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0;padding:1em;line-height:1.4;color:#222}
main{max-width:60em;margin:0 auto}h1{font-size:1.5em}h1,h2,p,td{overflow-wrap:anywhere}
.scroll{max-width:100%;overflow-x:auto;margin-bottom:2em}
table{border-collapse:collapse;width:100%}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;white-space:nowrap}
.id,.meta{color:#666;font-size:0.85em}.meta{display:block}
.track{display:inline-block;width:8em;max-width:40%;background:#eee;vertical-align:middle}
.bar{display:block;height:10px;background:#4a7}img{max-width:100%;height:auto;display:block}
img.heatmap{max-width:none}
@media (max-width:40em){thead{display:none}table,tbody,tr,td{display:block;width:100%}
tr{border:1px solid #ccc;margin-bottom:0.75em;padding:0.25em 0}td,td.num{border:none;padding:2px 8px;text-align:left}
td[data-label]::before{content:attr(data-label) ": ";font-weight:600;color:#555}}"""


def _item(why: Explanation, item: str, details: bool = True) -> str:
    """An item cell: its title, its id when the title differs, and its metadata."""
    e = html.escape
    title = why.title(item)
    cell = f"<b>{e(title)}</b>" + (f" <span class=id>({e(item)})</span>" if title != item else "")
    meta = why.catalog.details(item) if details and why.catalog is not None else {}
    if meta:
        cell += "<span class=meta>" + " &middot; ".join(f"{e(k)}: {e(v)}" for k, v in meta.items()) + "</span>"
    return cell


def render_html(user: str, why: Explanation) -> str:
    """A self-contained page (inline CSS and image, no scripts): recommendations with reasons, heatmap, history."""
    e = html.escape
    hist_rows = "".join(
        f"<tr><td class=num data-label='#'>{i + 1}</td><td data-label=item>{_item(why, item)}</td>"
        f"<td class=num data-label=attention><span class=track><span class=bar style='width:{100 * w:.0f}%'>"
        f"</span></span> {w:.3f}</td></tr>"
        for i, (item, w) in enumerate(zip(why.history, why.attention, strict=True))
    )
    rec_rows = "".join(
        f"<tr><td class=num data-label=rank>{r + 1}</td><td data-label=item>{_item(why, item)}</td>"
        f"<td class=num data-label=score>{score:.3f}</td>"
        f"<td data-label='most attended'>{_item(why, att, details=False)}</td>"
        f"<td data-label='largest occlusion drop'>{_item(why, occ, details=False)} ({drop:+.3f})</td></tr>"
        for r, ((item, score), (att, occ, drop)) in enumerate(zip(why.recommendations, why.because, strict=True))
    )
    buf = io.BytesIO()
    _heatmap_figure(why.drops, [why.title(item) for item, _ in why.recommendations],
                    [why.title(item) for item in why.history]).savefig(buf, format="png", dpi=100)
    png = base64.b64encode(buf.getvalue()).decode("ascii")
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">
<title>StreamRec: why for {e(user)}</title><style>{_STYLE}</style></head><body><main>
<h1>Because you watched: recommendations for user {e(user)}</h1>
<p>Attention is rolled out from the recommending position over heads and layers; occlusion is the
drop in the item's score when one history item is removed. When they disagree, trust occlusion.</p>
<h2>Recommendations</h2><div class=scroll><table><thead><tr><th>rank</th><th>item</th><th>score</th>
<th>most attended</th><th>largest occlusion drop</th></tr></thead><tbody>{rec_rows}</tbody></table></div>
<h2>Occlusion heatmap</h2><div class=scroll><img class=heatmap alt="occlusion heatmap: score drop of each recommendation
when each history item is removed" src="data:image/png;base64,{png}"></div>
<h2>History (attention)</h2><div class=scroll><table><thead><tr><th>#</th><th>item</th><th>attention</th></tr>
</thead><tbody>{hist_rows}</tbody></table></div></main></body></html>"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m streamrec.explain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint written by `python -m streamrec fit`")
    p.add_argument("--input", required=True, help="interaction log holding the user's history")
    p.add_argument("--user", required=True, help="user id as written in the input")
    p.add_argument("--html", required=True, help="output page")
    p.add_argument("--top-k", type=int, default=10, help="recommendations to explain")
    p.add_argument("--exclude-seen", action=argparse.BooleanOptionalAction, default=True,
                   help="leave out items already in the user's history (default: yes)")
    p.add_argument("--items", help="item titles and metadata: CSV/TSV with item_id,title,... or MovieLens' "
                                   "movies.dat (ids it lacks show as themselves)")
    add_read_arguments(p)
    args = p.parse_args(argv)
    html = Path(args.html)
    with exit_on_error(html, not_written=True):
        check_output_file(html, "--html", "a .html file")
        rec = Recommender.load(args.ckpt, items=args.items)
        interactions = rec.read_log(args.input, **read_overrides(args))
        if args.user not in interactions.items:
            raise InputError(f"{args.input}: no user {args.user!r}; pass a user id that appears in the file")
        if not rec.encode(history := interactions.items[args.user])[0]:
            raise InputError(f"user {args.user!r} has no item known to the checkpoint; nothing to explain")
        why = rec.explain(history, args.top_k, args.exclude_seen)
        atomic_write_text(html, render_html(args.user, why))
    print(f"wrote {args.html}: {len(why.recommendations)} recommendations for user {args.user} "
          f"from {len(why.history)} history items")


if __name__ == "__main__":
    main()
