"""The vocabulary of the boundary: every way the engine touches the world.

Theory of operation
-------------------
The engine core never performs I/O. Where it needs the clock, the provider, the store,
a tool or the event stream, it ``await``s an effect value::

    reply = await CallProvider(request)
    rows = await AppendMessages(lease.token, session_id, (assistant_row,), Site.TOOL_CALLS)

An effect's ``__await__`` yields the effect itself to whoever drives the coroutine and
returns what the driver sends back. A driver (``hermes_ref.shell.driver`` for asyncio,
``sim.driver`` for the simulator) performs the effect and resumes the coroutine with
the result, or throws an ``OperatingError`` into it. A crash is the driver dropping the
coroutine between two effects: nothing after that point reaches the store.

Effects are frozen slotted dataclasses, not pydantic models: a turn awaits a dozen of
them and they never cross a process boundary, so validation would buy nothing.

Effects at a boundary of the turn carry a ``site`` from the closed set ``Site``: every
durable write ("user", "tool_calls", "tool_results", "final", ...) and tool execution
("tools"). The same enum names the simulator's crash points (``before:<site>``,
``after:<site>``) and its store-failure plans, so a fault can only be aimed at a site
some effect has.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

from hermes_ref.admission import (
    Ack,
    AdmissionRow,
    AdmitAnswer,
    Binding,
    ClaimAnswer,
    EpochStart,
    Move,
    Outcome,
    Refusal,
)
from hermes_ref.errors import BadInput
from hermes_ref.lane_restart import LaneEntry  # SES
from hermes_ref.models import (
    Closed,
    Closing,
    Compacted,
    Event,
    Lease,
    LeaseGrant,
    Message,
    Opening,
    ProviderReply,
    SessionRecord,
    ToolCall,
    ToolResult,
)
from hermes_ref.session import Route  # SES
from hermes_ref.tool_batch import BatchBounds  # TOOL-5
from hermes_ref.wire import ProviderRequest

T = TypeVar("T")


class Site(StrEnum):
    """Where a durable write or a tool execution happens, in turn order."""

    LEASE = "lease"
    REFRESH = "refresh"
    RECOVERY = "recovery"
    USER = "user"
    TOOL_CALLS = "tool_calls"
    TOOLS = "tools"
    TOOL_RESULTS = "tool_results"
    REDIRECT = "redirect"  # LOOP-4: a correction's rows, written when the loop takes it in
    FINAL = "final"
    TAIL_CLOSURE = "tail_closure"
    BOUNDARY = "boundary"
    RELEASE = "release"
    EVENTS = "events"
    # the admission door (ADM), outside any one turn
    EPOCH = "epoch"
    ADMIT = "admit"
    CLAIM = "claim"
    SETTLE = "settle"
    # compaction (CMP-5, CMP-6): the lock, then one transaction (a rotation, or in place)
    COMPRESSION_LOCK = "compression_lock"
    ROTATE = "rotate"
    COMPACT = "compact"
    COMPRESSION_UNLOCK = "compression_unlock"


class Effect(Generic[T]):
    """A request to the driver whose answer has type ``T``."""

    __slots__ = ()
    kind: ClassVar[str] = "effect"

    def __await__(self) -> Generator[Effect[T], Any, T]:
        result: T = yield self
        return result

    @property
    def site(self) -> Site | None:
        """The boundary this effect stands at, or None for clock, ids, provider and events."""
        return None


# ---- clock, ids, randomness: owned by the driver so runs replay ---------------------


@dataclass(frozen=True, slots=True)
class Now(Effect[float]):
    """Seconds since the epoch, from the driver's clock."""

    kind: ClassVar[str] = "now"


@dataclass(frozen=True, slots=True)
class Sleep(Effect[None]):
    """Wait; the simulator jumps its virtual clock instead."""

    seconds: float
    kind: ClassVar[str] = "sleep"


@dataclass(frozen=True, slots=True)
class Jitter(Effect[float]):
    """A fraction in [0, 1) from the driver's random source (seeded in the simulator)."""

    kind: ClassVar[str] = "jitter"


@dataclass(frozen=True, slots=True)
class MintId(Effect[str]):
    """A fresh id such as ``turn-7`` or ``call-3``; unique within one store."""

    prefix: str
    kind: ClassVar[str] = "mint_id"


