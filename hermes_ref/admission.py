"""The one door: who may submit what to which session, and the life of an admitted input.

Theory of operation
-------------------
Every input a session runs (a user's message, a platform message, a background
completion, a cron tick, a subagent's report) enters through the same door (ADM-1):

    authorize → normalize → durable ``queued`` row → acknowledgement

*Authorize* reads the durable binding of (principal, session): the binding alone says
which role the principal has there, and the role alone says which intents it may use
(ADM-2). Nothing in the payload is authority: a payload that says ``"role": "operator"``
is text, stored and digested like any other field, and read by nobody.

*Normalize* turns what was handed in (a JSON object, or its text) into the canonical
payload: plain JSON values, a non-empty ``text`` with its line ends made ``\\n``, within
``Limits.admission_payload_bytes_max``. Keys are non-empty strings within
``admission_key_chars_max``. Anything else is refused with ``invalid_params`` before a
byte is written.

*Idempotency* (ADM-3) is keyed on (principal, session, request_id) and judged by the
SHA-256 of the canonical JSON ``{"target": session, "payload": {"input": payload,
"intent": intent}}``: the same digest is the existing admission, another digest is
``admission_conflict``. The store runs ``decide_admit`` inside the transaction that
inserts, so the check and the insert cannot be split.

The status machine is ``TRANSITIONS``; every store applies a move through ``apply_move``
and nothing else writes a status (ADM-5)::

    queued --claim--> started --settle--> terminal(completed|interrupted|rejected|failed)
    queued --cancel--> terminal(cancelled)
    started --orphan--> unknown          (its owner epoch is dead: set at recovery)
    unknown --reconcile--> terminal(interrupted)   (explicit, by an operator; never re-queued)

Epochs are per process. A process begins its own epoch (``BeginEpoch``: a new number,
recorded durably with the process's holder identity ``pid=..:pidns=..`` and its start
time); each admission it claims carries that epoch as its owner, and a settle is fenced
by the row's owner epoch being the caller's own, live epoch. Recovery (``retirable``,
then ``recover``) retires an epoch only when its holder is dead (the store's
``holder_alive`` probe) or when a later epoch of the *same* holder began: one pid in one
pid namespace is one process at a time, so an older epoch under the holder of a process
that begins again belongs to a predecessor that is gone (a restart under the same pid, as
pid 1 in a container) or that this process abandoned. Only the started rows of retired
epochs become unknown; several live processes drain one store side by side (ADM-5:
started becomes unknown after its owner dies, not when someone else starts).

``next_claim`` is the FIFO rule (ADM-4): the lowest ``seq`` queued row of the session,
none while one is started, and a paused queue while one is unknown. These functions are
reached through this module (``admission.next_claim``) by every store, so one rule
governs the memory store and both SQLite stores alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal

from hermes_ref.errors import BadInput, PersistenceError
from hermes_ref.limits import Limits
from hermes_ref.models import Frozen


class AdmissionStatus(StrEnum):
    QUEUED = "queued"
    STARTED = "started"
    UNKNOWN = "unknown"
    TERMINAL = "terminal"


class Outcome(StrEnum):
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    REJECTED = "rejected"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Move(StrEnum):
    """What may happen to an admission; each move names the one door that performs it."""

    CLAIM = "claim"          # the drain takes the head of the queue
    SETTLE = "settle"        # the drain records how its turn ended
    CANCEL = "cancel"        # a queued input is withdrawn
    ORPHAN = "orphan"        # recovery: the owner epoch died while it was started
    RECONCILE = "reconcile"  # an operator resolves an unknown admission


TRANSITIONS: dict[tuple[AdmissionStatus, Move], AdmissionStatus] = {
    (AdmissionStatus.QUEUED, Move.CLAIM): AdmissionStatus.STARTED,
    (AdmissionStatus.QUEUED, Move.CANCEL): AdmissionStatus.TERMINAL,
    (AdmissionStatus.STARTED, Move.SETTLE): AdmissionStatus.TERMINAL,
    (AdmissionStatus.STARTED, Move.ORPHAN): AdmissionStatus.UNKNOWN,
    (AdmissionStatus.UNKNOWN, Move.RECONCILE): AdmissionStatus.TERMINAL,
}

# The outcomes a move into ``terminal`` may record; the other moves record none.
MOVE_OUTCOMES: dict[Move, frozenset[Outcome]] = {
    Move.SETTLE: frozenset({Outcome.COMPLETED, Outcome.INTERRUPTED, Outcome.REJECTED,
                            Outcome.FAILED}),
    Move.CANCEL: frozenset({Outcome.CANCELLED}),
    Move.RECONCILE: frozenset({Outcome.INTERRUPTED}),
}


class PrincipalKind(StrEnum):
    USER = "user"
    PLATFORM = "platform"
    OPERATOR = "operator"
    BACKGROUND = "background"  # a background process finished
    CRON = "cron"              # a scheduled job fired
    SUBAGENT = "subagent"      # a delegated agent reports back


INTERNAL_KINDS = frozenset({PrincipalKind.BACKGROUND, PrincipalKind.CRON, PrincipalKind.SUBAGENT})


class BindingRole(StrEnum):
    MEMBER = "member"
    OWNER = "owner"
    OPERATOR = "operator"


class Intent(StrEnum):
    QUEUE = "queue"
    STEER = "steer"
    REDIRECT = "redirect"


# ADM-2: what each role may ask for. The role comes from the binding, never the payload.
ROLE_INTENTS: dict[BindingRole, frozenset[Intent]] = {
    BindingRole.MEMBER: frozenset({Intent.QUEUE}),
    BindingRole.OWNER: frozenset({Intent.QUEUE, Intent.STEER}),
    BindingRole.OPERATOR: frozenset({Intent.QUEUE, Intent.STEER, Intent.REDIRECT}),
}


class AdmissionRefused(BadInput):
    """The door said no; ``code`` is machine-readable, the message one line."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Binding(Frozen):
    """A principal's standing in one session: the only source of its role (ADM-2)."""

    principal_id: str
    kind: PrincipalKind
    session_id: str
    role: BindingRole


