"""Closing an open transcript tail: the rows that make a record safe to continue from.

Theory of operation
-------------------
A transcript is *closed* when every tool call has a result and it does not rest on a
user or tool row that no assistant row answers. Three situations leave it open, and each
closes it with the same two kinds of engine rows:

* a crash (the next turn's prologue repairs it: TOOL-10, FIN-5): calls recorded without
  results get ``RECOVERED_CALL_TEXT`` — the call is reported unknown and never re-run;
* a failed turn (the finalizer closes it: FIN-5): results that could not be recorded get
  ``UNRECORDED_RESULT_TEXT`` (they were never shown to the model: TOOL-8), and calls of
  later segments that never started get ``NOT_RUN_TEXT``;
* either way, a user or tool tail then gets one assistant boundary row.

``closing_rows`` only decides which rows to write; the caller writes them.
"""

from __future__ import annotations

from collections.abc import Callable

from hermes_ref.models import Message, Role
from hermes_ref.transcript import Transcript

RECOVERED_CALL_TEXT = (
    "unknown: the process stopped after this call was recorded and before its result was; "
    "it was not run again. Check its effect before retrying it."
)
UNRECORDED_RESULT_TEXT = (
    "unknown: this call's result could not be recorded, so it was not shown to the model. "
    "Check its effect before retrying it."
)
INTERRUPTED_CALL_TEXT = (
    "unknown: the turn was interrupted while this call ran, so its result was never "
    "received. Check its effect before retrying it."
)
NOT_RUN_TEXT = "not run: the turn ended before this call was started."
RECOVERED_BOUNDARY_TEXT = "[the previous turn ended before it could answer]"


def closing_rows(transcript: Transcript, turn_id: str, *, result_text: Callable[[str], str],
                 boundary_text: str) -> list[Message]:
    """Results for the trailing open calls, then a boundary row if the tail needs one.

    ``result_text(call_id)`` says what each open call's result row reports.
    """
    owner, missing = transcript.trailing_open_calls()
    rows: list[Message] = []
    if owner is not None:
        names = {c.id: c.name for c in owner.tool_calls}
        rows = [Message(role=Role.TOOL, content=result_text(call_id), tool_call_id=call_id,
                        tool_name=names[call_id], turn_id=turn_id) for call_id in missing]
    tail = rows[-1] if rows else transcript.durable_tail()
    if tail is not None and tail.role in (Role.USER, Role.TOOL):
        rows.append(Message(role=Role.ASSISTANT, content=boundary_text, turn_id=turn_id))
    return rows