# ---- the durable record ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadMessages(Effect[tuple[Message, ...]]):
    """Stored messages of a session with ``row_id > after_row_id``, in row order."""

    session_id: str
    after_row_id: int = 0
    kind: ClassVar[str] = "load_messages"


@dataclass(frozen=True, slots=True)
class OpenTurn(Effect[LeaseGrant]):
    """Ensure the session row from ``record`` and take its lease, in one transaction.

    The stored row wins over ``record`` (its prompt is the one replayed: CTX-3), and the
    row exists before the lease that refers to it (CTX-4). One commit instead of two: a
    turn's first write both creates its lane and claims it, so no other process ever sees
    a new session without its first holder. A turn of a session this engine has served
    asks with it too (its cached record is sent with ``create=False``: a row that is gone
    is refused with ``foreign_key``, as ``AcquireLease`` refuses it, never recreated), so
    that ``opening``, the user row, can ride the same commit when ``Opening.applies``; then
    the sites ``lease`` and ``user`` are one commit. Later polls of a busy lease use
    AcquireLease.
    """

    record: SessionRecord
    holder: str
    now: float
    ttl_s: float
    poll_s: float = 0.0  # > 0: join the session's queue of waiters when busy, asking again within
    opening: Opening | None = None  # the user row, stored with the grant when nothing comes between
    create: bool = True  # False: a served session's row must exist (missing: foreign_key)
    kind: ClassVar[str] = "open_turn"

    @property
    def site(self) -> Site:
        return Site.LEASE


@dataclass(frozen=True, slots=True)
class AcquireLease(Effect[Lease | None]):
    """Take the session's turn lease if it is free, expired or held by a dead process.

    None when a live holder has it. The store decides liveness (LEASE-3): the production
    store checks the holder's pid, the simulated one asks the world.
    """

    session_id: str
    holder: str
    now: float
    ttl_s: float
    poll_s: float = 0.0  # > 0: join (or stay in) the session's queue of waiters when busy
    kind: ClassVar[str] = "acquire_lease"

    @property
    def site(self) -> Site:
        return Site.LEASE


@dataclass(frozen=True, slots=True)
class LeaveLeaseQueue(Effect[None]):
    """A waiter gives up: take its place out of the session's queue at once (LEASE-5).

    Without this its place would still hold back the next asker until it lapsed.
    """

    session_id: str
    holder: str
    kind: ClassVar[str] = "leave_lease_queue"

    @property
    def site(self) -> Site:
        return Site.LEASE


@dataclass(frozen=True, slots=True)
class ReleaseLease(Effect[None]):
    lease: Lease
    kind: ClassVar[str] = "release_lease"

    @property
    def site(self) -> Site:
        return Site.RELEASE


@dataclass(frozen=True, slots=True)
class CloseTurn(Effect[Closed]):
    """Commit the turn's final rows and ending and release its lease, in one transaction.

    The finalizer's last write when the turn delivers an answer (``Closing``): the final
    row, the exit line and the completion, then the release, so a tool-round turn costs
    one commit fewer. Fenced by the lease token as every row is. A release that fails
    is reported in ``Closed.release_failure`` (the rows and the ending committed); rows
    that fail raise, and nothing of the effect committed. The sites ``final`` and
    ``release`` are this one commit.
    """

    lease: Lease
    closing: Closing
    kind: ClassVar[str] = "close_turn"

    @property
    def site(self) -> Site:
        return Site.FINAL


@dataclass(frozen=True, slots=True)
class AppendMessages(Effect[tuple[Message, ...]]):
    """Commit rows; returns them with their row ids. Fenced by the lease token."""

    lease_token: int
    session_id: str
    messages: tuple[Message, ...]
    label: Site
    kind: ClassVar[str] = "append_messages"

    @property
    def site(self) -> Site:
        return self.label


# ---- the outside world ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallProvider(Effect[ProviderReply]):
    """One model call. Raises a ``ProviderError`` subclass on failure.

    ``lease_token`` is the turn's fencing token (0: no lease to check). The store cannot
    fence a model call, so the driver asks it first whether a write with that token would
    be accepted; if not, the lease is gone (expired while the process was frozen, or taken)
    and the call raises ``TurnInterrupted`` instead of going out (LEASE-4). ``ExecuteTools``
    is vouched for the same way, with its own token.
    """

    request: ProviderRequest
    session_id: str = ""
    turn_id: str = ""
    lease_token: int = 0
    kind: ClassVar[str] = "call_provider"


