"""Stable bytes across turns: rewrites drop the sidecar, the prompt is cached, the cache is counted."""

from __future__ import annotations

import pytest

from hermes_ref.models import Message, Role
from hermes_ref.prologue import compose_api_content


def test_rewritten_drops_the_sidecar_and_keeps_the_rest() -> None:
    """A rewrite sends the new text, never the bytes stored for the old one (WIRE-2)."""
    sent = compose_api_content("hi", "memory: X")
    m = Message(role=Role.USER, content="hi", api_content=sent, row_id=3, turn_id="t")
    assert m.wire["content"] == sent
    n = m.rewritten("hello", hidden=True)
    assert (n.content, n.api_content, n.row_id, n.turn_id, n.hidden) == ("hello", None, 3, "t", True)
    assert n.wire["content"] == "hello"


def test_rewritten_refuses_to_set_a_sidecar() -> None:
    """A rewrite cannot carry a sidecar along by keyword: the helper drops it itself."""
    m = Message(role=Role.USER, content="hi")
    with pytest.raises(TypeError, match="drops api_content"):
        m.rewritten("x", api_content="x\n\nold")
