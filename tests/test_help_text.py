"""No program's `--help` states a measured figure: speeds, timings, metric values and comparisons belong in
docs/results.md, not in option help (the docstrings jsonargparse turns into `--help` included). And every
dotted name of ours a `--help` gives (`core.nn.rdrop_cross_entropy`) names a module of the tree or a name in one.

A figure is a number with a unit of time or throughput (`12 ms`, `3.1 s/epoch`, `40 GFLOP`, `900 tok/s`), a
percentage (`54%`), a ratio with a comparison (`1.6x faster`), a comparison word (`faster than`, `did not
beat`, `several times slower`) or a metric with its value (`NDCG@10 was 0.58`). An option's own default
(`default 256`, `chunks of 64`) is none of these.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import program_help  # noqa: E402 (by name: the other files that use it share its cached texts)

NUM = r"\d+(?:[.,]\d+)*"
FIGURES = {
    "a time or throughput": re.compile(
        rf"\b{NUM}\s?(?:ns|µs|us|ms|s/epoch|s/step|s/it|it/s|GFLOPs?|TFLOPs?|GFLOP/s|TFLOP/s|req/s|tok/s|tokens/s|"
        rf"users/s|sequences/s)(?![\w/])"),
    "a percentage": re.compile(rf"\b{NUM}\s?%"),
    "a ratio": re.compile(rf"\b{NUM}\s?[x×]\s+(?:faster|slower|as (?:fast|many|much)|more|less|fewer)\b", re.I),
    "a comparison": re.compile(r"\b(?:did not|didn't|does not|never) beat\b|\b(?:faster|slower) than\b|"
                               r"\btimes (?:faster|slower)\b|\bspeed-?up of\b", re.I),
    "a metric value": re.compile(r"\b(?:NDCG|HR|MRR|BLEU|chrF|recall)(?:@\d+)?\s+(?:was|of|is|=|:|reached|gave)?"
                                 r"\s*\d*\.\d+", re.I),
}


def figures(text: str) -> list[str]:
    """'kind: ...context...' for each measured figure in `text` (whitespace folded: help text wraps lines)."""
    text = re.sub(r"\s+", " ", text)
    return [f"{kind}: ...{text[max(0, m.start() - 60):m.end() + 20]}..."
            for kind, pattern in FIGURES.items() for m in pattern.finditer(text)]


def test_the_patterns_find_figures_and_leave_defaults_alone() -> None:
    measured = ["It did not beat `beauty.yaml`", "an epoch ran 1.64x faster", "3.1 s/epoch", "about 12 ms a step",
                "40 GFLOP", "computes 54% of the positions", "val NDCG@10 was 0.58 at 3e-3", "faster than fp32",
                "several times slower per epoch", "BLEU 35.2"]
    assert [bool(figures(t)) for t in measured] == [True] * len(measured)
    plain = ["(type: int, default: 256)", "groups of 64 × batch_size windows", "0.1 drops one id in ten",
             "--top-k K (default 10)", "x sqrt(d_model)", "add 'because you watched' columns (slower)",
             "NDCG@10 on validation", "a chunk also ends after 16 MiB of text", "K = 10 and 20", "default 1e-2"]
    assert [figures(t) for t in plain] == [[]] * len(plain)


def test_every_program_is_listed() -> None:
    """Every module with a `__main__` block is in PROGRAMS, so a new program gets its `--help` checked."""
    listed = {module for module, _ in program_help.PROGRAMS.values()}
    mains = set()
    for path in [*REPO.glob("streamrec/**/*.py"), *REPO.glob("translate/**/*.py"), *REPO.glob("core/**/*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            mains.add(name.replace(".__main__", ".cli"))  # `python -m streamrec` runs streamrec.cli.main
    assert mains <= listed, f"programs without a --help check: {sorted(mains - listed)}"


@pytest.mark.parametrize("program", sorted(program_help.PROGRAMS))
def test_help_states_no_measured_figure(program: str) -> None:
    text = program_help.help_text(program)
    assert "usage:" in text.lower(), text[:500]
    found = figures(text)
    assert not found, f"`{program} --help` states measured figures (they belong in docs/results.md):\n" + "\n".join(
        found)


@pytest.mark.parametrize("program", sorted(program_help.PROGRAMS))
def test_help_names_only_what_exists(program: str) -> None:
    names = set(program_help.DOTTED.findall(program_help.help_text(program)))
    wrong = sorted(f"{name}: {program_help.missing_name(name)}" for name in names if program_help.missing_name(name))
    assert not wrong, f"`{program} --help` names what the tree does not have:\n" + "\n".join(wrong)