@dataclass(frozen=True, slots=True)
class RefreshCredentials(Effect[None]):
    """LOOP-5: the provider refused the credentials (401/403): renew them through the port.

    The loop asks once per logical call (``auth_refreshes_max``) before it tries again;
    ``model`` names the route whose credentials are renewed, ``session_id`` and ``turn_id``
    the turn that asked (the simulator's note of the renewal is keyed by them).
    """

    model: str
    session_id: str = ""
    turn_id: str = ""
    kind: ClassVar[str] = "refresh_credentials"


@dataclass(frozen=True, slots=True)
class DrainRedirects(Effect[tuple[str, ...]]):
    """LOOP-4: the corrections the user sent to this session's running turn, oldest first.

    Drained at the top of every loop iteration; a correction is handed out once.
    """

    session_id: str
    turn_id: str
    kind: ClassVar[str] = "drain_redirects"


@dataclass(frozen=True, slots=True)
class ResolvePaths(Effect[tuple[str | None, ...]]):
    """Where the tools would act for each path argument, in the order asked.

    The answer for each path is the workspace-relative path the tools themselves would
    touch (absolute in-root paths made relative, symlinks followed, ``"."`` for the root),
    or None when the tools would refuse it (outside the workspace, a symlink loop). The
    segment planner compares these answers, not the strings the model wrote (TOOL-4):
    only the tool world knows that ``/root/a.txt`` and ``link.txt`` are ``a.txt``. It is
    answered by the same resolver the tools act through, so planning and acting agree.
    """

    paths: tuple[str, ...]
    kind: ClassVar[str] = "resolve_paths"


@dataclass(frozen=True, slots=True)
class ExecuteTools(Effect[tuple[ToolResult, ...]]):
    """Run one segment of calls within ``bounds`` (TOOL-5): one result per call, in any
    order (the simulator's come as they finished); the tool round restores call order.

    ``lease_token`` is vouched for as the batch begins, as a model call's is, and again
    as each later call begins (``tool_batch.vouch_again``, LEASE-4)."""

    lease_token: int
    session_id: str
    calls: tuple[ToolCall, ...]
    parallel: bool
    # the turn's Limits; the catalog's figures by default
    bounds: BatchBounds = field(default_factory=BatchBounds)
    kind: ClassVar[str] = "execute_tools"

    @property
    def site(self) -> Site:
        return Site.TOOLS


@dataclass(frozen=True, slots=True)
class Emit(Effect[None]):
    """Publish an event to the stream; the store logs it with the next commit.

    An event whose ``at`` is None is stamped by the driver with its clock, so emitting
    needs no separate ``Now`` effect.
    """

    event: Event
    kind: ClassVar[str] = "emit"


@dataclass(frozen=True, slots=True)
class FlushEvents(Effect[None]):
    """Commit the pending events now: a turn that writes no row still leaves its exit line."""

    kind: ClassVar[str] = "flush_events"

    @property
    def site(self) -> Site:
        return Site.EVENTS


# ---- admission (ADM) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadBinding(Effect[Binding | None]):
    """The durable binding of a principal to a session, or None (ADM-2)."""

    principal_id: str
    session_id: str
    kind: ClassVar[str] = "load_binding"


@dataclass(frozen=True, slots=True)
class BeginEpoch(Effect[EpochStart]):
    """Begin this process's runtime epoch (a new number, recorded with ``holder``) and
    recover in the same transaction: epochs of dead holders (and older ones of ``holder``)
    are retired and their started admissions made unknown (ADM-5: recovery never replays).
    ``holder`` None: this process, as its driver knows it (production: its pid)."""

    now: float
    holder: str | None = None
    kind: ClassVar[str] = "begin_epoch"

    @property
    def site(self) -> Site:
        return Site.EPOCH


@dataclass(frozen=True, slots=True)
class RecoverEpochs(Effect[EpochStart]):
    """Recover under the caller's live ``epoch`` without beginning another: retire the
    epochs of dead holders and make their started admissions unknown, in one transaction."""

    epoch: int
    now: float
    kind: ClassVar[str] = "recover_epochs"

    @property
    def site(self) -> Site:
        return Site.EPOCH


