"""Synthetic messages that steer retries, and the rules that keep them out of the record.

Theory of operation
-------------------
When the model answers with nothing usable, the engine sometimes adds a message of its
own to the next request: a nudge after a tool round, a re-prompt after a dropped tool
call, a terminal sentinel. Such a message is *scaffolding*. It carries a
``ScaffoldFlag`` and lives only in the turn's working list:

* it is never persisted, at any position (SCAF-1): the engine never hands a flagged
  message to a write (``Transcript.pending`` skips them and the loop's writes are of
  rows it builds itself), and every store refuses one (cause ``scaffolding``);
* it is dropped from the working list before the finalizer closes the tail;
* after a crash nothing is replayed from it (SCAF-2), because nothing was stored.
"""

from __future__ import annotations

from hermes_ref.models import Message, Role, ScaffoldFlag

DROPPED_TOOLCALL_NUDGE = (
    "Your last reply said it would call a tool but contained no tool call. "
    "Call the tool now, or answer in text."
)
EMPTY_AFTER_TOOLS_NUDGE = (
    "The tool results are above. Continue: answer the user in text or call another tool."
)
GRACE_SUMMARY_PROMPT = (
    "The step budget for this turn is used up. Without calling any tool, summarize for "
    "the user what was done and what is still open."
)
EMPTY_SENTINEL = "(empty)"
PRE_VERIFY_NUDGE = (
    "Before you finish: check that the file changes you made are in place and correct, "
    "then give your final answer."
)


def scaffold(role: Role, content: str, flag: ScaffoldFlag, turn_id: str) -> Message:
    """A synthetic message carrying its flag."""
    return Message(role=role, content=content, scaffold=flag, turn_id=turn_id)
