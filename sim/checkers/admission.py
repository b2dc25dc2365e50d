"""Checkers of the admission door (ADM), over the durable record and the world's ack log.

Theory of operation
-------------------
The record holds every admission row, with what the store wrote at each transition: the
claim count and the message high-water mark at the claim, the turn that settled it, how
and under which epoch, and the store's admission clock (``claimed_tick``,
``unknown_tick``, ``settled_tick``) that orders claims against settlements without
anybody's clock. The bindings and the runtime epoch are in the record too. The world's
ack log (``DoorObservation.acks``) holds every answer a submitter received, with the
store's committed admission mark at that instant and what was submitted.

Nothing here asks the engine: a digest is recomputed from the stored payload with this
module's own canonical JSON, the role is compared with the durable binding, and the turn
of an admission is found by its turn id or, for one whose process died, by its text
among the user rows written after its claim. Where the record must show something (a
row for an ack, a turn for a completed admission), its absence is the violation.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from hermes_ref.admission import (
    Ack,
    AdmissionRow,
    AdmissionStatus,
    Move,
    Outcome,
    Refusal,
)
from hermes_ref.models import Role
from sim.checkers.base import Observation, Violation, checker, remembered
from sim.checkers.rules import normalized_payload
from sim.world import SIM_PID_NAMESPACE, AckRecord


@dataclass(frozen=True)
class DoorObservation(Observation):
    """An observation with the world's ack log; None where nobody recorded it."""

    acks: tuple[AckRecord, ...] | None = None


def _acks(obs: Observation) -> tuple[AckRecord, ...]:
    return (obs.acks or ()) if isinstance(obs, DoorObservation) else ()


def digest_of(session_id: str, payload: Any, intent: str) -> str:
    """SHA-256 of canonical ``{target, payload: {input, intent}}``, computed here."""
    body = {"target": session_id, "payload": {"input": payload, "intent": intent}}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def submitted_digest(obs: Observation, rec: AckRecord) -> str | None:
    """The digest of what was submitted, or None when it does not normalize (read once
    per ack record and limits: both are values)."""
    return remembered(obs, "submitted digest", (rec, obs.limits),
                      lambda: _submitted_digest(obs, rec))


def _submitted_digest(obs: Observation, rec: AckRecord) -> str | None:
    """The digest over the payload as the spec normalizes it (``rules.normalized_payload``,
    restated rather than the engine's, which a broken door would share)."""
    sub = rec.submitted
    try:
        payload = normalized_payload(sub.payload, obs.limits.admission_payload_bytes_max)
        if payload is None:
            return None
        return digest_of(str(sub.session_id), payload, str(sub.intent))
    except (AttributeError, TypeError, ValueError):
        return None


def _by_id(obs: Observation) -> dict[str, AdmissionRow]:
    return {r.admission_id: r for r in obs.record.admissions}


# ---- ADM-1: acknowledged only after the commit ---------------------------------------------


@checker("acked_after_commit", ("ADM-1",),
         "every ack names a durable row committed before the ack (seq within the store's "
         "mark at that instant); every submission gets an answer")