@dataclass(frozen=True, slots=True)
class AdmitInput(Effect[AdmitAnswer]):
    """The idempotency check and the insert of a ``queued`` row, in one transaction."""

    candidate: AdmissionRow
    kind: ClassVar[str] = "admit_input"

    @property
    def site(self) -> Site:
        return Site.ADMIT


@dataclass(frozen=True, slots=True)
class Acknowledge(Effect[None]):
    """Hand the door's answer to the submitter; the ack only ever after its commit."""

    answer: Ack | Refusal
    kind: ClassVar[str] = "acknowledge"


@dataclass(frozen=True, slots=True)
class ClaimAdmission(Effect[ClaimAnswer]):
    """Claim the session's next admission in FIFO order under ``epoch`` (ADM-4)."""

    session_id: str
    epoch: int
    now: float
    kind: ClassVar[str] = "claim_admission"

    @property
    def site(self) -> Site:
        return Site.CLAIM


@dataclass(frozen=True, slots=True)
class MoveAdmission(Effect[AdmissionRow]):
    """Settle, cancel or reconcile one admission, fenced by the runtime epoch."""

    admission_id: str
    session_id: str
    move: Move
    epoch: int
    now: float
    outcome: Outcome | None = None
    turn_id: str | None = None
    kind: ClassVar[str] = "move_admission"

    @property
    def site(self) -> Site:
        return Site.SETTLE


# ---- the lease (LEASE) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RefreshLease(Effect[Lease]):
    """Extend a held lease to ``now + ttl_s``; raises ``LeaseLost`` when it is no longer held.

    Holder-qualified: only the grant with this token and holder is extended, and only
    while it is unexpired, so a refresh can never revive a lease another holder may
    already have taken (LEASE-4).
    """

    lease: Lease
    now: float
    ttl_s: float
    kind: ClassVar[str] = "refresh_lease"

    @property
    def site(self) -> Site:
        return Site.REFRESH


@dataclass(frozen=True, slots=True)
class StartRefresher(Effect[int]):
    """Run ``lease.keep_lease(lease, interval_s, ttl_s, first_s)`` beside this turn; returns
    a handle.

    The driver runs it concurrently with the turn (an asyncio task, a simulator actor of
    the same process). When it reports the lease lost, the driver interrupts the turn.
    ``first_s``: when the first refresh is due (None: a whole interval from now).
    """

    lease: Lease
    interval_s: float
    ttl_s: float
    first_s: float | None = None
    kind: ClassVar[str] = "start_refresher"


@dataclass(frozen=True, slots=True)
class StopRefresher(Effect[bool]):
    """Stop the refresher and wait until it has ended (stop, then join: LEASE-6).

    Returns True when the refresher had lost the lease. After this returns, no refresh
    is in flight and none will start, so a later miss can never interrupt anything.
    """

    handle: int
    kind: ClassVar[str] = "stop_refresher"


@dataclass(frozen=True, slots=True)
class InterruptTurn(Effect[None]):
    """The refresher's one move on a loss: hard-interrupt the turn it keeps the lease for."""

    holder: str
    reason: str
    kind: ClassVar[str] = "interrupt_turn"


@dataclass(frozen=True, slots=True)
class ClearInterrupt(Effect[None]):
    """Clear the interrupt this turn's own refresher raised, if any (LEASE-6, step 3)."""

    kind: ClassVar[str] = "clear_interrupt"


# ---- session lanes (SES) ----
# The route of a key is a log of revisions; the store takes a revision only if it is the
# next one of its key (compare-and-set), so routing has one writer per key at a time.


@dataclass(frozen=True, slots=True)
class RandomBits(Effect[int]):
    """``bits`` random bits (seeded in the simulator, sub-stream ``stream``)."""

    bits: int
    stream: str = "incarnation"
    kind: ClassVar[str] = "random_bits"


@dataclass(frozen=True, slots=True)
class LoadRoute(Effect[Route | None]):
    """The newest revision of a key's route, or None for a key never routed."""

    key: str
    kind: ClassVar[str] = "load_route"


