"""The lease checkers on stories no scenario tells: they judge the record, not the story."""

from __future__ import annotations

from pathlib import Path

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role, SessionRecord
from hermes_ref.ports import CompactionRow, DurableRecord, LeaseGrantRow, StoredMessage
from hermes_ref.rotation import COMPRESSION
from sim.checkers.base import Observation
from sim.checkers.lease import dead_holders_do_not_block, late_start_is_warned
from sim.harness import Story
from sim.provider import text
from sim.world import LeaseStep


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


def _holder(pid: int, turn: str) -> str:
    """A holder string as the simulated processes name themselves (LEASE-2)."""
    return f"pid={pid}:pidns=sim:turn={turn}:platform=cli"


def _rejoined_waiter_refused(stall: bool = True) -> Observation:
    """A holds t-1 until 50 s. B asks from 1 s, then its process stalls from 3 s to 30 s
    (past two polls: it loses its place); C asks from 10 s, so when B asks again at 30 s it
    rejoins behind C. A releases at 50 s; B's ask at 50.5 s is refused and C is granted at
    51 s: C was first in line, as LEASE-1 keeps the order. Without the stall B keeps its
    place ahead of C and its refusal is wrong."""
    a, b, c = _holder(1, "A"), _holder(2, "B"), _holder(3, "C")
    steps = [(0.0, "granted", a, 1), (50.0, "released", a, 1), (51.0, "granted", c, 2)]
    b_asks = (1.0, 2.0, 3.0, *map(float, range(30 if stall else 4, 50)), 50.5)
    steps += [(at, "busy", b, 0) for at in b_asks]
    steps += [(float(at), "busy", c, 0) for at in range(10, 51)]
    log = tuple(LeaseStep(what, "t-1", holder, token, at, seq)
                for seq, (at, what, holder, token) in enumerate(sorted(steps, key=lambda s: s[0])))
    grants = (LeaseGrantRow(session_id="t-1", token=1, holder=a, acquired_at=0.0, expires_at=300.0,
                            ended_at=50.0, end_reason="released"),
              LeaseGrantRow(session_id="t-1", token=2, holder=c, acquired_at=51.0, expires_at=351.0))
    sessions = (SessionRecord(id="t-1", key="k", system_prompt="p", started_at=0.0),)
    return Observation(record=DurableRecord(sessions=sessions, lease_grants=grants), ledger=(),
                       calls=(), crash_seqs=(), limits=Limits(), lease_log=log)


def test_a_waiter_that_lost_its_place_is_refused_a_free_lease_while_another_is_first() -> None:
    """LEASE-3 does not require a free lease to go to whoever asks: a turn that lost its
    place in line (two polls unasked) and rejoined behind another is refused while that one
    is first, and this is not a dead or ended holder blocking it."""
    assert dead_holders_do_not_block(_rejoined_waiter_refused()) == []


def test_a_waiter_that_kept_its_place_is_not_refused_a_free_lease() -> None:
    """The same story without the stall: B never lost its place, so refusing it the lease
    A had released is still found."""
    found = dead_holders_do_not_block(_rejoined_waiter_refused(stall=False))
    assert [v.invariant for v in found] == ["LEASE-3"] and "token 1) had ended" in found[0].message
