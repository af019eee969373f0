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

    python -m streamrec.explain --ckpt CKPT --input FILE --user U --html out.html

Legend: B users, T history length, K recommendations per user, N items.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import sys
from pathlib import Path

import torch
from torch import Tensor

from core import AttentionCapture, attention_rollout
from core.atomic import atomic_path
from core.errors import InputError, describe_os_error
from streamrec.model import PAD_ID, StreamRecModel


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


def _heatmap_png(drops: Tensor, rows: list[str], cols: list[str]) -> str:
    """Occlusion heatmap (recommendations x history) as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(cols) + 2), max(3.0, 0.35 * len(rows) + 1.5)))
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


def render_html(user: str, history: list[str], attention: list[float], recs: list[tuple[str, float]],
                because: list[tuple[str, str, float]], drops: Tensor) -> str:
    """A self-contained page: history with attention, recommendations with reasons, heatmap."""
    e = html.escape
    hist_rows = "".join(
        f"<tr><td>{i + 1}</td><td>{e(item)}</td>"
        f"<td><div class=bar style='width:{200 * w:.0f}px'></div> {w:.3f}</td></tr>"
        for i, (item, w) in enumerate(zip(history, attention, strict=True))
    )
    rec_rows = "".join(
        f"<tr><td>{r + 1}</td><td>{e(item)}</td><td>{score:.3f}</td>"
        f"<td>{e(att)}</td><td>{e(occ)} ({drop:+.3f})</td></tr>"
        for r, ((item, score), (att, occ, drop)) in enumerate(zip(recs, because, strict=True))
    )
    png = _heatmap_png(drops, [item for item, _ in recs], history)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>StreamRec: why for {e(user)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:2em}}
td,th{{border:1px solid #ccc;padding:3px 8px}}.bar{{display:inline-block;height:10px;background:#4a7}}</style>
</head><body><h1>Recommendations for user {e(user)}</h1>
<p>Attention is rolled out from the recommending position over heads and layers; occlusion is the
drop in the item's score when one history item is removed. When they disagree, trust occlusion.</p>
<h2>Recommendations</h2><table><tr><th>rank</th><th>item</th><th>score</th>
<th>most attended</th><th>largest occlusion drop</th></tr>{rec_rows}</table>
<h2>Occlusion heatmap</h2><img alt="occlusion heatmap" src="data:image/png;base64,{png}">
<h2>History (attention)</h2><table><tr><th>#</th><th>item</th><th>attention</th></tr>{hist_rows}</table>
</body></html>"""


def main(argv: list[str] | None = None) -> None:
    """CLI: explain one user's recommendations as a self-contained HTML page."""
    from streamrec.api import Recommender  # the page is a client of the API, which builds on the functions above
    from streamrec.data import read_interactions

    p = argparse.ArgumentParser(prog="python -m streamrec.explain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint written by `python -m streamrec fit`")
    p.add_argument("--input", required=True, help="interaction log holding the user's history")
    p.add_argument("--user", required=True, help="user id as written in the input")
    p.add_argument("--html", required=True, help="output page")
    p.add_argument("--top-k", type=int, default=10, help="recommendations to explain")
    p.add_argument("--format", default="auto", help="input format (auto, csv, tsv, parquet, sasrec, lines)")
    p.add_argument("--include-seen", action="store_true", help="allow already-seen items")
    args = p.parse_args(argv)
    html = Path(args.html)
    try:
        if html.is_dir() or not html.parent.is_dir():
            raise InputError(f"--html {html}: " + ("is a folder; name a .html file" if html.is_dir() else
                                                   f"the folder {html.parent} does not exist; create it first"))
        rec = Recommender.load(args.ckpt)
        interactions = read_interactions(args.input, args.format)
        if args.user not in interactions.items:
            raise InputError(f"{args.input}: no user {args.user!r}; pass a user id that appears in the file")
        history = interactions.items[args.user]
        if not rec.encode(history)[0]:
            raise InputError(f"user {args.user!r} has no item known to the checkpoint; nothing to explain")
        why = rec.explain(history, args.top_k, exclude_seen=not args.include_seen)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    page = render_html(args.user, why.history, why.attention, why.recommendations, why.because, why.drops)
    try:
        with atomic_path(html) as tmp:
            tmp.write_text(page, encoding="utf-8")
    except OSError as err:
        sys.exit(f"error: {describe_os_error(err, html)}; {html} was not written")
    print(f"wrote {args.html}: {len(why.recommendations)} recommendations for user {args.user} "
          f"from {len(why.history)} history items")


if __name__ == "__main__":
    main()
