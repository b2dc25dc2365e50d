"""The turn prologue: everything that happens before the first model call.

Theory of operation
-------------------
In order, because the order is the contract:

1. Read the clock and mint the turn id (from the driver, so runs replay); copy the
   caller's history, if it gave one, before the turn waits for anything (CTX-2).
2. System prompt, then session row (CTX-4): the prompt is built once per session and
   replayed byte for byte from the session row afterwards (CTX-3); a session row is never
   written without it, and nothing is written for a session before its row exists. Only
   compression replaces it, through ``SessionCache.replace_system_prompt``.
3. Take the session's turn lease (LEASE-1) in the name of this process and turn
   (LEASE-2), waiting in bounded polls; a turn that cannot get it, or whose store fails
   before it begins, returns early with the user's input handed back (LEASE-5): refusal
   is not loss. Once held, the lease's refresher starts beside the turn (``lease``).
4. Sync the history: the cached transcript is reused only when the fencing token proves
   nobody else held the lease since (see ``context``); otherwise it is reloaded. A
   session with no transcript yet takes the caller's copy instead, if there is one.
5. Reset per-turn state and rebuild the budget; keep the session's nudge counters,
   hydrating them from any history just taken in, and count this user turn (CTX-1).
   The turn works on its own copy of the history (CTX-2).
6. Write the caller's history if it seeds the session. Repair a crashed predecessor:
   calls without results get an ``unknown`` result and are never re-run (TOOL-10); an
   open user/tool tail gets an engine boundary row (FIN-5).
7. Persist the user row, once, with its final ``api_content`` sidecar, before the first
   model call (CTX-8, WIRE-1). When nothing has to be written before it (a new session,
   or a served one whose cached history is the durable one and ends closed), the row is
   offered with the lease request of step 3 and rides the grant's commit (``Opening``):
   no external effect separates the two, so one commit makes both durable. A turn whose
   history ends open, mid-turn of another turn (crashed, or fenced off after losing its
   lease), first warns naming both (CTX-9).
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hermes_ref import closure, redirect, rotation
from hermes_ref import lease as lease_rules
from hermes_ref.compression import CompressionState
from hermes_ref.context import (
    IterationBudget,
    NudgeCounters,
    SessionCache,
    TurnContext,
    TurnState,
    check_stored,
)
from hermes_ref.effects import (
    AcquireLease,
    Emit,
    FlushEvents,
    LeaveLeaseQueue,
    LoadMessages,
    LoadSession,
    MintId,
    Now,
    OpenTurn,
    ReleaseLease,
    Site,
    Sleep,
    StartRefresher,
)
from hermes_ref.errors import BadInput, InvariantBroken, PersistenceError
from hermes_ref.limits import Limits
from hermes_ref.models import Event, Lease, Message, Opening, Role, SessionRecord, ToolSpec
from hermes_ref.outcomes import (
    Completion,
    Ending,
    ExitLine,
    ExitReason,
    TurnOverlap,
    TurnResult,
    TurnStarted,
)
from hermes_ref.phases import Phase, PhaseTracker
from hermes_ref.transcript import Transcript


@dataclass(frozen=True, slots=True)
class TurnInput:
    """One admitted input for one session incarnation.

    ``history`` is the caller's own list of the conversation so far (user, assistant and
    tool messages), or None. It is held here as given: the prologue copies it once, as
    the turn begins, and never touches the caller's list (CTX-2). The copy seeds a
    session that has no durable transcript yet: it is written first, and the turn works
    from it. A session that already has a transcript keeps it, and the caller's list is
    not used: the record is the one history, as the stored prompt is the one prompt.
    """

    session_id: str
    text: str
    session_key: str = "agent:main:cli:dm"
    platform: str = "cli"
    injected_context: str | None = None  # per-turn context that goes only to the API copy
    history: Sequence[Message] | None = None

    def __post_init__(self) -> None:
        for index, message in enumerate(self.history or ()):
            if message.role is Role.SYSTEM or message.scaffold is not None:
                what = "a system message" if message.role is Role.SYSTEM else "scaffolding"
                raise BadInput(f"history message {index} of session {self.session_id!r} is "
                               f"{what}: the session's prompt is its own and scaffolding is "
                               "never stored")


def adopt_history(history: Sequence[Message] | None) -> Transcript | None:
    """CTX-2: the turn's own copy of the caller's history, or None when it gave none.

    One copy, taken as the turn begins, before it waits for its lease; the turn never
    reads the caller's list again. So what the caller later does to its list cannot reach
    the turn, and what the turn appends cannot reach the caller. Row and turn ids are
    bookkeeping of wherever the messages came from, so the copy drops them; this store
    numbers the rows when it writes them.
    """
    if history is None:
        return None
    return Transcript(m if m.row_id is None and m.turn_id is None
                      else m.model_copy(update={"row_id": None, "turn_id": None})
                      for m in history)


def build_system_prompt(session_key: str, platform: str, tools: tuple[ToolSpec, ...],
                        started_at: float) -> str:
    """CTX-3: three layers, the most widely shared first, so a cached prefix is as long as it
    can be: *stable* (who the assistant is and which tools it has: the same for every
    session of this engine), *context* (this session: its key and platform), *volatile*
    (when the conversation started, from the driver's clock: different in every build).

    The volatile layer is why the prompt is built once per session and then replayed from
    the session row: built again a minute later it is other bytes, and a provider's prompt
    cache, which matches from the first byte, would miss the whole conversation.
    """
    tools_line = "Tools available: " + (", ".join(t.name for t in tools) or "none") + "."
    stable = "You are a careful assistant. Use tools when they help; answer in plain text. " \
        + tools_line
    context = f"Session: {session_key} on {platform}."
    started = datetime.fromtimestamp(started_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    volatile = f"Conversation started: {started}."
    return "\n\n".join((stable, context, volatile))


def compose_api_content(text: str, injected: str | None) -> str | None:
    """WIRE-1: the exact user bytes sent when per-turn context is injected, else None."""
    if not injected:
        return None
    return f"{text}\n\n<context>\n{injected}\n</context>"


def session_record(inp: TurnInput, tools: tuple[ToolSpec, ...], now: float) -> SessionRecord:
    """The row a new session gets. The prompt is built first, so a row never lacks it
    (CTX-4); if the row already exists, its stored prompt is the one replayed (CTX-3)."""
    return new_session_row(inp.session_id, inp.session_key, inp.platform, tools, now)


def new_session_row(session_id: str, key: str, platform: str, tools: tuple[ToolSpec, ...],
                    now: float, chat_type: str = "dm") -> SessionRecord:
    """A session's row with its system prompt, built before the row (CTX-4): the one
    maker of new rows, for a turn's first ask and for a route that begins an incarnation."""
    prompt = build_system_prompt(key, platform, tools, now)
    return SessionRecord(id=session_id, key=key, platform=platform, chat_type=chat_type,
                         system_prompt=prompt, started_at=now)


@dataclass(slots=True)
class Taken:
    """What asking for the lease came to: the session's cache, whether this turn created
    the session, the lease (None: the wait ended without it), and the opening rows the
    grant stored (``Opening``) or why it could not store them."""

    cache: SessionCache
    created: bool
    lease: Lease | None
    opened: tuple[Message, ...] = ()
    opening_failure: tuple[str, str] | None = None
    # the row of the session asked for, when this engine held no cache of it and the cache
    # above was built here: its compression memory is the lineage's (``_lineage_memory``)
    unserved: SessionRecord | None = None


def _cached_record(cache: SessionCache, inp: TurnInput, now: float) -> SessionRecord:
    """A served session's row as this engine knows it, sent with ``create=False``: the row
    must exist, and nothing is inserted."""
    return SessionRecord(id=cache.session_id, key=inp.session_key, platform=inp.platform,
                         system_prompt=cache.system_prompt, started_at=now)


def _opening(inp: TurnInput, deps: PrologueDeps, cache: SessionCache | None, user: Message,
             now: float) -> Opening | None:
    """The user row to offer with the lease request, or None when something may have to be
    written before it; with it the ``turn.started`` event the turn will emit if it applies.

    A caller's history seeds a new session first; a cached history that ends open is
    repaired first (TOOL-10, FIN-5); a cache with no token of its own cannot tell whether
    someone else wrote since. For a session this engine has not seen, the store keeps the
    row only if the request creates the session (it then has no rows at all, token 1).
    When the opening applies, the history is not reloaded, so the counters it names are the
    cached ones counted once more (CTX-1); ``_check_opening`` holds the turn to them.
    """
    if inp.history is not None:
        return None
    if cache is None:
        session_id, token, nudges = inp.session_id, 1, NudgeCounters()
    elif not cache.last_lease_token or unfinished_turn(cache.history) is not None:
        return None
    else:
        session_id, token, nudges = cache.session_id, cache.last_lease_token + 1, copy(cache.nudges)
    offered = any(t.keeps_memory for t in deps.tools)
    review = nudges.count_user_turn(deps.limits.memory_nudge_interval, offered)
    started = TurnStarted(lease_token=token, user_turn=nudges.user_turns, memory_review=review)
    event = started.event(session_id, user.turn_id or "").model_copy(update={"at": now})
    return Opening(rows=(user,), expected_token=0 if cache is None else token, events=(event,))


def _check_opening(opening: Opening | None, event: Event) -> None:
    """The ``turn.started`` the grant committed must be the one the turn emits now."""
    committed = opening.events[0] if opening is not None and opening.events else None
    if committed is None or committed.model_copy(update={"turn_seq": None}) != event:
        raise InvariantBroken(f"the opening committed {committed!r}, the turn started as {event!r}")


async def _take_lease(
    inp: TurnInput, deps: PrologueDeps, cache: SessionCache | None, holder: str, now: float,
    opening: Opening | None = None,
) -> Taken:
    """Ask for the session's lease, offering ``opening`` with the first ask.

    A session this engine has not seen is opened with ``OpenTurn`` (row and lease in one
    transaction), and so is one it has served when there is an opening to offer (then the
    user row can share that commit); a busy lease is polled with ``AcquireLease`` until the
    bounded wait ends. Only the first ask can carry the opening: after a wait, someone else
    held the lease, and the history must be synced first. After a wait the turn goes on with
    the cache this engine holds for the session by then: a turn of this engine that served
    it meanwhile left its history and its compression memory there (CMP-4: a cooldown it
    started holds for the turn that waited behind it), which a cache built before the wait
    would not have. A session it has no cache of, a rotated child (CMP-5), is marked
    (``Taken.unserved``): once the lease is held, the prologue gives it the compression
    memory this engine keeps for its lineage (``_lineage_memory``); by then every turn of
    this engine that held the lease before it has left what it did there.
    """
    limits = deps.limits
    deadline = now + limits.lease_wait_s_max
    taken: Taken
    unserved: SessionRecord | None = None  # the row of a session this engine has no cache of
    if cache is None or opening is not None:
        record = session_record(inp, deps.tools, now) if cache is None else \
            _cached_record(cache, inp, now)
        grant = await OpenTurn(record, holder, now, limits.lease_ttl_s, limits.lease_poll_s,
                               opening, create=cache is None)
        if cache is None:
            unserved, prompt = grant.session, grant.session.system_prompt
            cache = SessionCache(grant.session.id, prompt, Message(role=Role.SYSTEM, content=prompt))
        taken = Taken(cache, grant.created, grant.lease, grant.opened, grant.opening_failure)
    else:
        taken = Taken(cache, False, await AcquireLease(inp.session_id, holder, now,
                                                       limits.lease_ttl_s, limits.lease_poll_s))
    waited = taken.lease is None
    while taken.lease is None and now < deadline:
        await Sleep(limits.lease_poll_s)
        now = await Now()
        taken.lease = await AcquireLease(inp.session_id, holder, now, limits.lease_ttl_s,
                                         limits.lease_poll_s)
    if waited and taken.lease is not None:
        taken.cache = deps.caches.get(inp.session_id, taken.cache)
    if unserved is not None and taken.lease is not None and taken.cache is cache:
        taken.unserved = unserved
    return taken


async def _lineage_memory(deps: PrologueDeps, session_id: str,
                          known: Sequence[SessionRecord] = ()) -> CompressionState:
    """CMP-4 across rotations (CMP-5): the compression memory (the cooldown, the ineffective
    passes in a row) this engine keeps for the conversation ``session_id`` belongs to, for
    a session it holds no cache of; else a fresh one. ``known`` are rows the prologue has
    read already (the session asked for, the tip): their parent links spare a read, but
    a parent's end is read under the lease, since the session asked for may have rotated
    while the turn waited.

    A rotation's child goes on with its parent's conversation, so a cooldown or a block
    that held in the parent holds in the child (Hermes keeps the compressor on the agent
    the gateway caches for the conversation, whichever session of the lineage it serves).
    The memory is found at the nearest session of the lineage this engine remembers: a
    child a turn of it rotated into (``deps.carried``) or a session it served
    (``deps.caches``), going up ``parent_session_id`` while the parent ended
    ``compression`` (the lineage as LEASE-3 bounds it), past the children other processes
    rotated to. The walk starts at the session the lease names, the lineage's tip, so a
    session the engine served below the one asked for is found too. Only the memory
    moves; the rest of the cache is built as for any session the engine has not served.
    An engine that remembers nothing (a restarted process) has nothing to look up.
    """
    rows = {r.id: r for r in known}
    current, seen = session_id, set[str]()
    while current not in seen:  # a cycle in the rows is no lineage
        seen.add(current)
        carried = deps.carried.get(current)
        if carried is not None:
            return carried
        cache = deps.caches.get(current)
        if cache is not None:
            return cache.compression
        if not (deps.caches or deps.carried):
            break
        row = rows.get(current) or await LoadSession(current)  # a parent link never changes
        if row is None or row.parent_session_id is None:
            break
        # the parent read now, under the lease: a row read before the turn waited (the
        # session it asked for) may have ended by compression since
        parent = await LoadSession(row.parent_session_id)
        if parent is None or parent.end_reason != rotation.COMPRESSION:
            break
        current, rows[parent.id] = parent.id, parent
    return CompressionState()


async def _sync_history(cache: SessionCache, lease: Lease, created: bool) -> bool:
    """Reuse the cache only if no other holder came between (fencing token +1).

    A session this turn created and whose lease is the first ever granted (token 1) has
    no rows yet: nobody else can have written between its creation and this grant.
    True when the history was loaded from the store.
    """
    if cache.last_lease_token and lease.token == cache.last_lease_token + 1:
        return False
    if created and lease.token == 1:
        return False
    rows = await LoadMessages(cache.session_id, 0)
    cache.history = Transcript(rows)
    return True


def _hydrate_nudges(cache: SessionCache, history: Transcript, limits: Limits) -> None:
    """CTX-1: derive the nudge counters from a history this engine has just taken in.

    That is a load from the store (a restart, or another holder since this engine's last
    turn, whose turns the cached counts missed, as they missed its rows) or a caller's
    seed. Hermes hydrates on a resumed agent's first turn; the count is the same.
    """
    users = redirect.user_turns(history)  # a correction (LOOP-4) is no user turn of its own
    cache.nudges.hydrate(users, limits.memory_nudge_interval)


def _count_user_turn(cache: SessionCache, deps: PrologueDeps) -> bool:
    """CTX-1: count this turn on the session's counters; True when a memory review is due."""
    offered = any(t.keeps_memory for t in deps.tools)  # the review needs a memory tool
    return cache.nudges.count_user_turn(deps.limits.memory_nudge_interval, offered)


def unfinished_turn(history: Transcript) -> str | None:
    """The turn whose rows end the history open (no final persist yet), or None.

    A turn's final persist is an assistant row that calls no tool (its answer, or the
    boundary row of a failure). A history that ends on anything else was left mid-turn.
    """
    tail = history.durable_tail()
    if tail is None or (tail.role is Role.ASSISTANT and not tail.tool_calls):
        return None
    return tail.turn_id


async def _warn_if_late(ctx: TurnContext) -> None:
    """CTX-9: say so when this turn starts before its predecessor's final persist."""
    previous = unfinished_turn(ctx.transcript)
    if previous is not None and previous != ctx.turn_id:
        await Emit(TurnOverlap(previous_turn_id=previous).event(ctx.session_id, ctx.turn_id))


async def _repair_tail(ctx: TurnContext) -> bool:
    """Close what a crashed turn left open; never re-run a recorded call (TOOL-10)."""
    rows = closure.closing_rows(ctx.transcript, ctx.turn_id,
                                result_text=lambda call_id: closure.RECOVERED_CALL_TEXT,
                                boundary_text=closure.RECOVERED_BOUNDARY_TEXT)
    return await ctx.persist(tuple(rows), Site.RECOVERY) if rows else True


async def _persist_user(ctx: TurnContext, user: Message) -> bool:
    """CTX-8: the user row, once, with its final sidecar, before the first model call."""
    return await ctx.persist((user,), Site.USER)


async def _write_opening(ctx: TurnContext, user: Message, seeded: bool, taken: Taken) -> bool:
    """The turn's first rows, in order; False when one of the writes failed.

    When the grant stored the user row (``Opening``) there is nothing left to write: the
    row was offered only when nothing had to come before it. A seeded session's history
    goes first, as the caller's input (site ``user``), so that everything after it, the
    repair of an open tail included, sees it durable.
    """
    if taken.opened:
        check_stored((user,), taken.opened)
        ctx.transcript.absorb(taken.opened)
        return True
    if taken.opening_failure is not None:  # the grant stands; the user row is not durable
        cause, message = taken.opening_failure
        ctx.write_failed(Site.USER, PersistenceError(message, cause=cause))
        return False
    if seeded and not await ctx.persist(ctx.transcript.messages(), Site.USER):
        return False
    return await _repair_tail(ctx) and await _persist_user(ctx, user)


def refused_result(inp: TurnInput, turn_id: str, user: Message,
                   failure: PersistenceError | None) -> TurnResult:
    """A turn that could not begin hands its input back (LEASE-5, ADM-6): refusal is not loss."""
    if failure is not None:
        reason, detail = ExitReason.PERSISTENCE_FAILED, f"{failure.cause}: {failure}"
        failure_reason = f"session_persistence_failed:{failure.cause}"
    else:
        reason, detail = ExitReason.LEASE_TIMEOUT, f"session_turn_lease_timeout:{inp.session_id}"
        failure_reason = "session_busy"
    return TurnResult(
        session_id=inp.session_id, turn_id=turn_id, final_response=None, exit_reason=reason,
        exit_detail=detail, failed=True, retryable=True, failure_reason=failure_reason,
        carried_input=user,
    )


async def _refuse(inp: TurnInput, deps: PrologueDeps, turn_id: str, user: Message,
                  lease: Lease | None, failure: PersistenceError | None) -> TurnResult:
    """End a turn that never began: give back a lease it got (or its place in line), log its
    exit, return the input."""
    holder = lease_rules.holder_identity(deps.holder, turn_id, inp.platform)
    result = refused_result(inp, turn_id, user, failure)
    cleanup: list[str] = []
    if lease is not None:
        try:
            await ReleaseLease(lease)
        except PersistenceError as error:  # the lease expires on its own
            cleanup.append(f"release: {error.cause}")
    elif failure is None:  # it waited in line and gave up: make way for the next waiter
        try:
            await LeaveLeaseQueue(inp.session_id, holder)
        except PersistenceError as error:  # its place lapses on its own after two polls
            cleanup.append(f"queue: {error.cause}")
    ending = Ending(result.exit_reason, result.exit_detail, None, failed=True)
    line = ExitLine.build(ending, api_calls=0, max_iterations=deps.limits.max_iterations,
                          budget_used=0, budget_max=deps.limits.iteration_budget, tail=None,
                          cleanup_errors=len(cleanup))
    await Emit(line.event(inp.session_id, turn_id))
    carried = result.carried_input.content if result.carried_input is not None else None
    await Emit(Completion(final_response=None, failed=True, carried_input=carried)
               .event(inp.session_id, turn_id))
    try:
        await FlushEvents()
    except PersistenceError as error:
        cleanup.append(f"events: {error.cause}")
    deps.tracker.enter(Phase.DONE)
    return result.model_copy(update={"cleanup_errors": tuple(cleanup)}) if cleanup else result


@dataclass(slots=True)
class PrologueDeps:
    limits: Limits
    tools: tuple[ToolSpec, ...]
    holder: str
    caches: dict[str, SessionCache]
    tracker: PhaseTracker
    # CMP-4: compression memory carried into a rotated child this engine has no cache of
    carried: dict[str, CompressionState] = field(default_factory=dict)


async def build_turn_context(inp: TurnInput, deps: PrologueDeps) -> TurnContext | TurnResult:
    """Run the prologue; a ``TurnResult`` means the turn ended before it began."""
    deps.tracker.enter(Phase.PROLOGUE)
    now = await Now()
    turn_id = await MintId("turn")
    seed = adopt_history(inp.history)  # copied now: nothing later reads the caller's list
    user = Message(role=Role.USER, content=inp.text, turn_id=turn_id, created_at=now,
                   api_content=compose_api_content(inp.text, inp.injected_context))
    cache = deps.caches.get(inp.session_id)
    lease, failure, loaded = None, None, False
    taken: Taken | None = None
    opening: Opening | None = None
    try:
        holder = lease_rules.holder_identity(deps.holder, turn_id, inp.platform)
        opening = _opening(inp, deps, cache, user, now)
        taken = await _take_lease(inp, deps, cache, holder, now, opening)
        cache, created, lease = taken.cache, taken.created, taken.lease
        known = [] if taken.unserved is None else [taken.unserved]  # rows read already
        if lease is not None and lease.session_id != cache.session_id:  # CMP-5: rotated away
            tip = await LoadSession(lease.session_id)
            cache = rotation.tip_cache(cache, lease.session_id, tip)
            known += [tip] if tip is not None else []
        if lease is not None and taken.unserved is not None:  # CMP-4: the lineage's memory
            cache.compression = await _lineage_memory(deps, lease.session_id, known)
        if lease is not None:
            loaded = await _sync_history(cache, lease, created)
    except PersistenceError as error:
        failure = error
    if cache is None or lease is None or failure is not None or taken is None:
        return await _refuse(inp, deps, turn_id, user, lease, failure)
    deps.caches[inp.session_id] = deps.caches[cache.session_id] = cache  # CMP-5: the tip's
    deps.carried.pop(cache.session_id, None)  # the cache holds it from now on
    refresher = await StartRefresher(lease, deps.limits.lease_refresh_s, deps.limits.lease_ttl_s)
    seed = seed if seed and not cache.history else None  # only a session with no transcript
    transcript = seed if seed is not None else cache.history.copy()
    if loaded or seed is not None:
        _hydrate_nudges(cache, transcript, deps.limits)
    review = _count_user_turn(cache, deps)
    ctx = TurnContext(
        session_id=cache.session_id, turn_id=turn_id, limits=deps.limits,
        tools=deps.tools, cache=cache, lease=lease, tracker=deps.tracker,
        state=TurnState(budget=IterationBudget(deps.limits.iteration_budget)),
        transcript=transcript, refresher=refresher,
    )
    started = TurnStarted(lease_token=lease.token, user_turn=cache.nudges.user_turns,
                          memory_review=review)
    event = started.event(cache.session_id, turn_id).model_copy(update={"at": now})
    if taken.opened:
        _check_opening(opening, event)  # committed with the grant and the user row
    else:
        await Emit(event)
    await _warn_if_late(ctx)
    if not await _write_opening(ctx, user, seeded=seed is not None, taken=taken):
        ctx.carried_input = user  # the message never became durable: hand it back (LEASE-5)
    return ctx
