"""The docs show what the code does: the lifecycle diagram is the transition table's own rendering."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from hermes_ref.phases import render_mermaid

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_lifecycle_diagram_matches_the_transition_table() -> None:
    """docs/lifecycle.md carries render_mermaid()'s output verbatim (regenerate it if this fails)."""
    assert render_mermaid() in (DOCS / "lifecycle.md").read_text(encoding="utf-8")


def test_loop_tables_match_the_code() -> None:
    """docs/loop.md carries the exit, retry and ladder tables as the code generates them."""
    from sim import loop_docs

    page = (DOCS / "loop.md").read_text(encoding="utf-8")
    for table in (loop_docs.exit_table(), loop_docs.retry_table(), loop_docs.ladder_table()):
        assert table in page, "regenerate docs/loop.md from python -m sim.loop_docs"


# A quoted excerpt is marked by an HTML comment on the line before its code fence:
# <!-- quoted from hermes_ref/loop.py -->. The excerpt must be the file's own lines, in
# order and contiguous, docstrings and blank lines left out on both sides.
QUOTE = re.compile(r"<!-- quoted from (\S+) -->\n```python\n(.*?)```", re.S)


def _code_lines(text: str) -> list[str]:
    """``text``'s lines stripped, blank ones and docstrings dropped (a fragment that does not
    parse on its own keeps every line)."""
    skip: set[int] = set()
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                skip.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return [line.strip() for number, line in enumerate(text.splitlines(), 1)
            if line.strip() and number not in skip]


def _quotes() -> list[tuple[str, str, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for match in QUOTE.finditer(page.read_text(encoding="utf-8")):
            found.append((page.name, match.group(1), match.group(2)))
    return found


def _contains(whole: list[str], part: list[str]) -> bool:
    return any(whole[i:i + len(part)] == part for i in range(len(whole) - len(part) + 1))


def test_quoted_code_is_the_code() -> None:
    """Every excerpt a page marks as quoted from a file is that file's code as it stands."""
    quotes = _quotes()
    assert len(quotes) >= 8  # the marks themselves must not vanish
    stale = [f"{page}: the excerpt from {path} starting {excerpt.splitlines()[0]!r}"
             for page, path, excerpt in quotes
             if not _contains(_code_lines((ROOT / path).read_text(encoding="utf-8")),
                              _code_lines(excerpt))]
    assert not stale, "re-paste from the code: " + "; ".join(stale)
