"""Broken admission doors: an ack before its commit or for a row the store refused, a role
read from the payload, a member allowed to steer, an internal event's kind taken on its
word, a digest ignored, a resubmission acknowledged as fresh, a newest-first claim, a queue
that does not pause, recovery that re-queues or suspects the queue, a refusal that drops
the input, every turn settled as completed, an interrupted or refused turn settled as
failed, and a recovery that takes a live process's admissions."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import admission, door
from hermes_ref.admission import (
    Ack,
    AdmissionRow,
    AdmissionStatus,
    BindingRole,
    ClaimAnswer,
    EpochRecord,
    Intent,
    Outcome,
    Refusal,
    Verdict,
)
from hermes_ref.effects import Acknowledge, AdmitInput
from hermes_ref.errors import PersistenceError
from hermes_ref.outcomes import TurnResult
from sim.sabotage.base import sabotage

# ---- ADM-1: the ack goes out before the row is committed ------------------------------------


def _ack_before_commit() -> list[AbstractContextManager[Any]]:
    async def optimistic(sub: door.Submission, candidate: AdmissionRow) -> Ack | Refusal:
        provisional = Ack(admission_id=candidate.admission_id, seq=0,
                          session_id=candidate.session_id, principal_id=candidate.principal_id,
                          request_id=candidate.request_id, fresh=True)
        await Acknowledge(provisional)  # "answer fast, the write is a formality"
        await AdmitInput(candidate)
        return provisional
    return [mock.patch.object(door, "commit_then_ack", optimistic)]


sabotage("ack_before_commit", ("ADM-1",),
         "the door acknowledges a submission first and commits its row afterwards")(
    _ack_before_commit)


# ---- ADM-2: the role comes from the payload -------------------------------------------------


def _role_from_payload() -> list[AbstractContextManager[Any]]:
    original = door._role

    def trusting(sub: door.Submission, keys: door.Keys, binding: Any) -> Any:
        claimed = sub.payload.get("role") if isinstance(sub.payload, dict) else None
        if claimed in set(BindingRole):  # "the client knows who it is"
            return BindingRole(claimed)
        return original(sub, keys, binding)
    return [mock.patch.object(door, "_role", trusting)]


sabotage("role_from_payload", ("ADM-2",),
         "authorization takes the role a payload claims when it names one")(_role_from_payload)


# ---- ADM-3: the idempotency check ignores the digest ---------------------------------------


def _digest_ignored() -> list[AbstractContextManager[Any]]:
    def by_key_only(existing: AdmissionRow | None, candidate: AdmissionRow) -> Verdict:
        return "new" if existing is None else "hit"
    return [mock.patch.object(admission, "decide_admit", by_key_only)]


sabotage("digest_ignored", ("ADM-3",),
         "a known request id is an idempotent hit whatever its payload")(_digest_ignored)


def _request_ids_per_session() -> list[AbstractContextManager[Any]]:
    def per_session(row: AdmissionRow, candidate: AdmissionRow) -> bool:
        # "a platform message id is unique in its chat": the principal is left out of the key
        return (row.session_id, row.request_id) == (candidate.session_id, candidate.request_id)
    return [mock.patch.object(admission, "same_request", per_session)]


sabotage("request_ids_per_session", ("ADM-3",),
         "the idempotency key leaves out the principal, so two submitters' request ids collide")(
    _request_ids_per_session)


# ---- ADM-4: the newest admission is claimed first ------------------------------------------


def _newest_first() -> list[AbstractContextManager[Any]]:
    def lifo(rows: Iterable[AdmissionRow]) -> ClaimAnswer:
        rows = list(rows)
        if any(r.status is AdmissionStatus.UNKNOWN for r in rows):
            return ClaimAnswer(paused=True)
        if any(r.status is AdmissionStatus.STARTED for r in rows):
            return ClaimAnswer(busy=True)
        queued = [r for r in rows if r.status is AdmissionStatus.QUEUED]
        return ClaimAnswer(row=max(queued, key=lambda r: r.seq)) if queued else ClaimAnswer()
    return [mock.patch.object(admission, "next_claim", lifo)]


sabotage("claim_newest_first", ("ADM-4",),
         "the claim takes the session's newest queued admission (ORDER BY seq DESC)")(
    _newest_first)


# ---- ADM-5: the queue does not pause; recovery re-queues a started admission ---------------


def _queue_not_paused() -> list[AbstractContextManager[Any]]:
    original = admission.next_claim

    def impatient(rows: Iterable[AdmissionRow]) -> ClaimAnswer:
        return original(r for r in rows if r.status is not AdmissionStatus.UNKNOWN)
    return [mock.patch.object(admission, "next_claim", impatient)]


sabotage("queue_not_paused", ("ADM-5",),
         "the claim skips unknown admissions instead of pausing the session's queue")(
    _queue_not_paused)


def _recovery_requeues() -> list[AbstractContextManager[Any]]:
    def requeue(rows: Iterable[AdmissionRow], dead: Collection[int], now: float,
                tick: int) -> list[AdmissionRow]:
        return [r.model_copy(update={"status": AdmissionStatus.QUEUED, "updated_at": now})
                for r in rows if admission.orphaned(r, dead)]  # "just try it again"
    return [mock.patch.object(admission, "recover", requeue)]


sabotage("recovery_requeues_started", ("ADM-5",),
         "recovery puts a dead epoch's started admissions back in the queue, so they run again")(
    _recovery_requeues)


def _settles_completed() -> list[AbstractContextManager[Any]]:
    def optimistic(result: TurnResult) -> Outcome:
        return Outcome.COMPLETED
    return [mock.patch.object(door, "outcome_of", optimistic)]


sabotage("every_turn_settles_completed", ("ADM-5",),
         "the drain settles every admission as completed, whatever its turn came to")(
    _settles_completed)


# ---- ADM-6: a refusal drops the input -------------------------------------------------------


def _refusal_drops_input() -> list[AbstractContextManager[Any]]:
    def bare(sub: door.Submission, code: str, message: str) -> Refusal:
        return Refusal(code=code, message=message, principal_id=sub.principal_id,
                       session_id=sub.session_id, request_id=sub.request_id, carried=None)
    return [mock.patch.object(door, "refusal", bare)]


sabotage("refusal_drops_input", ("ADM-6",),
         "a refused submission is answered with the reason only; its input is dropped")(
    _refusal_drops_input)


# ---- ADM-7: recovery suspects the whole queue ----------------------------------------------


def _restart_suspects_queue() -> list[AbstractContextManager[Any]]:
    def suspicious(rows: Iterable[AdmissionRow], dead: Collection[int], now: float,
                   tick: int) -> list[AdmissionRow]:
        changed = []
        for row in rows:  # "anything a dead epoch left open is suspect"
            if row.status in (AdmissionStatus.QUEUED, AdmissionStatus.STARTED) \
                    and row.owner_epoch in dead:
                tick += 1
                changed.append(row.model_copy(update={
                    "status": AdmissionStatus.UNKNOWN, "unknown_tick": tick, "updated_at": now}))
        return changed
    return [mock.patch.object(admission, "recover", suspicious)]


sabotage("restart_suspects_queue", ("ADM-7",),
         "recovery makes every open admission of a dead epoch unknown, queued ones too")(
    _restart_suspects_queue)


# ---- ADM-5: recovery takes a live process's admissions -------------------------------------


def _recovery_retires_live_epochs() -> list[AbstractContextManager[Any]]:
    def everyone_else(epochs: Iterable[EpochRecord], epoch: int,
                      holder_alive: Callable[[str], bool]) -> list[int]:
        # "whoever begins an epoch owns the store": one epoch per store, as before
        return [e.epoch for e in epochs if e.retired_at is None and e.epoch != epoch]
    return [mock.patch.object(admission, "retirable", everyone_else)]


sabotage("recovery_retires_live_epochs", ("ADM-5",),
         "recovery retires every other process's epoch, so a live process's started "
         "admissions become unknown")(_recovery_retires_live_epochs)


# ---- ADM-1: a row the store refused is acknowledged all the same ---------------------------


def _failed_admit_acked() -> list[AbstractContextManager[Any]]:
    async def hopeful(sub: door.Submission, candidate: AdmissionRow) -> Ack | Refusal:
        answered: Ack | Refusal
        try:
            answer = await AdmitInput(candidate)
        except PersistenceError:  # "the write probably went through"
            answered = Ack(admission_id=candidate.admission_id, seq=0,
                           session_id=candidate.session_id, principal_id=candidate.principal_id,
                           request_id=candidate.request_id, fresh=True)
        else:
            if answer.verdict == "conflict":
                answered = door.refusal(sub, "admission_conflict", "admitted before with "
                                        "another payload")
            elif answer.verdict == "not_found" or answer.row is None:
                answered = door.refusal(sub, "not_found", "no such session")
            else:
                row = answer.row
                answered = Ack(admission_id=row.admission_id, seq=row.seq,
                               session_id=row.session_id, principal_id=row.principal_id,
                               request_id=row.request_id, fresh=answer.verdict == "new")
        await Acknowledge(answered)
        return answered
    return [mock.patch.object(door, "commit_then_ack", hopeful)]


sabotage("failed_admit_acked", ("ADM-1",),
         "a submission whose row the store refused is acknowledged as admitted")(
    _failed_admit_acked)


# ---- ADM-2: a member may steer; an internal event's kind is taken on its word ---------------


def _member_may_steer() -> list[AbstractContextManager[Any]]:
    wider = {BindingRole.MEMBER: frozenset({Intent.QUEUE, Intent.STEER})}
    return [mock.patch.dict(admission.ROLE_INTENTS, wider)]


sabotage("member_may_steer", ("ADM-2",),
         "the role table lets a member steer, which only owners and operators may")(
    _member_may_steer)


def _kind_on_its_word() -> list[AbstractContextManager[Any]]:
    def any_kind(sub: door.Submission, keys: door.Keys, binding: Any) -> Any:
        try:
            return admission.authorize(binding, keys.principal_id, keys.session_id, keys.intent)
        except admission.AdmissionRefused as refused:  # the kind the event claims is not asked
            return door.refusal(sub, refused.code, str(refused).split(": ", 1)[-1])
    return [mock.patch.object(door, "_role", any_kind)]


sabotage("internal_kind_unchecked", ("ADM-2",),
         "an internal event is admitted from any bound principal, whatever kind it is bound "
         "as")(_kind_on_its_word)


# ---- ADM-3: a resubmission is acknowledged as a fresh admission ----------------------------


def _always_fresh() -> list[AbstractContextManager[Any]]:
    def fresh_ack(**fields: Any) -> Ack:
        return Ack(**{**fields, "fresh": True})  # "it was accepted, wasn't it"
    return [mock.patch.object(door, "Ack", fresh_ack)]


sabotage("resubmission_acked_fresh", ("ADM-3",),
         "the door tells an idempotent resubmission it made a new admission")(_always_fresh)


# ---- ADM-5 / ADM-6: the settle does not tell how its turn ended -----------------------------


def _interrupt_as_failure() -> list[AbstractContextManager[Any]]:
    def coarse(result: TurnResult) -> Outcome:
        if result.carried_input is not None:
            return Outcome.REJECTED
        return Outcome.FAILED if result.failed else Outcome.COMPLETED
    return [mock.patch.object(door, "outcome_of", coarse)]


sabotage("interrupted_turn_settles_failed", ("ADM-5",),
         "the drain settles an interrupted turn's admission as failed (or completed)")(
    _interrupt_as_failure)


def _refusal_as_failure() -> list[AbstractContextManager[Any]]:
    original = door.outcome_of

    def forgetful(result: TurnResult) -> Outcome:
        if result.carried_input is not None:  # "it did not run: a failure"
            return Outcome.FAILED
        return original(result)
    return [mock.patch.object(door, "outcome_of", forgetful)]


sabotage("refused_turn_settles_failed", ("ADM-6",),
         "a turn that could not begin and handed its input back settles its admission as "
         "failed, as if the input had run")(_refusal_as_failure)