def acked_after_commit(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    rows = _by_id(obs)
    for rec in _acks(obs):
        answer = rec.answer
        if answer is None:
            out.append(Violation("acked_after_commit", "ADM-1",
                                 f"submission {_key(rec)} got no answer at all"))
            continue
        if not isinstance(answer, Ack):
            continue
        row = rows.get(answer.admission_id)
        if row is None:
            out.append(Violation("acked_after_commit", "ADM-1",
                                 f"acknowledged admission {answer.admission_id} has no row"))
        elif row.seq > rec.mark or answer.seq != row.seq:
            out.append(Violation("acked_after_commit", "ADM-1",
                                 f"admission {row.admission_id} (seq {row.seq}) was acknowledged "
                                 f"as seq {answer.seq} while the store's mark was {rec.mark}"))
    return out


def _key(rec: AckRecord) -> str:
    sub = rec.submitted
    if sub is None:
        return "?"
    return f"{sub.principal_id!r}/{sub.session_id!r}/{sub.request_id!r}"


@checker("inputs_come_through_the_door", ("ADM-1",),
         "in a session with bound principals every user row belongs to an admitted input")
def inputs_come_through_the_door(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    door_sessions = {b.session_id for b in obs.record.bindings}
    linked = {r.turn_id for r in obs.record.admissions if r.turn_id is not None}
    open_claims = [r for r in obs.record.admissions
                   if r.claims and r.turn_id is None and r.claim_mark is not None]
    users = [s for s in obs.record.messages
             if s.session_id in door_sessions and s.message.role is Role.USER]
    # a claimed input whose turn never settled is known by its text, after the claim; the
    # turn whose row that is was admitted, and so are the corrections it took in (LOOP-4)
    for stored in users:
        row = stored.message
        if row.turn_id is not None and row.turn_id not in linked and any(
                a.session_id == stored.session_id and (row.row_id or 0) > (a.claim_mark or 0)
                and a.text == row.content for a in open_claims):
            linked.add(row.turn_id)
    for stored in users:
        row = stored.message
        if row.turn_id in linked or any(
                a.session_id == stored.session_id and (row.row_id or 0) > (a.claim_mark or 0)
                and a.text == row.content for a in open_claims):
            continue
        out.append(Violation("inputs_come_through_the_door", "ADM-1",
                             f"user row #{row.row_id} of {stored.session_id} (turn {row.turn_id}) "
                             "was never admitted"))
    return out


# ---- ADM-2: authority from the binding -----------------------------------------------------


# What each bound role may ask for, restated here (not read from the engine's table, so a
# widened table cannot also widen its judge): a member queues, an owner may also steer, an
# operator may also redirect.
ROLE_MAY: dict[str, frozenset[str]] = {
    "member": frozenset({"queue"}),
    "owner": frozenset({"queue", "steer"}),
    "operator": frozenset({"queue", "steer", "redirect"}),
}


@checker("authority_from_binding", ("ADM-2",),
         "every admission's role and principal kind are its durable binding's, and its "
         "intent is one that role may use; an internal event is admitted only from a "
         "principal bound as that kind")
def authority_from_binding(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    bindings = {(b.principal_id, b.session_id): b for b in obs.record.bindings}
    for row in obs.record.admissions:
        binding = bindings.get((row.principal_id, row.session_id))
        where = f"admission {row.admission_id} from {row.principal_id}"
        if binding is None:
            problem = "has no binding to its session"
        elif row.role is not binding.role:
            problem = f"was admitted as {row.role.value}, but the binding says {binding.role.value}"
        elif row.principal_kind is not binding.kind:
            problem = f"came as {row.principal_kind.value}, bound as {binding.kind.value}"
        elif row.intent.value not in ROLE_MAY.get(binding.role.value, frozenset()):
            problem = f"asked to {row.intent.value}, which a {binding.role.value} may not"
        else:
            continue
        out.append(Violation("authority_from_binding", "ADM-2", f"{where} {problem}"))
    for rec in _acks(obs):  # the kind an internal event claims is the submitter's say-so
        sub, answer = rec.submitted, rec.answer
        claimed = getattr(sub, "kind", None)
        if claimed is None or not isinstance(answer, Ack):
            continue
        binding = bindings.get((answer.principal_id, answer.session_id))
        if binding is None or binding.kind.value != str(claimed):
            bound = binding.kind.value if binding is not None else "nothing"
            out.append(Violation("authority_from_binding", "ADM-2",
                                 f"a {claimed} event from {answer.principal_id} was admitted "
                                 f"as {answer.admission_id}, but the principal is bound as "
                                 f"{bound}"))
    return out


# ---- ADM-3: one request, one row, one digest -----------------------------------------------


@checker("one_request_one_row", ("ADM-3",),
         "(principal, session, request) has at most one row, whose digest is its payload's; "
         "an ack answers only that key and the same digest, a conflict only another digest")
def one_request_one_row(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    keys: dict[tuple[str, str, str], list[AdmissionRow]] = defaultdict(list)
    for row in obs.record.admissions:
        keys[(row.principal_id, row.session_id, row.request_id)].append(row)
        if _row_digest(obs, row) != row.payload_digest:
            out.append(_v3(f"admission {row.admission_id} stores a digest of another payload"))
    out.extend(_v3(f"request {key} has {len(rows)} rows") for key, rows in keys.items()
               if len(rows) > 1)
    by_id = _by_id(obs)
    for rec in _acks(obs):
        sub, answer = rec.submitted, rec.answer
        if sub is None or not isinstance(answer, Ack | Refusal):
            continue
        found = keys.get((str(sub.principal_id), str(sub.session_id), str(sub.request_id)))
        digest = submitted_digest(obs, rec)
        acked = by_id.get(answer.admission_id) if isinstance(answer, Ack) else None
        if acked is not None and (acked.principal_id, acked.session_id, acked.request_id) != (
                sub.principal_id, sub.session_id, sub.request_id):
            out.append(_v3(f"request {_key(rec)} was answered with {acked.admission_id}, the "
                           f"admission of {acked.principal_id!r}'s request {acked.request_id!r}"))
        if isinstance(answer, Ack) and found and digest is not None \
                and found[0].payload_digest != digest:
            out.append(_v3(f"request {_key(rec)} with another payload was acknowledged as "
                           f"{answer.admission_id}"))
        if isinstance(answer, Refusal) and answer.code == "admission_conflict" and (
                not found or found[0].payload_digest == digest):
            out.append(_v3(f"request {_key(rec)} was refused as a conflict without one"))
    out.extend(_stale_fresh_acks(obs))
    return out


def _stale_fresh_acks(obs: Observation) -> list[Violation]:
    """An ack says ``fresh`` only for the submission that inserted its row: once an earlier
    answer of the same request (an ack, or a submission whose process died before it
    answered) saw the row committed, a later ack of it is the existing admission."""
    out: list[Violation] = []
    seen: dict[tuple[str, str, str], list[int]] = defaultdict(list)  # marks of earlier answers
    by_id = _by_id(obs)
    for rec in _acks(obs):
        sub, answer = rec.submitted, rec.answer
        if sub is None:
            continue
        key = (str(sub.principal_id), str(sub.session_id), str(sub.request_id))
        row = by_id.get(answer.admission_id) if isinstance(answer, Ack) else None
        if isinstance(answer, Ack) and answer.fresh and row is not None \
                and any(mark >= row.seq for mark in seen[key]):
            out.append(_v3(f"request {_key(rec)} was acknowledged as a fresh admission, but "
                           f"its row {row.admission_id} was committed before it was submitted"))
        seen[key].append(rec.mark)
    return out


def _row_digest(obs: Observation, row: AdmissionRow) -> str:
    """The digest of the payload ``row`` stores (read once per row value)."""
    return remembered(obs, "row digest", (row,), lambda: digest_of(
        row.session_id, json.loads(row.payload_json), row.intent.value))


def _v3(message: str) -> Violation:
    return Violation("one_request_one_row", "ADM-3", message)


# ---- ADM-4 / ADM-5: FIFO, one in flight, a paused queue ------------------------------------


@checker("fifo_one_in_flight", ("ADM-4", "ADM-5"),
         "a session's admissions are claimed in seq order, one at a time; none is claimed "
         "while another is unknown")
def fifo_one_in_flight(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    by_session: dict[str, list[AdmissionRow]] = defaultdict(list)
    for row in obs.record.admissions:
        by_session[row.session_id].append(row)
    for rows in by_session.values():
        for later in (r for r in rows if r.claimed_tick is not None):
            claim = later.claimed_tick or 0
            for earlier in rows:
                out.extend(_order_problems(earlier, later, claim))
    return out


def _order_problems(earlier: AdmissionRow, later: AdmissionRow, claim: int) -> list[Violation]:
    if earlier is later:
        return []
    ended = earlier.settled_tick if earlier.settled_tick is not None else 1 << 62
    if earlier.seq < later.seq and (earlier.claimed_tick is None or earlier.claimed_tick > claim) \
            and not ended < claim:
        return [Violation("fifo_one_in_flight", "ADM-4",
                          f"admission {later.admission_id} (seq {later.seq}) was claimed before "
                          f"{earlier.admission_id} (seq {earlier.seq})")]
    began = earlier.claimed_tick
    if began is None or not began < claim < ended:
        return []
    if earlier.unknown_tick is not None and earlier.unknown_tick < claim:
        return [Violation("fifo_one_in_flight", "ADM-5",
                          f"admission {later.admission_id} was claimed while "
                          f"{earlier.admission_id} was unknown: the queue did not pause")]
    return [Violation("fifo_one_in_flight", "ADM-4",
                      f"admission {later.admission_id} was claimed while "
                      f"{earlier.admission_id} was still in flight")]


@checker("unknown_is_never_rerun", ("ADM-5",),
         "an admission is claimed once; a started one of a dead epoch is unknown, and an "
         "unknown one ends only by an explicit reconcile, its turn never run again")
def unknown_is_never_rerun(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for row in obs.record.admissions:
        where = f"admission {row.admission_id}"
        if row.claims > 1:
            out.append(_v5(f"{where} was claimed {row.claims} times: its input ran again"))
        if row.claims and row.status is AdmissionStatus.QUEUED:
            out.append(_v5(f"{where} was claimed once and is queued again"))
        if row.status is AdmissionStatus.STARTED and row.owner_epoch in _overdue(obs):
            out.append(_v5(f"{where} is still started under dead epoch {row.owner_epoch}"))
        if row.unknown_tick is not None and row.status is AdmissionStatus.TERMINAL \
                and row.settled_via is not Move.RECONCILE:
            out.append(_v5(f"{where} was unknown and ended by {row.settled_via}, "
                           "not by a reconcile"))
        if row.status is AdmissionStatus.TERMINAL and row.settled_via is None:
            out.append(_v5(f"{where} is terminal, but nothing settled it"))
        if row.unknown_tick is not None and len(_turns_of(obs, row)) > 1:
            out.append(_v5(f"{where} was unknown and its input ran in "
                           f"{len(_turns_of(obs, row))} turns"))
    return out


def _v5(message: str) -> Violation:
    return Violation("unknown_is_never_rerun", "ADM-5", message)


def _overdue(obs: Observation) -> set[int]:
    """Epochs recovery must have retired: retired ones, and those of a simulated process
    that died before a later epoch began (whose recovery then had to find it dead)."""
    deaths = dict(obs.deaths)
    out: set[int] = set()
    for e in obs.record.epochs:
        died = deaths.get(_sim_pid(e.holder) or -1)
        if e.retired_at is not None or (died is not None and any(
                later.epoch > e.epoch and later.started_at >= died
                for later in obs.record.epochs)):
            out.add(e.epoch)
    return out


def _sim_pid(holder: str) -> int | None:
    """The pid of a simulated process's holder (``pid=N:pidns=sim``); None for any other
    holder, whose death no simulated world recorded."""
    parts = dict(p.split("=", 1) for p in holder.split(":") if "=" in p)
    if parts.get("pidns") != SIM_PID_NAMESPACE or not parts.get("pid", "").isdigit():
        return None
    return int(parts["pid"])


@checker("unknown_only_after_death", ("ADM-5",),
         "an epoch is retired, and its started admissions made unknown, only after its "
         "process died (or a later epoch of the same holder began): a live process keeps "
         "its admissions")
def unknown_only_after_death(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    deaths = dict(obs.deaths)
    epochs = {e.epoch: e for e in obs.record.epochs}
    for e in epochs.values():
        pid = _sim_pid(e.holder)
        if e.retired_at is None or pid is None:
            continue
        died = deaths.get(pid)
        replaced = any(o.holder == e.holder and o.epoch > e.epoch
                       and o.started_at <= e.retired_at for o in epochs.values())
        if (died is None or died > e.retired_at) and not replaced:
            out.append(Violation("unknown_only_after_death", "ADM-5",
                                 f"epoch {e.epoch} of {e.holder} was retired at "
                                 f"{e.retired_at:g} while its process lived"))
    for row in obs.record.admissions:
        owner = epochs.get(row.owner_epoch)
        if row.unknown_tick is not None and owner is not None and owner.retired_at is None:
            out.append(Violation("unknown_only_after_death", "ADM-5",
                                 f"admission {row.admission_id} was made unknown, but its "
                                 f"owner epoch {owner.epoch} ({owner.holder}) is live"))
    return out


def _turns_of(obs: Observation, row: AdmissionRow) -> set[str | None]:
    """The turns that wrote this admission's text as a user row after its claim."""
    others = {r.turn_id for r in obs.record.admissions if r is not row and r.turn_id}
    return {m.turn_id for m in obs.record.transcript(row.session_id)
            if m.role is Role.USER and (m.row_id or 0) > (row.claim_mark or 0)
            and m.content == row.text and m.turn_id not in others}


# ---- ADM-5 / ADM-7: every input ends once ---------------------------------------------------


@checker("every_input_ends_once", ("ADM-5", "ADM-7"),
         "an admitted input ends in the transcript exactly once (completed) or in a terminal "
         "failure record; a queued one is never lost or made unknown before it runs")
def every_input_ends_once(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for row in obs.record.admissions:
        where = f"admission {row.admission_id}"
        if row.claims == 0 and row.status is AdmissionStatus.UNKNOWN:
            out.append(_v7(f"{where} never ran but was made unknown: a queued input is stuck"))
        if row.claims == 0 and row.status is AdmissionStatus.TERMINAL \
                and row.settled_via is not Move.CANCEL:
            out.append(_v7(f"{where} ended ({row.outcome}) without running or a cancel"))
        if row.status is not AdmissionStatus.TERMINAL or row.settled_via is not Move.SETTLE:
            continue
        if row.turn_id is None:
            out.append(_v5e(f"{where} was settled without naming its turn"))
            continue
        users = [m for m in obs.rows_of_turn(row.turn_id)
                 if m.role is Role.USER and m.content == row.text]
        if row.outcome is Outcome.COMPLETED and len(users) != 1:
            out.append(_v5e(f"{where} completed, and its turn {row.turn_id} holds its input "
                            f"{len(users)} times"))
        elif len(users) > 1:
            out.append(_v5e(f"{where} holds its input {len(users)} times in turn {row.turn_id}"))
    return out


def _v7(message: str) -> Violation:
    return Violation("every_input_ends_once", "ADM-7", message)


def _v5e(message: str) -> Violation:
    return Violation("every_input_ends_once", "ADM-5", message)


# ---- ADM-6: a refusal hands the input back -------------------------------------------------


@checker("refusal_hands_input_back", ("ADM-6",),
         "a refused submission gets its own input back, and nothing it asked for was "
         "already admitted when it was refused")
def refusal_hands_input_back(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for rec in _acks(obs):
        answer, sub = rec.answer, rec.submitted
        if not isinstance(answer, Refusal) or sub is None:
            continue
        if answer.carried is not sub.payload and answer.carried != sub.payload:
            out.append(Violation("refusal_hands_input_back", "ADM-6",
                                 f"submission {_key(rec)} was refused ({answer.code}) and "
                                 f"handed back {answer.carried!r:.60} instead of its input"))
        digest = submitted_digest(obs, rec)
        if any(r.principal_id == sub.principal_id and r.session_id == sub.session_id
               and r.request_id == sub.request_id and r.payload_digest == digest
               and r.seq <= rec.mark for r in obs.record.admissions):
            out.append(Violation("refusal_hands_input_back", "ADM-6",
                                 f"submission {_key(rec)} was refused ({answer.code}) "
                                 "but admitted all the same"))
    return out


# ---- ADM-5 / ADM-6: a settle tells how its turn ended ---------------------------------------


@checker("settled_as_its_turn_ended", ("ADM-5", "ADM-6"),
         "a settled admission's outcome is how its turn ended, as the turn's own exit and "
         "completion events record it: a refused turn's input was handed back (rejected), "
         "an interrupted turn is interrupted, a failed one failed, only the rest completed")
def settled_as_its_turn_ended(obs: Observation) -> list[Violation]:
    """Read from the event log the turn left durably (its exit line and completion), never
    from the settle itself. A settled admission whose turn left neither is a violation: the
    settle then told something nobody recorded."""
    exits = {e.turn_id: e for e in obs.events("turn.exit")}
    completions = {e.turn_id: e for e in obs.events("turn.completed")}
    out: list[Violation] = []
    for row in obs.record.admissions:
        if row.settled_via is not Move.SETTLE or row.turn_id is None:
            continue
        where = f"admission {row.admission_id} (turn {row.turn_id})"
        exit_line, completion = exits.get(row.turn_id), completions.get(row.turn_id)
        if exit_line is None or completion is None:
            out.append(_v5s(f"{where} was settled {row.outcome}, but its turn left no "
                            "exit line and completion"))
            continue
        if completion.data.get("carried_input") is not None:
            want, invariant = Outcome.REJECTED, "ADM-6"
        elif exit_line.data.get("reason") == "interrupted":
            want, invariant = Outcome.INTERRUPTED, "ADM-5"
        elif completion.data.get("failed"):
            want, invariant = Outcome.FAILED, "ADM-5"
        else:
            want, invariant = Outcome.COMPLETED, "ADM-5"
        if row.outcome is not want:
            if want is Outcome.REJECTED or row.outcome is Outcome.REJECTED:
                invariant = "ADM-6"
            out.append(Violation("settled_as_its_turn_ended", invariant,
                                 f"{where} was settled {row.outcome}, but its turn ended "
                                 f"{want.value} ({exit_line.data.get('reason')})"))
    return out


def _v5s(message: str) -> Violation:
    return Violation("settled_as_its_turn_ended", "ADM-5", message)
