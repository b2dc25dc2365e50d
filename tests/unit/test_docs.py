"""The docs show what the code does: the lifecycle diagram is the transition table's own rendering."""

from __future__ import annotations

from pathlib import Path

from hermes_ref.phases import render_mermaid

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_lifecycle_diagram_matches_the_transition_table() -> None:
    """docs/lifecycle.md carries render_mermaid()'s output verbatim (regenerate it if this fails)."""
    assert render_mermaid() in (DOCS / "lifecycle.md").read_text(encoding="utf-8")


def test_loop_tables_match_the_code() -> None:
    """docs/loop.md carries the exit, retry and ladder tables as the code generates them."""
    from sim import loop_docs

    page = (DOCS / "loop.md").read_text(encoding="utf-8")
    for table in (loop_docs.exit_table(), loop_docs.retry_table(), loop_docs.ladder_table()):
        assert table in page, "regenerate docs/loop.md from python -m sim.loop_docs"