class AdmissionRow(Frozen):
    """One row of ``admissions``; every field after ``updated_at`` is written by the store."""

    admission_id: str
    seq: int = 0                    # FIFO order, assigned by the store at insert
    principal_id: str
    principal_kind: PrincipalKind
    session_id: str
    request_id: str
    payload_json: str               # the canonical JSON of the normalized payload
    payload_digest: str
    intent: Intent
    role: BindingRole               # the binding's role when admitted (never the payload's)
    status: AdmissionStatus = AdmissionStatus.QUEUED
    outcome: Outcome | None = None
    owner_epoch: int
    created_at: float
    updated_at: float
    claims: int = 0                 # how often it was claimed: more than once is a re-run
    claim_mark: int | None = None   # the message high-water mark when it was claimed
    turn_id: str | None = None      # the turn that ran it, set when it is settled
    settled_via: Move | None = None
    settled_epoch: int | None = None
    claimed_tick: int | None = None  # the store's admission clock at each transition
    unknown_tick: int | None = None
    settled_tick: int | None = None

    @property
    def text(self) -> str:
        return str(json.loads(self.payload_json)["text"])


Verdict = Literal["new", "hit", "conflict", "not_found"]


class AdmitAnswer(Frozen):
    """What the store did with a candidate: inserted it, found it, or refused it."""

    verdict: Verdict
    row: AdmissionRow | None = None


class ClaimAnswer(Frozen):
    """The claimed row, or none: ``busy`` while one is in flight, ``paused`` on an unknown."""

    row: AdmissionRow | None = None
    busy: bool = False
    paused: bool = False


class EpochRecord(Frozen):
    """One process's runtime epoch, as the store keeps it: whose, since when, retired when."""

    epoch: int
    holder: str                     # the process's holder identity, ``pid=..:pidns=..``
    started_at: float
    retired_at: float | None = None  # set once recovery found its holder dead (or replaced)


class EpochStart(Frozen):
    """The caller's epoch after a recovery: the epochs it retired, the rows it made unknown."""

    epoch: int
    retired: tuple[int, ...] = ()
    orphaned: tuple[AdmissionRow, ...] = ()


class Ack(Frozen):
    """The door's yes: sent to the submitter only after the row is committed (ADM-1)."""

    admission_id: str
    seq: int
    session_id: str
    principal_id: str
    request_id: str
    fresh: bool  # False: an idempotent resubmission of the same request (ADM-3)


class Refusal(Frozen):
    """The door's no; ``carried`` is the input handed back, exactly as given (ADM-6)."""

    code: str
    message: str
    principal_id: Any
    session_id: Any
    request_id: Any
    carried: Any

    def error(self) -> AdmissionRefused:
        return AdmissionRefused(self.code, self.message)


