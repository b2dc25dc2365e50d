"""The admission door's coroutines: admit, drain, recover, reconcile, cancel.

Theory of operation
-------------------
Each coroutine only awaits effects, so the simulator, the asyncio driver, or several
simulated processes can run it. The rules they follow live in ``admission`` (pure); this
module is the order of the steps, and the order is the contract:

``admit``      check the ids (no effect yet) → ``LoadBinding`` → authorize from the
               binding alone (ADM-2) → normalize the payload → ``AdmitInput`` (idempotency
               check and insert, one transaction: ADM-3) → ``Acknowledge``. Bad input is
               refused before the one write, so it changes nothing durable.
               The ack is sent only after ``AdmitInput`` returned, that is after the row is
               committed (ADM-1). Every refusal is acknowledged too, as a ``Refusal`` that
               carries the input back as it was given (ADM-6).
``drain_step`` ``ClaimAdmission`` (FIFO, one in flight, paused on unknown: ADM-4) → the
               turn, through ``Engine.run_turn`` → ``MoveAdmission(settle)`` with the
               turn's id and outcome, fenced by the row's owner epoch being the caller's.
               A settle that fails leaves the row started; recovery makes it unknown
               once its process is dead.
``recover``    ``BeginEpoch``: this process's own new epoch, recorded with its holder;
               started rows of epochs whose holder is dead become unknown, queued rows
               stay queued (ADM-7), other live processes' rows are untouched. Nothing is
               re-run. ``recover_dead`` does the same later, under the epoch it has.
``reconcile``  an operator's explicit verdict on an unknown row: terminal(interrupted).

Internal events (a background completion, a cron tick, a subagent's report) are built
into a ``Submission`` by ``internal_submission`` and go through ``admit`` like any other
input; the binding of their principal must be of their kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hermes_ref import admission
from hermes_ref.admission import (
    Ack,
    AdmissionRefused,
    AdmissionRow,
    BindingRole,
    EpochStart,
    Intent,
    Move,
    Outcome,
    PrincipalKind,
    Refusal,
)
from hermes_ref.effects import (
    Acknowledge,
    AdmitInput,
    BeginEpoch,
    ClaimAdmission,
    LoadBinding,
    MintId,
    MoveAdmission,
    Now,
    RecoverEpochs,
)
from hermes_ref.engine import Engine
from hermes_ref.errors import PersistenceError
from hermes_ref.limits import Limits
from hermes_ref.outcomes import ExitReason, TurnResult
from hermes_ref.prologue import TurnInput


@dataclass(frozen=True, slots=True)
class Submission:
    """What a submitter handed the door, unchecked: any field may be malformed."""

    principal_id: Any
    session_id: Any
    request_id: Any
    payload: Any
    intent: Any = "queue"
    kind: PrincipalKind | None = None  # set for internal events: the binding must match


@dataclass(frozen=True, slots=True)
class Keys:
    """A submission's checked identity: who, to which session, which request, which intent."""

    principal_id: str
    session_id: str
    request_id: str
    intent: Intent


@dataclass(frozen=True, slots=True)
class DrainStep:
    """One claim of the drain: the row as it was left, and its turn's result."""

    admission: AdmissionRow | None
    result: TurnResult | None = None
    busy: bool = False    # nothing claimed: another admission of the session is in flight
    paused: bool = False  # nothing claimed: an unknown admission holds the queue
    settle_error: str | None = None


def refusal(sub: Submission, code: str, message: str) -> Refusal:
    """A refusal that hands the input back exactly as it was given (ADM-6)."""
    return Refusal(code=code, message=message, principal_id=sub.principal_id,
                   session_id=sub.session_id, request_id=sub.request_id, carried=sub.payload)


def check_keys(sub: Submission, limits: Limits) -> Keys | Refusal:
    """Ids and intent checked; no effect has happened yet."""
    try:
        principal = admission.check_key("principal_id", sub.principal_id, limits)
        session = admission.check_key("session_id", sub.session_id, limits)
        request = admission.check_key("request_id", sub.request_id, limits)
        if sub.intent not in set(Intent):
            raise AdmissionRefused("invalid_params", f"intent {sub.intent!r} is not one of "
                                   f"{', '.join(i.value for i in Intent)}")
    except AdmissionRefused as refused:
        return _refused(sub, refused)
    return Keys(principal, session, request, Intent(sub.intent))


def _role(sub: Submission, keys: Keys, binding: admission.Binding | None,
          ) -> BindingRole | Refusal:
    """The binding's role, if it lets this principal (of this kind) use this intent."""
    try:
        role = admission.authorize(binding, keys.principal_id, keys.session_id, keys.intent)
        if sub.kind is not None and (binding is None or binding.kind is not sub.kind):
            raise AdmissionRefused("not_bound", f"{keys.principal_id!r} is not bound to "
                                   f"{keys.session_id!r} as {sub.kind.value}")
    except AdmissionRefused as refused:
        return _refused(sub, refused)
    return role


def normalized(sub: Submission, limits: Limits) -> dict[str, Any] | Refusal:
    """The canonical payload, or the refusal that hands it back."""
    try:
        return admission.normalize_payload(sub.payload, limits)
    except AdmissionRefused as refused:
        return _refused(sub, refused)


def _refused(sub: Submission, error: AdmissionRefused) -> Refusal:
    return refusal(sub, error.code, str(error).split(": ", 1)[-1])


