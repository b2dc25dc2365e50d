"""Checkers of the durable side of compaction: rotation, the lineage tip, the lock (CMP-5,
CMP-6) and the lease of a lineage (LEASE-1).

Theory of operation
-------------------
Everything here is read from the store's own record: the sessions (``parent_session_id``,
``end_reason``), every committed compaction (``compactions``: who, when, from where to
where, which rows it inserted), every ask for a compression lock (``compression_locks``,
refusals included), every lease grant, the route revisions, the archived rows; and from
the world's list of turns the harness asked for (``runs``). Never from what the engine
says it did.

* CMP-5 ``rotation_is_whole``: each rotation ended its parent ``compression`` at its own
  instant and created its child (``parent_session_id``) then; each session ended
  ``compression`` has the compaction and the child that ended it (fail on silence: the
  end without its child is a violation); no row lands in a rotated session after its
  rotation; each lineage has exactly one tip (one member not ended ``compression``).
* CMP-5 ``compaction_loses_no_message``: the compacted set of each compaction keeps the
  last user input and every pending call (a call with no result yet) of the rows it
  replaced, and is not empty.
* CMP-5 ``turns_find_the_tip``: a turn the harness asked for on a rotated session wrote
  its user row in that session's lineage (not in the ended parent); a route revision that
  moves a key off a rotated session moves it to the lineage's tip, or the tip was ended.
* CMP-5 ``asked_compactions_happen``: a turn the harness asked to compact, that neither
  died nor had a write failed, committed its compaction or was refused the lock (fail on
  silence: a compacting turn that left no trace is a violation).
* CMP-6 ``one_compressor_at_a_time``: grants of one session's lock never overlap; each
  compaction was committed by the holder of the compacted session's lock at that moment
  (a compaction with no grant is a violation: fail on silence).
* LEASE-1 ``one_lease_per_lineage``: no two grants of one lineage are live at once, and
  each rotation carried its lease to the child (same token and holder, from its instant).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations

from hermes_ref.models import Message, Role
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS, ExitReason
from hermes_ref.ports import CompactionRow, DurableRecord, StoredMessage
from hermes_ref.rotation import COMPRESSION, ROTATED
from sim.checkers.base import EPSILON_S, Observation, Violation, as_written, checker
from sim.checkers.lineage import copied_row_ids, roots
from sim.checkers.loop_fire import held_answer_stood
from sim.checkers.rules import holder_fields
from sim.world import TurnRun


@dataclass(frozen=True, slots=True)
class CompactionRun(TurnRun):
    """A turn the harness asked to compact its session (``sim.rotation_story``): the record
    must then show that it did, or that the lock was refused to it, or why it could not."""


def _compacted_rows(record: DurableRecord, done: CompactionRow) -> list[Message]:
    target = done.child_id or done.session_id
    last = done.first_row_id + done.rows_after
    return [m.message for m in record.messages
            if m.session_id == target and done.first_row_id <= (m.message.row_id or 0) < last]


def _replaced_rows(record: DurableRecord, done: CompactionRow) -> list[Message]:
    """The live rows of the compacted session just before ``done``: its rows (live or
    archived) after the previous compaction into it began, and before this one's."""
    earlier = [c.first_row_id for c in record.compactions
               if c.first_row_id < done.first_row_id
               and (c.child_id or c.session_id) == done.session_id]
    floor = max(earlier, default=0)
    every: list[StoredMessage] = [*record.messages, *record.archived]
    return sorted((m.message for m in every if m.session_id == done.session_id
                   and floor <= (m.message.row_id or 0) < done.first_row_id),
                  key=lambda m: m.row_id or 0)


@checker("rotation_is_whole", ("CMP-5",),
         "a rotation ends its parent with reason compression and creates the child in the same "
         "instant; a session ended compression has its child; no row lands in it afterwards; "
         "each lineage has exactly one tip")
