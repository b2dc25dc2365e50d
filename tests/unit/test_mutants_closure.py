"""Tail closure's rows, pinned where mutation testing found them unobserved.

See docs/mutation.md.
"""

from __future__ import annotations

from hermes_ref import closure
from hermes_ref.models import Message, Role, ToolCall
from hermes_ref.transcript import Transcript


def test_closing_results_name_their_tool_and_a_boundary_follows() -> None:
    """Each open call gets a result naming its tool, then one assistant boundary row."""
    calls = (ToolCall(id="a", name="read_file"), ToolCall(id="b", name="terminal"))
    transcript = Transcript([Message(role=Role.USER, content="q", row_id=1),
                             Message(role=Role.ASSISTANT, tool_calls=calls, row_id=2),
                             Message(role=Role.TOOL, content="r", tool_call_id="a", row_id=3)])
    rows = closure.closing_rows(transcript, "t", result_text=lambda c: f"lost {c}",
                                boundary_text="[ended]")
    assert [(m.role, m.tool_call_id, m.tool_name, m.content, m.turn_id) for m in rows] == [
        (Role.TOOL, "b", "terminal", "lost b", "t"), (Role.ASSISTANT, None, None, "[ended]", "t")]
    assert rows[0].wire["name"] == "terminal"