# ---- normalization and digest ---------------------------------------------------------


def check_key(name: str, value: object, limits: Limits) -> str:
    """A principal, session or request id: a non-empty printable string within the bound."""
    if not isinstance(value, str) or not value or len(value) > limits.admission_key_chars_max \
            or not value.isprintable():
        raise AdmissionRefused("invalid_params", f"{name} must be a non-empty printable string "
                               f"of at most {limits.admission_key_chars_max} characters")
    return value


def canonical_json(value: object) -> str:
    """Sorted keys, no spaces, no NaN: equal values always give equal bytes."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as error:
        raise AdmissionRefused("invalid_params", f"payload is not JSON: {error}") from error


def normalize_payload(payload: object, limits: Limits) -> dict[str, Any]:
    """The canonical payload of what was handed in, or ``invalid_params``."""
    if isinstance(payload, str | bytes):
        try:
            payload = json.loads(payload)
        except ValueError as error:
            raise AdmissionRefused("invalid_params", f"payload is not JSON: {error}") from error
    if not isinstance(payload, Mapping):
        raise AdmissionRefused("invalid_params", "payload must be a JSON object")
    text = canonical_json(payload)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as error:  # a lone surrogate: no store could keep it
        raise AdmissionRefused("invalid_params", "payload is not valid Unicode") from error
    if size > limits.admission_payload_bytes_max:
        raise AdmissionRefused("invalid_params", "payload is larger than "
                               f"{limits.admission_payload_bytes_max} bytes")
    plain: dict[str, Any] = json.loads(text)
    message = plain.get("text")
    if not isinstance(message, str) or not message.strip():
        raise AdmissionRefused("invalid_params", "payload needs a non-empty string 'text'")
    plain["text"] = message.replace("\r\n", "\n").replace("\r", "\n")
    return plain


def payload_digest(session_id: str, payload: Mapping[str, Any], intent: Intent) -> str:
    """SHA-256 of the canonical JSON ``{target, payload: {input, intent}}`` (ADM-3)."""
    body = {"target": session_id, "payload": {"input": dict(payload), "intent": intent.value}}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


# ---- decisions ------------------------------------------------------------------------


def authorize(binding: Binding | None, principal_id: str, session_id: str,
              intent: Intent) -> BindingRole:
    """The role the principal holds in the session, if it may use ``intent`` (ADM-2)."""
    if binding is None or binding.principal_id != principal_id \
            or binding.session_id != session_id:
        raise AdmissionRefused("not_bound", f"{principal_id!r} is not bound to {session_id!r}")
    if intent not in ROLE_INTENTS[binding.role]:
        raise AdmissionRefused("forbidden", f"a {binding.role.value} may not {intent.value}")
    return binding.role


def same_request(row: AdmissionRow, candidate: AdmissionRow) -> bool:
    """ADM-3's key: the same principal, session and request id (ids are per submitter)."""
    return (row.principal_id, row.session_id, row.request_id) == (
        candidate.principal_id, candidate.session_id, candidate.request_id)


def decide_admit(existing: AdmissionRow | None, candidate: AdmissionRow) -> Verdict:
    """ADM-3: the same key with the same digest is a hit, another digest a conflict."""
    if existing is None:
        return "new"
    return "hit" if existing.payload_digest == candidate.payload_digest else "conflict"


# The answers that claim no row: frozen values, so one of each serves every claim (a
# draining door asks again and again while an admission is in flight).
PAUSED, BUSY, NOTHING_QUEUED = ClaimAnswer(paused=True), ClaimAnswer(busy=True), ClaimAnswer()


def next_claim(rows: Iterable[AdmissionRow]) -> ClaimAnswer:
    """ADM-4/5: the lowest-seq queued row; none while one is started; paused on unknown."""
    queued: list[AdmissionRow] = []
    for row in rows:
        if row.status is AdmissionStatus.UNKNOWN:
            return PAUSED
        if row.status is AdmissionStatus.STARTED:
            return BUSY
        if row.status is AdmissionStatus.QUEUED:
            queued.append(row)
    return ClaimAnswer(row=min(queued, key=lambda r: r.seq)) if queued else NOTHING_QUEUED