def rotation_is_whole(obs: Observation) -> list[Violation]:
    record = obs.record
    sessions = {s.id: s for s in record.sessions}
    out: list[Violation] = []

    def bad(message: str) -> None:
        out.append(Violation("rotation_is_whole", "CMP-5", message))

    rotated: dict[str, CompactionRow] = {}
    for done in record.compactions:
        if done.child_id is None:
            continue
        rotated[done.session_id] = done
        parent, child = sessions.get(done.session_id), sessions.get(done.child_id)
        if parent is None or parent.end_reason != COMPRESSION or parent.ended_at is None \
                or abs(parent.ended_at - done.at) > EPSILON_S:
            state = "missing" if parent is None else (
                f"ended {parent.end_reason!r} at {parent.ended_at}" if parent.ended_at is not None
                else "still live")
            bad(f"{done.session_id} rotated to {done.child_id} at {done.at:g}, but the parent is "
                f"{state} (it must end compression in the rotation's commit)")
        if child is None or child.parent_session_id != done.session_id \
                or abs(child.started_at - done.at) > EPSILON_S:
            bad(f"{done.session_id} rotated to {done.child_id}, but the child row does not name "
                "its parent or was not created by the rotation")
    for s in record.sessions:
        if s.end_reason == COMPRESSION and s.id not in rotated:
            bad(f"{s.id} ended compression without a rotation that created its child")
    for stored in record.messages:
        cut = rotated.get(stored.session_id)
        if cut is not None and (stored.message.row_id or 0) > cut.first_row_id:
            bad(f"row #{stored.message.row_id} was written into {stored.session_id} after its "
                f"rotation to {cut.child_id}")
    members: dict[str, list[str]] = defaultdict(list)
    root = roots(record)
    for s in record.sessions:
        members[root.get(s.id, s.id)].append(s.id)
    for lineage, ids in members.items():
        tips = [i for i in ids if sessions[i].end_reason != COMPRESSION]
        if len(tips) != 1:
            bad(f"lineage {lineage} has {len(tips)} tips ({', '.join(tips) or 'none'}), not one")
    return out


@checker("compaction_loses_no_message", ("CMP-5",),
         "each compaction keeps the last user input and every pending call of what it replaced")
