""""Because you watched X": which history items drove each recommendation.

Two views, reported side by side because attention is not proof:

- attention: self-attention captured from the recommending (last) position, averaged over
  heads and rolled out through the layers with the residual path (Abnar & Zuidema, 2020).
  One distribution over the history per user, the same for all of the user's recommendations.
- occlusion: how much a recommended item's score drops when one history item is removed
  (the rest shifted and re-padded, as a shorter history would be). Specific to each item.

`agreement` measures how often the top-attended item is also the top-occlusion item;
`explain_columns` gives the columns of `python -m streamrec.score --explain`. From Python,
`streamrec.Recommender.explain` returns both views for one history; the page below is drawn from it:

    python -m streamrec.explain --ckpt CKPT --input FILE --user U --html out.html [--items items.csv]

With `--items` (see `streamrec.items`: CSV/TSV with item_id,title,... or MovieLens' movies.dat) the page
shows titles and metadata instead of raw ids. It fits narrow screens (390 px phones) without sideways scrolling.

Legend: B users, T history length, K recommendations per user, N items.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from core import AttentionCapture, attention_rollout
from core.atomic import atomic_path
from core.errors import InputError, describe_os_error
from streamrec.model import PAD_ID, StreamRecModel

if TYPE_CHECKING:  # the API imports this module; the page only reads its result
    from streamrec.api import Explanation


@torch.no_grad()
def attention_weights(model: StreamRecModel, inputs: Tensor) -> Tensor:
    """Rolled-out attention of the last position over the history.

    Args:
        model: the recommender (eval mode).
        inputs: (B, T) left-padded histories.

    Returns:
        (B, T) weights; padding positions get 0 and real positions sum to 1.
    """
    with AttentionCapture(model.encoder) as cap:
        model.encode(inputs)
    rollout = attention_rollout(cap.layers("self_attn"))[:, -1]  # (B, T)
    rollout = rollout.masked_fill(inputs == PAD_ID, 0.0)
    return rollout / rollout.sum(-1, keepdim=True).clamp_min(1e-12)


def _without_each_position(inputs: Tensor) -> Tensor:
    """(B, T) -> (T, B, T): variant t drops position t and left-pads the rest."""
    b, t = inputs.shape
    pad = inputs.new_zeros(b, 1)
    return torch.stack([torch.cat([pad, inputs[:, :i], inputs[:, i + 1 :]], dim=1) for i in range(t)])


@torch.no_grad()
def occlusion_drops(model: StreamRecModel, inputs: Tensor, items: Tensor) -> Tensor:
    """Score drop of each recommended item when each history position is removed.

    Args:
        model: the recommender (eval mode).
        inputs: (B, T) left-padded histories.
        items: (B, K) recommended item ids.

    Returns:
        (B, K, T): base score - score without position t; 0 at padding positions.
    """
    b, t = inputs.shape
    base = model.score(model.last_hidden(inputs)).gather(1, items)  # (B, K)
    variants = _without_each_position(inputs).view(t * b, t)  # (T*B, T)
    hidden = model.last_hidden(variants).view(t, b, -1)  # (T, B, D)
    vecs = model.item_vectors[items]  # (B, K, D)
    occluded = torch.einsum("tbd,bkd->bkt", hidden, vecs.to(hidden.dtype))  # (B, K, T)
    drops = base[:, :, None] - occluded
    return drops.masked_fill((inputs == PAD_ID)[:, None, :], 0.0)


def explain_columns(model: StreamRecModel, inputs: Tensor, items: Tensor,
                    max_sequences: int = 4096) -> dict[str, Tensor]:
    """Per recommendation: the top-attended history item and the top-occlusion item, with weights.

    The "because you watched" columns of `python -m streamrec.score --explain`. Runs in sub-batches so
    that B x T occlusion variants stay under `max_sequences`.

    Args:
        model: the recommender (eval mode).
        inputs: (B, T) left-padded histories.
        items: (B, K) recommended item ids (0 for an empty slot).

    Returns:
        (B, K) tensors `because_attention`, `attention_weight`, `because_occlusion`, `occlusion_drop`.
    """
    parts: list[dict[str, Tensor]] = []
    step = max(1, max_sequences // inputs.shape[1])
    for start in range(0, inputs.shape[0], step):
        x, rec = inputs[start : start + step], items[start : start + step]
        att = attention_weights(model, x)  # (b, T)
        drops = occlusion_drops(model, x, rec.clamp_min(1))  # (b, K, T)
        drops = drops.masked_fill((x == PAD_ID)[:, None, :], float("-inf"))
        att_w, att_pos = att.max(-1)
        occ_drop, occ_pos = drops.max(-1)
        k = rec.shape[1]
        parts.append({
            "because_attention": x.gather(1, att_pos[:, None]).expand(-1, k),
            "attention_weight": att_w[:, None].expand(-1, k),
            "because_occlusion": x.gather(1, occ_pos),
            "occlusion_drop": occ_drop,
        })
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}


def agreement(attention: Tensor, drops: Tensor, inputs: Tensor) -> float:
    """Fraction of (user, recommendation) pairs whose top-attended history position is also
    the position whose removal lowers that recommendation's score most.

    Args:
        attention: (B, T) from `attention_weights`.
        drops: (B, K, T) from `occlusion_drops`.
        inputs: (B, T) histories (padding positions never count).
    """
    masked = drops.masked_fill((inputs == PAD_ID)[:, None, :], float("-inf"))
    top_occ = masked.argmax(-1)  # (B, K)
    top_att = attention.argmax(-1)[:, None]  # (B, 1)
    return float((top_occ == top_att).float().mean())


# ----------------------------------------------------------------------------- HTML page


def _short(text: str, width: int = 24) -> str:
    """A heatmap tick label: long titles cut so the figure keeps its size."""
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _heatmap_png(drops: Tensor, rows: list[str], cols: list[str]) -> str:
    """Occlusion heatmap (recommendations x history) as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = [_short(r) for r in rows], [_short(c) for c in cols]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(cols) + 3), max(3.0, 0.35 * len(rows) + 2.5)))
    im = ax.imshow(drops.float().numpy(), cmap="magma", aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("history item (oldest -> newest)")
    ax.set_ylabel("recommended item")
    ax.set_title("score drop when the history item is removed (occlusion)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# Narrow screens: containers cap the width, long words break anywhere, a table turns into one card per
# row below 40em, and whatever is still too wide (the heatmap) scrolls inside its own box, never the page.
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
    """A self-contained page (inline CSS and image, no scripts): recommendations with reasons, heatmap, history.

    Args:
        user: the user id, for the headings.
        why: `streamrec.Recommender.explain`'s result; items show by title when it carries a catalog.
    """
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
    png = _heatmap_png(why.drops, [why.title(item) for item, _ in why.recommendations],
                       [why.title(item) for item in why.history])
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">
<title>StreamRec: why for {e(user)}</title><style>{_STYLE}</style></head><body><main>
<h1>Because you watched: recommendations for user {e(user)}</h1>
<p>Attention is rolled out from the recommending position over heads and layers; occlusion is the
drop in the item's score when one history item is removed. When they disagree, trust occlusion.</p>
<h2>Recommendations</h2><div class=scroll><table><thead><tr><th>rank</th><th>item</th><th>score</th>
<th>most attended</th><th>largest occlusion drop</th></tr></thead><tbody>{rec_rows}</tbody></table></div>
<h2>Occlusion heatmap</h2><div class=scroll><img alt="occlusion heatmap: score drop of each recommendation
when each history item is removed" src="data:image/png;base64,{png}"></div>
<h2>History (attention)</h2><div class=scroll><table><thead><tr><th>#</th><th>item</th><th>attention</th></tr>
</thead><tbody>{hist_rows}</tbody></table></div></main></body></html>"""


def main(argv: list[str] | None = None) -> None:
    """CLI: explain one user's recommendations as a self-contained HTML page."""
    from streamrec.api import Recommender  # the page is a client of the API, which builds on the functions above
    from streamrec.readers import read_interactions

    p = argparse.ArgumentParser(prog="python -m streamrec.explain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint written by `python -m streamrec fit`")
    p.add_argument("--input", required=True, help="interaction log holding the user's history")
    p.add_argument("--user", required=True, help="user id as written in the input")
    p.add_argument("--html", required=True, help="output page")
    p.add_argument("--top-k", type=int, default=10, help="recommendations to explain")
    p.add_argument("--format", default="auto", help="input format (auto, csv, tsv, parquet, sasrec, lines)")
    p.add_argument("--include-seen", action="store_true", help="allow already-seen items")
    p.add_argument("--items", help="item titles and metadata: CSV/TSV with item_id,title,... or MovieLens' "
                                   "movies.dat (ids it lacks show as themselves)")
    args = p.parse_args(argv)
    html = Path(args.html)
    try:
        if html.is_dir() or not html.parent.is_dir():
            raise InputError(f"--html {html}: " + ("is a folder; name a .html file" if html.is_dir() else
                                                   f"the folder {html.parent} does not exist; create it first"))
        rec = Recommender.load(args.ckpt, items=args.items)
        interactions = read_interactions(args.input, args.format)
        if args.user not in interactions.items:
            raise InputError(f"{args.input}: no user {args.user!r}; pass a user id that appears in the file")
        history = interactions.items[args.user]
        if not rec.encode(history)[0]:
            raise InputError(f"user {args.user!r} has no item known to the checkpoint; nothing to explain")
        why = rec.explain(history, args.top_k, exclude_seen=not args.include_seen)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    page = render_html(args.user, why)
    try:
        with atomic_path(html) as tmp:
            tmp.write_text(page, encoding="utf-8")
    except OSError as err:
        sys.exit(f"error: {describe_os_error(err, html)}; {html} was not written")
    print(f"wrote {args.html}: {len(why.recommendations)} recommendations for user {args.user} "
          f"from {len(why.history)} history items")


if __name__ == "__main__":
    main()
