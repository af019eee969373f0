"""The README stays short, and every link and repository path in the docs points at something that exists.

Checked pages: README.md, data/README.md and docs/*.md. Checked references:
- Markdown links `[text](target)` to local files, relative to the page, and their `#anchors`;
- paths into the repository written anywhere on a page (prose, backticks, code blocks), such as
  `configs/translate/demo.yaml` or `benchmarks/translate_bleu.py`.
Web links and the places a reader creates or brings (`runs/`, `../shared/`) are not checked.
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, REPO / "data" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MAX_README_LINES = 200
NOT_CHECKED = ("runs/", "../shared/")

LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:core|streamrec|translate|configs|benchmarks|data|tests|docs)/[\w./-]*\.(?:py|yaml|sh|md))"
)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings (fenced code blocks skipped: a `# comment` there is no heading)."""
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def references(page: Path, line: str) -> dict[tuple[Path, str], str]:
    """(file, anchor) -> the target as written, for each link and repository path on one line of `page`."""
    found = {}
    for target in LINK.findall(line):
        if "://" in target or target.startswith(("mailto:", *NOT_CHECKED)):
            continue
        path, _, anchor = target.partition("#")
        found.setdefault(((page.parent / path).resolve() if path else page, anchor), target)
    for path in REPO_PATH.findall(line):
        found.setdefault(((REPO / path).resolve(), ""), path)
    return found


def broken_references(page: Path) -> list[str]:
    """'page:line: target (why)' for each reference on `page` that points nowhere."""
    broken = []
    name = page.relative_to(REPO) if page.is_relative_to(REPO) else page
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for (file, anchor), target in references(page, line).items():
            if not file.exists():
                broken.append(f"{name}:{number}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{name}:{number}: {target} (no heading with that anchor)")
    return broken


def test_readme_is_at_most_200_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move details to docs/ (limit {MAX_README_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_path_exists(page):
    assert page.exists(), f"{page.relative_to(REPO)} is missing"
    broken = broken_references(page)
    assert not broken, "broken references:\n" + "\n".join(broken)


def test_the_checker_finds_a_broken_link_and_path(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [gone](missing.md) [bad anchor](#nowhere)\n"
                    "`configs/streamrec/no_such.yaml` and `configs/streamrec/demo.yaml`\n", encoding="utf-8")
    broken = broken_references(page)
    assert [b.split(": ", 1)[1] for b in broken] == [
        "missing.md (no such file)", "#nowhere (no heading with that anchor)",
        "configs/streamrec/no_such.yaml (no such file)",
    ]