def apply_move(row: AdmissionRow, move: Move, *, epoch: int, live: bool, now: float,
               tick: int, outcome: Outcome | None = None, turn_id: str | None = None,
               claim_mark: int | None = None) -> AdmissionRow:
    """The row after ``move``, or ``PersistenceError`` when the table or the fence says no.

    Every move but ``orphan`` is fenced by the caller's epoch: one that is unknown to the
    store or retired (``live`` false) writes nothing, and a settle must come from the row's
    owner epoch, the one that claimed it (ADM-5's settle fencing). Another live process's
    epoch is no reason to refuse: many processes drain one store.
    """
    target = TRANSITIONS.get((row.status, move))
    if target is None:
        raise PersistenceError(f"admission {row.admission_id} is {row.status.value}: "
                               f"it cannot {move.value}", cause="illegal_move")
    if move is not Move.ORPHAN and (
            not live or (move is Move.SETTLE and row.owner_epoch != epoch)):
        raise PersistenceError(f"admission {row.admission_id}: epoch {epoch} is stale "
                               f"({'live' if live else 'retired or unknown'}, "
                               f"owner {row.owner_epoch})", cause="stale_epoch")
    allowed = MOVE_OUTCOMES.get(move, frozenset())
    if (outcome is None) != (not allowed) or (outcome is not None and outcome not in allowed):
        raise PersistenceError(f"{move.value} cannot record outcome {outcome}",
                               cause="illegal_move")
    update: dict[str, Any] = {"status": target, "updated_at": now}
    if move is Move.CLAIM:
        update.update(claims=row.claims + 1, claim_mark=claim_mark, claimed_tick=tick,
                      owner_epoch=epoch)
    elif move is Move.ORPHAN:
        update.update(unknown_tick=tick)
    else:
        update.update(outcome=outcome, settled_via=move, settled_epoch=epoch, settled_tick=tick,
                      turn_id=turn_id if turn_id is not None else row.turn_id)
    return row.model_copy(update=update)


def epoch_live(epochs: Iterable[EpochRecord], epoch: int) -> bool:
    """The fence: ``epoch`` was begun in this store and is not retired."""
    return any(e.epoch == epoch and e.retired_at is None for e in epochs)


def fence(epochs: Iterable[EpochRecord], epoch: int) -> None:
    """A claim's fence, before the FIFO choice: a retired (or never begun) epoch claims
    nothing, even from an empty queue, so a process recovery gave up on learns it at once."""
    if not epoch_live(epochs, epoch):
        raise PersistenceError(f"epoch {epoch} is retired or unknown: it cannot claim",
                               cause="stale_epoch")


def retirable(epochs: Iterable[EpochRecord], epoch: int,
              holder_alive: Callable[[str], bool]) -> list[int]:
    """The live epochs that recovery under ``epoch`` retires: those whose holder is dead,
    and the older ones of ``epoch``'s own holder (its predecessor under the same pid)."""
    known = list(epochs)
    mine = next((e for e in known if e.epoch == epoch), None)
    if mine is None or mine.retired_at is not None:
        raise PersistenceError(f"epoch {epoch} is not live: it cannot recover",
                               cause="stale_epoch")
    return [e.epoch for e in known if e.retired_at is None and e.epoch != epoch
            and (e.holder == mine.holder or not holder_alive(e.holder))]


def orphaned(row: AdmissionRow, dead: Collection[int]) -> bool:
    """ADM-5/7 at recovery: a started row of a retired epoch becomes unknown; nothing else."""
    return row.status is AdmissionStatus.STARTED and row.owner_epoch in dead


def recover(rows: Iterable[AdmissionRow], dead: Collection[int], now: float,
            tick: int) -> list[AdmissionRow]:
    """The rows recovery changes once the ``dead`` epochs are retired: each orphan, unknown."""
    changed: list[AdmissionRow] = []
    for row in rows:
        if orphaned(row, dead):
            tick += 1
            changed.append(apply_move(row, Move.ORPHAN, epoch=row.owner_epoch, live=False,
                                      now=now, tick=tick))
    return changed


def render_mermaid() -> str:
    """The status machine as a mermaid state diagram (docs/admission.md carries it verbatim)."""
    lines = ["stateDiagram-v2", f"    [*] --> {AdmissionStatus.QUEUED.value}: admit"]
    for (source, move), target in TRANSITIONS.items():
        outcomes = sorted(o.value for o in MOVE_OUTCOMES.get(move, frozenset()))
        label = move.value + (f" ({'|'.join(outcomes)})" if outcomes else "")
        lines.append(f"    {source.value} --> {target.value}: {label}")
    lines.append(f"    {AdmissionStatus.TERMINAL.value} --> [*]")
    return "\n".join(lines)
