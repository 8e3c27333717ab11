"""The README is a product page and the numbers live in docs/RESULTS.md (issue 33, part 4).

Pins what keeps them so: the README stays short and free of commit hashes, every relative
link in the README and the docs reaches a file (and a heading, where it names one), and every
results section of docs/RESULTS.md names the command that reproduces it.  Reads files only.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "RESULTS.md"
MAX_README_LINES = 350

# Pages whose links are checked: the README, every docs page, and the benchmarks' notes (which
# the README and RESULTS.md link into, anchors included).
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")
HEXWORD = re.compile(r"\b[0-9a-f]{7,40}\b")
# A command line as the results page writes it: indented (a code block) or in backticks,
# optionally behind environment settings and `nice`.
COMMAND = re.compile(
    r"^(?: {4}|.*`)(?:[A-Z_]+=\S+ )*(?:nice (?:-n \d+ )?)?(?:traceap|python3?|\.venv/bin/python|bash) \S")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (links in code are not links)."""
    out, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def hash_like(text: str) -> list[str]:
    """Hex words of 7-40 characters with both a digit and a letter: how commits are quoted."""
    return [w for w in HEXWORD.findall(text)
            if re.search(r"\d", w) and re.search(r"[a-f]", w)]


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES})"


def test_readme_quotes_no_commit_hashes():
    found = hash_like(README.read_text(encoding="utf-8"))
    assert not found, f"commit hashes in README.md (history goes to benchmarks/README.md): {found}"


def test_readme_starts_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[2].strip().startswith("bash scripts/setup.sh && .venv/bin/traceap analyze examples/")
    assert lines[3].strip() == "bash scripts/setup.sh && .venv/bin/python -m pytest -q"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):        # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def results_sections() -> dict[str, list[str]]:
    """docs/RESULTS.md's `##` sections: title -> its lines."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in RESULTS.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return sections


def test_results_page_exists_and_each_section_names_its_command():
    assert RESULTS.exists(), "docs/RESULTS.md is missing"
    sections = results_sections()
    assert len(sections) >= 5, f"docs/RESULTS.md has too few results sections: {list(sections)}"
    without = [title for title, lines in sections.items()
               if not any(COMMAND.match(line) for line in lines)]
    assert not without, f"docs/RESULTS.md sections without a reproducing command: {without}"


def test_readme_points_at_the_results():
    assert "docs/RESULTS.md" in README.read_text(encoding="utf-8")