async def admit(sub: Submission, limits: Limits, epoch: int) -> Ack | Refusal:
    """authorize → normalize → durable queued row → acknowledgement (ADM-1)."""
    keys = check_keys(sub, limits)
    if isinstance(keys, Refusal):
        return await answer(keys)
    binding = await LoadBinding(keys.principal_id, keys.session_id)
    role = _role(sub, keys, binding)
    if isinstance(role, Refusal):
        return await answer(role)
    payload = normalized(sub, limits)
    if isinstance(payload, Refusal):
        return await answer(payload)
    assert binding is not None  # _role refuses a missing binding
    now = await Now()
    candidate = AdmissionRow(
        admission_id=await MintId("adm"), principal_id=keys.principal_id,
        principal_kind=binding.kind, session_id=keys.session_id, request_id=keys.request_id,
        payload_json=admission.canonical_json(payload),
        payload_digest=admission.payload_digest(keys.session_id, payload, keys.intent),
        intent=keys.intent, role=role, owner_epoch=epoch, created_at=now, updated_at=now)
    return await commit_then_ack(sub, candidate)


async def answer(given: Refusal) -> Refusal:
    """Hand a refusal to the submitter: no row was written for it."""
    await Acknowledge(given)
    return given


async def commit_then_ack(sub: Submission, candidate: AdmissionRow) -> Ack | Refusal:
    """The durable row first, then the answer: nothing is acknowledged uncommitted."""
    failure: PersistenceError | None = None
    try:
        answer = await AdmitInput(candidate)
    except PersistenceError as error:
        failure = error
    answered: Ack | Refusal
    if failure is not None:
        answered = refusal(sub, "unavailable", f"the store refused the row ({failure.cause})")
    elif answer.verdict == "conflict":
        answered = refusal(sub, "admission_conflict", f"request {candidate.request_id!r} was "
                           "admitted before with another payload")
    elif answer.verdict == "not_found" or answer.row is None:
        answered = refusal(sub, "not_found", f"no session {candidate.session_id!r}")
    else:
        row = answer.row
        answered = Ack(admission_id=row.admission_id, seq=row.seq, session_id=row.session_id,
                       principal_id=row.principal_id, request_id=row.request_id,
                       fresh=answer.verdict == "new")
    await Acknowledge(answered)
    return answered


def internal_submission(kind: PrincipalKind, principal_id: str, session_id: str,
                        event_id: str, text: str) -> Submission:
    """A background completion, cron tick or subagent report, as a door submission."""
    if kind not in admission.INTERNAL_KINDS:
        raise AdmissionRefused("invalid_params", f"{kind.value} is not an internal event kind")
    return Submission(principal_id=principal_id, session_id=session_id,
                      request_id=f"{kind.value}:{event_id}",
                      payload={"text": text, "source": kind.value, "event_id": event_id},
                      kind=kind)


def outcome_of(result: TurnResult) -> Outcome:
    """How a turn's result settles its admission."""
    if result.carried_input is not None:
        return Outcome.REJECTED  # the input never became durable: handed back (LEASE-5)
    if result.exit_reason is ExitReason.INTERRUPTED:
        return Outcome.INTERRUPTED
    return Outcome.FAILED if result.failed else Outcome.COMPLETED


async def drain_step(engine: Engine, session_id: str, epoch: int) -> DrainStep:
    """Claim the session's next admission, run its turn and settle it."""
    claim = await ClaimAdmission(session_id, epoch, await Now())
    row = claim.row
    if row is None:
        return DrainStep(None, busy=claim.busy, paused=claim.paused)
    result = await engine.run_turn(TurnInput(session_id=row.session_id, text=row.text))
    failure: PersistenceError | None = None
    try:
        row = await MoveAdmission(row.admission_id, row.session_id, Move.SETTLE, epoch,
                                  await Now(), outcome_of(result), result.turn_id)
    except PersistenceError as error:
        failure = error  # it stays started: the next epoch makes it unknown, never re-runs it
    return DrainStep(row, result, settle_error=None if failure is None else failure.cause)


async def recover(holder: str | None = None) -> EpochStart:
    """A process starts: its own new epoch, under ``holder`` (``pid=..:pidns=..``; None:
    the driver's own process); the started admissions of dead holders' epochs (and of
    older epochs of the same holder, a predecessor under the same pid) become unknown.
    Live processes' admissions stay as they are."""
    return await BeginEpoch(await Now(), holder)


async def recover_dead(epoch: int) -> EpochStart:
    """A running process looks again, under its live ``epoch``: the started admissions of
    epochs whose holder has died since become unknown; its own epoch stays."""
    return await RecoverEpochs(epoch, await Now())


async def resolve(principal_id: str, session_id: str, admission_id: str, epoch: int,
                  move: Move) -> AdmissionRow | Refusal:
    """An explicit ``reconcile`` (operators) or ``cancel`` (owners and operators)."""
    sub = Submission(principal_id, session_id, admission_id, None)
    binding = await LoadBinding(principal_id, session_id)
    allowed = {Move.RECONCILE: {BindingRole.OPERATOR},
               Move.CANCEL: {BindingRole.OWNER, BindingRole.OPERATOR}}.get(move, set())
    if binding is None or binding.role not in allowed:
        return refusal(sub, "forbidden", f"{principal_id!r} may not {move.value} here")
    outcome = Outcome.INTERRUPTED if move is Move.RECONCILE else Outcome.CANCELLED
    failure: PersistenceError | None = None
    try:
        row = await MoveAdmission(admission_id, session_id, move, epoch, await Now(), outcome)
    except PersistenceError as error:
        failure = error
    if failure is not None:
        return refusal(sub, failure.cause, str(failure))
    return row