def compaction_loses_no_message(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for done in obs.record.compactions:
        then = as_written(obs, done.first_row_id)
        kept = [then(m) for m in _compacted_rows(obs.record, done)]
        before = [then(m) for m in _replaced_rows(obs.record, done)]
        where = f"compaction of {done.session_id} at {done.at:g}"
        if not kept:
            out.append(Violation("compaction_loses_no_message", "CMP-5",
                                 f"{where} left no message"))
            continue
        users = [m for m in before if m.role is Role.USER and m.turn_id is not None]
        if users and not any((m.role, m.content, m.turn_id) == (
                Role.USER, users[-1].content, users[-1].turn_id) for m in kept):
            out.append(Violation("compaction_loses_no_message", "CMP-5",
                                 f"{where} lost the last user input #{users[-1].row_id} "
                                 f"({users[-1].turn_id})"))
        answered = {m.tool_call_id for m in before if m.role is Role.TOOL}
        pending = [c.id for m in before for c in m.tool_calls if c.id not in answered]
        kept_calls = {c.id for m in kept for c in m.tool_calls}
        lost = [call for call in pending if call not in kept_calls]
        if lost:
            out.append(Violation("compaction_loses_no_message", "CMP-5",
                                 f"{where} lost pending call(s) {', '.join(lost)}"))
    return out


@checker("turns_find_the_tip", ("CMP-5",),
         "a turn asked for a rotated session writes in its lineage's tip; a route leaves a "
         "rotated session only for its tip, or because the tip ended")
def turns_find_the_tip(obs: Observation) -> list[Violation]:
    record = obs.record
    sessions = {s.id: s for s in record.sessions}
    root = roots(record)
    copied = copied_row_ids(record)
    rotated_at = {c.session_id: c.first_row_id for c in record.compactions if c.child_id}
    out: list[Violation] = []
    for run in obs.runs or ():
        asked = sessions.get(run.session_id)
        if run.crashed or run.turn_id is None or asked is None or asked.end_reason != COMPRESSION:
            continue
        lineage = root.get(run.session_id, run.session_id)
        cut = rotated_at.get(run.session_id, 0)
        rows = [m for m in record.messages if m.message.turn_id == run.turn_id
                and m.message.role is Role.USER and (m.message.row_id or 0) not in copied]
        homes = {m.session_id for m in rows}
        late = {m.session_id for m in rows if m.session_id == run.session_id
                and (m.message.row_id or 0) > cut}  # into the parent after its rotation
        wrong = [h for h in homes if root.get(h, h) != lineage] + sorted(late)
        refused = any(v.exit is not None and v.exit.reason in _HANDED_BACK
                      for v in obs.turns.values() if v.turn_id == run.turn_id)
        if wrong or (not rows and not refused):
            found = ", ".join(sorted(homes)) or "nowhere"
            out.append(Violation("turns_find_the_tip", "CMP-5",
                                 f"turn {run.turn_id} asked for {run.session_id} (rotated) "
                                 f"wrote its input {found}, not in the lineage's tip"))
    out.extend(_compacting_turns_go_on(obs, copied))
    out.extend(_routes_follow_the_tip(obs))
    return out


# a turn that ends so wrote no input of its own: the lease was refused (LEASE-5) or the store
# refused its user row (LOOP-3), and the input was handed back
_HANDED_BACK = frozenset({ExitReason.LEASE_TIMEOUT, ExitReason.PERSISTENCE_FAILED})


def _compacting_turns_go_on(obs: Observation, copied: frozenset[int]) -> list[Violation]:
    """A turn that compacted and did not die writes the rest of itself after the compacted
    rows, where they live (a lost lease excuses it: then nothing may be written)."""
    record = obs.record
    ran = {run.turn_id: run for run in obs.runs or () if run.turn_id is not None}
    failed_closed = {v.turn_id for v in obs.turns.values()  # a held answer that stood is
                     if v.exit is not None and v.exit.reason in CONTEXT_PRESSURE_EXITS
                     and not held_answer_stood(obs, v)}  # a row written after it (FIN-6)
    out: list[Violation] = []
    for done in record.compactions:
        turn = holder_fields(done.holder).get("turn")
        run = ran.get(turn or "")
        if run is None or run.crashed or turn in failed_closed:
            continue  # died, or still did not fit and failed closed: FIN-5 adds no row then
        target = done.child_id or done.session_id
        if any(c.session_id == target and c.first_row_id > done.first_row_id
               and holder_fields(c.holder).get("turn") == turn for c in record.compactions):
            continue  # CTX-6: the same turn compacted it again; it goes on from that one
        grants = [g for g in record.lease_grants if g.session_id == target
                  and holder_fields(g.holder).get("turn") == turn]
        if any(g.end_reason not in (None, "released", ROTATED) for g in grants):
            continue  # its lease was lost: the fence rightly kept it out
        after = [m for m in record.messages if m.session_id == target
                 and m.message.turn_id == turn and (m.message.row_id or 0) not in copied
                 and (m.message.row_id or 0) >= done.first_row_id]
        if not after:
            out.append(Violation("turns_find_the_tip", "CMP-5",
                                 f"turn {turn} compacted {done.session_id} into {target} and "
                                 "wrote nothing there afterwards (it went on elsewhere, or "
                                 "not at all)"))
    return out


def _routes_follow_the_tip(obs: Observation) -> list[Violation]:
    record = obs.record
    sessions = {s.id: s for s in record.sessions}
    root = roots(record)
    last: dict[str, str] = {}
    out: list[Violation] = []
    for route in record.routes:
        before = last.get(route.key)
        last[route.key] = route.session_id
        old = sessions.get(before) if before is not None else None
        if old is None or old.end_reason != COMPRESSION or route.session_id == before:
            continue
        lineage = root.get(old.id, old.id)
        if root.get(route.session_id, route.session_id) == lineage:
            continue  # healed to the tip
        tips = [s for s in record.sessions if root.get(s.id, s.id) == lineage
                and s.end_reason != COMPRESSION]
        live = [t.id for t in tips if t.ended_at is None or t.ended_at > route.at + EPSILON_S]
        if live:
            out.append(Violation("turns_find_the_tip", "CMP-5",
                                 f"route {route.key} r{route.revision} left {old.id} (rotated) "
                                 f"for {route.session_id} while its tip {live[0]} was live"))
    return out


@checker("asked_compactions_happen", ("CMP-5",),
         "a turn asked to compact committed its compaction, or was refused the lock")
def asked_compactions_happen(obs: Observation) -> list[Violation]:
    record = obs.record
    done = {holder_fields(c.holder).get("turn") for c in record.compactions}
    refused = {holder_fields(g.holder).get("turn") for g in record.compression_locks
               if not g.granted}
    lost = {holder_fields(g.holder).get("turn") for g in record.lease_grants
            if g.end_reason in ("expired", "holder_dead")}
    out: list[Violation] = []
    for run in obs.runs or ():
        if not isinstance(run, CompactionRun) or run.crashed or run.write_failures \
                or run.turn_id is None:
            continue
        if run.turn_id not in done | refused | lost:
            out.append(Violation("asked_compactions_happen", "CMP-5",
                                 f"turn {run.turn_id} of {run.session_id} was asked to compact "
                                 "and left no trace: no compaction, no refused lock"))
    return out


@checker("one_compressor_at_a_time", ("CMP-6",),
         "a session's compression lock has one live holder at a time, and every compaction "
         "was committed by the holder of its session's lock")
def one_compressor_at_a_time(obs: Observation) -> list[Violation]:
    grants = [g for g in obs.record.compression_locks if g.granted]
    out: list[Violation] = []
    by_session = defaultdict(list)
    for grant in grants:
        by_session[grant.session_id].append(grant)
    for session_id, held in by_session.items():
        for a, b in combinations(held, 2):
            if a.holder != b.holder and a.acquired_at < b.live_until() - EPSILON_S \
                    and b.acquired_at < a.live_until() - EPSILON_S:
                out.append(Violation("one_compressor_at_a_time", "CMP-6",
                                     f"{session_id}: the compression lock was held by "
                                     f"{a.holder} and {b.holder} at once"))
    for done in obs.record.compactions:
        mine = [g for g in by_session.get(done.session_id, []) if g.holder == done.holder
                and g.acquired_at <= done.at + EPSILON_S <= g.live_until() + 2 * EPSILON_S]
        if not mine:
            out.append(Violation("one_compressor_at_a_time", "CMP-6",
                                 f"{done.session_id} was compacted at {done.at:g} by "
                                 f"{done.holder}, which did not hold its compression lock"))
    out.extend(_compacted_under_the_lock(obs))
    return out


def _compacted_under_the_lock(obs: Observation) -> list[Violation]:
    """The same, in the world's effect order: a lock given back and a compaction written at
    one instant share a time, so the durable spans cannot tell which came first. The holder's
    last lock step before its compaction must be a take, not a release (fail on silence: a
    compaction with no take before it at all is one)."""
    if obs.lease_log is None:
        return []
    last: dict[tuple[str, str], str] = {}
    out: list[Violation] = []
    for step in obs.lease_log:
        key = (step.session_id, step.holder)
        if step.what in ("lock_taken", "lock_released"):
            last[key] = step.what
        elif step.what == "compacted" and last.get(key) != "lock_taken":
            out.append(Violation("one_compressor_at_a_time", "CMP-6",
                                 f"{step.session_id} was compacted by {step.holder} at effect "
                                 f"{step.seq}, after it had "
                                 f"{'given back' if key in last else 'never taken'} the "
                                 "session's compression lock"))
    return out


@checker("one_lease_per_lineage", ("LEASE-1",),
         "a compression lineage has at most one live turn lease, and a rotation carries it "
         "to the child whole")
def one_lease_per_lineage(obs: Observation) -> list[Violation]:
    record = obs.record
    root = roots(record)
    out: list[Violation] = []
    by_lineage = defaultdict(list)
    for grant in record.lease_grants:
        by_lineage[root.get(grant.session_id, grant.session_id)].append(grant)
    for lineage, held in by_lineage.items():
        for a, b in combinations(held, 2):
            if a.session_id != b.session_id and a.acquired_at < b.live_until() - EPSILON_S \
                    and b.acquired_at < a.live_until() - EPSILON_S:
                out.append(Violation("one_lease_per_lineage", "LEASE-1",
                                     f"lineage {lineage}: {a.session_id} token {a.token} and "
                                     f"{b.session_id} token {b.token} were live at once"))
    for done in record.compactions:
        if done.child_id is None:
            continue
        carried = [g for g in record.lease_grants if g.session_id == done.child_id
                   and g.token == done.token and g.holder == done.holder
                   and abs(g.acquired_at - done.at) <= EPSILON_S]
        if not carried:
            out.append(Violation("one_lease_per_lineage", "LEASE-1",
                                 f"{done.session_id} rotated to {done.child_id} at {done.at:g} "
                                 f"without carrying its lease (token {done.token})"))
    return out
