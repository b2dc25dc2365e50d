"""The lease checkers on stories no scenario tells: they judge the record, not the story."""

from __future__ import annotations

from pathlib import Path

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role, SessionRecord
from hermes_ref.ports import CompactionRow, DurableRecord, StoredMessage
from hermes_ref.rotation import COMPRESSION
from sim.checkers.base import Observation
from sim.checkers.lease import late_start_is_warned
from sim.harness import Story
from sim.provider import text


def test_a_waiter_stalled_past_its_place_is_not_passed_over(tmp_path: Path) -> None:
    """A waiter whose process stalls for longer than two polls loses its place; the turn
    that asks meanwhile and gets the lease did not jump the queue (LEASE-1)."""
    s = Story(store_kind="memory", workdir=tmp_path)
    s.script(text("A."), text("C."), text("B."))
    first, waiting, later = s.main_process(), s.process(), s.process()
    s.delay_reply(1, 40.0)
    s.start_turn("a", process=first)
    s.start_turn("b", process=waiting, after_s=1.0)
    s.stall(waiting, 100.0, after_s=3.0)
    s.start_turn("c", process=later, after_s=50.0)
    s.run_all()
    assert s.violations == []


def _row(row_id: int, role: Role, turn: str, content: str, session: str) -> StoredMessage:
    return StoredMessage(session_id=session, message=Message(role=role, content=content,
                                                             turn_id=turn, row_id=row_id))


def test_a_late_start_across_a_rotation_is_still_a_late_start() -> None:
    """CTX-9 reads a compaction lineage as one conversation: turn A's own row is in the
    parent and only its copy in the child, and B starting in the child before A's final
    persist, unwarned, is found (copies alone never make a late start)."""
    sessions = (SessionRecord(id="s-1", key="k", system_prompt="p", started_at=0.0, ended_at=1.0,
                              end_reason=COMPRESSION),
                SessionRecord(id="s-2", key="k", system_prompt="p", started_at=1.0,
                              parent_session_id="s-1"))
    rows = (_row(1, Role.USER, "A", "a?", "s-1"),   # A's own user row, in the parent
            _row(2, Role.USER, "A", "a?", "s-2"),   # its compaction's copy, in the child
            _row(3, Role.USER, "B", "b?", "s-2"),   # B starts before A's final persist
            _row(4, Role.ASSISTANT, "B", "b!", "s-2"))
    rotation = (CompactionRow(session_id="s-1", child_id="s-2", holder="turn=A", token=1, at=1.0,
                              rows_before=1, rows_after=1, first_row_id=2),)
    record = DurableRecord(sessions=sessions, messages=rows, compactions=rotation)
    found = late_start_is_warned(Observation(record=record, ledger=(), calls=(), crash_seqs=(),
                                             limits=Limits()))
    assert [v.invariant for v in found] == ["CTX-9"] and "turn B started before turn A" in found[0].message
