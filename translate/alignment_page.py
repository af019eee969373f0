"""The alignment page of `python -m translate.infer --html`: one self-contained HTML file of heatmap tables.

Writing files is a program's job, so the page lives beside the programs, not in `translate.search.align`."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from translate.search.align import WordAlignment

# Narrow screens: the text wraps (long words anywhere) and a sentence's table, if still too wide, scrolls
# inside its own box (.scroll), never the page. Headers are words at their full width on one line (never
# rotated, which some browsers clip), so a long source word widens its column instead.
_STYLE = """*{box-sizing:border-box}body{font-family:system-ui,sans-serif;margin:0;padding:1em;line-height:1.4}
main{max-width:60em;margin:0 auto}h1{font-size:1.5em}h1,h3,p{overflow-wrap:anywhere}
.scroll{max-width:100%;overflow-x:auto;margin:0.5em 0 2em}table{border-collapse:collapse}
td,th{padding:2px 5px;font-size:12px;text-align:center;border:1px solid #eee}
th{white-space:nowrap}th.row{text-align:right}
td.hard{outline:2px solid #d62728;outline-offset:-2px}"""


def _cell(weight: float, hard: bool) -> str:
    cls, text_color = ' class="hard"' if hard else "", "#fff" if weight > 0.55 else "#000"
    return (f'<td{cls} style="background:rgba(31,119,180,{weight:.3f});color:{text_color}" '
            f'title="{weight:.3f}">{round(100 * weight)}</td>')


def alignment_table(alignment: WordAlignment) -> str:
    """One alignment as an HTML table: rows target words, columns source words, cell = weight x 100."""
    hard = set(alignment.links)
    head = "".join(f'<th class="col">{html.escape(w)}</th>' for w in alignment.src_words)
    rows = [
        f'<tr><th class="row">{html.escape(word)}</th>'
        + "".join(_cell(w, (i, j) in hard) for i, w in enumerate(alignment.matrix[j])) + "</tr>"
        for j, word in enumerate(alignment.tgt_words)
    ]
    return f"<table><tr><th></th>{head}</tr>{''.join(rows)}</table>"


def write_html(path: str | Path, alignments: Sequence[WordAlignment], title: str = "Cross-attention alignments",
               line_numbers: Sequence[int] | None = None) -> None:
    """Write one self-contained HTML page (inline CSS, no scripts or external files) of heatmap tables. `line_numbers`:
    the 1-based input line of each alignment, for the captions (default 1, 2, ...)."""
    numbers = line_numbers or range(1, len(alignments) + 1)
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             "<meta name='viewport' content='width=device-width, initial-scale=1'><link rel='icon' href='data:,'>"
             f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body><main>"
             f"<h1>{html.escape(title)}</h1>"
             "<p>Rows: output words; columns: input words; cell: attention weight x 100 "
             "(summed over an input word's subwords, averaged over an output word's subwords); "
             "red outline: the hard alignment (highest weight in the row).</p>"]
    for n, a in zip(numbers, alignments, strict=True):
        parts.append(f"<h3>line {n}</h3><p>{html.escape(' '.join(a.src_words))}<br>"
                     f"&rarr; {html.escape(' '.join(a.tgt_words))}</p>")
        parts.append(f"<div class='scroll'>{alignment_table(a)}</div>" if a.tgt_words and a.src_words
                     else "<p>(empty)</p>")
    parts.append("</main></body></html>")
    Path(path).write_text("\n".join(parts), encoding="utf-8")