@dataclass(frozen=True, slots=True)
class LoadRoutes(Effect[tuple[Route, ...]]):
    """The newest revision of every key's route, in key order."""

    kind: ClassVar[str] = "load_routes"


@dataclass(frozen=True, slots=True)
class PutRoute(Effect[bool]):
    """Write ``route`` if it is its key's next revision; False when another writer won.

    With ``end_session_id`` the same transaction ends that session row with
    ``end_reason`` (first reason wins; a row that does not exist is left alone). With
    ``start`` (a revision that begins an incarnation) it creates that incarnation's session
    row too, unless it exists: no route names an incarnation that has no row, so a reset
    that replaces it, however soon, finds the row to end (SES-2).
    """

    route: Route
    end_session_id: str | None = None
    end_reason: str | None = None
    start: SessionRecord | None = None
    kind: ClassVar[str] = "put_route"


@dataclass(frozen=True, slots=True)
class LoadSession(Effect[SessionRecord | None]):
    """A session row, or None when it does not exist (yet)."""

    session_id: str
    kind: ClassVar[str] = "load_session"


@dataclass(frozen=True, slots=True)
class ReadMarkers(Effect[dict[str, float]]):
    """The lane markers: ``clean_exit`` and ``restarts:<key>`` counts."""

    kind: ClassVar[str] = "read_markers"


@dataclass(frozen=True, slots=True)
class WriteLane(Effect[None]):
    """Set (a value) or drop (None) markers and append lane-log entries, in one transaction."""

    markers: tuple[tuple[str, float | None], ...]
    log: tuple[LaneEntry, ...] = ()
    kind: ClassVar[str] = "write_lane"


@dataclass(frozen=True, slots=True)
class LiveBackground(Effect[frozenset[str]]):
    """The keys that have a live background process (SES-6)."""

    kind: ClassVar[str] = "live_background"


# ---- compaction (CMP-5, CMP-6) ----
# The lock says who may compact a session; the write itself is fenced by the lease token,
# like every other write. ``hermes_ref.rotation`` performs them in order.


@dataclass(frozen=True, slots=True)
class TakeCompressionLock(Effect[bool]):
    """Take the session's compression lock for ``holder`` until ``now + ttl_s``.

    True when it was free, expired, held by a dead process, or already ours (then it is
    extended); False while another live holder has it. Every ask is kept, refusals too.
    """

    session_id: str
    holder: str
    now: float
    ttl_s: float
    kind: ClassVar[str] = "take_compression_lock"

    @property
    def site(self) -> Site:
        return Site.COMPRESSION_LOCK


@dataclass(frozen=True, slots=True)
class ReleaseCompressionLock(Effect[None]):
    """Give the lock back; only ``holder``'s own grant is released (anyone else's stays)."""

    session_id: str
    holder: str
    now: float
    kind: ClassVar[str] = "release_compression_lock"

    @property
    def site(self) -> Site:
        return Site.COMPRESSION_UNLOCK


@dataclass(frozen=True, slots=True)
class CompactSession(Effect[Compacted]):
    """Replace the session's live messages with ``messages``, in one fenced transaction.

    ``rotate``: ``flush`` rows go to the old session, which is ended ``compression``; the
    ``child`` row (``parent_session_id`` = the old id) is created, the lease carried to it
    and the messages written there. In place (``rotate`` False, no child): the old rows
    are archived (kept, no longer live) and the messages inserted under the same id.
    Returns the session the messages now live in, its rows and the lease fencing them.
    """

    lease_token: int
    session_id: str
    messages: tuple[Message, ...]
    rotate: bool
    child: SessionRecord | None
    at: float
    flush: tuple[Message, ...] = ()
    kind: ClassVar[str] = "compact_session"

    def __post_init__(self) -> None:
        if self.rotate != (self.child is not None):
            raise BadInput("CompactSession: a rotation names its child, a compaction in "
                           "place names none")

    @property
    def site(self) -> Site:
        return Site.ROTATE if self.rotate else Site.COMPACT


@dataclass(frozen=True, slots=True)
class LoadTip(Effect[SessionRecord | None]):
    """The live tip of ``session_id``'s lineage: ``parent_session_id`` followed forward
    through every session ended ``compression`` (the session itself when it was not).
    None for an unknown session."""

    session_id: str
    kind: ClassVar[str] = "load_tip"
