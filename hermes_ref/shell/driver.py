"""The production driver: runs engine coroutines on asyncio against real ports.

Theory of operation
-------------------
``AsyncDriver.run(coro)`` steps the engine coroutine by hand, exactly like the
simulator's ``SimDriver.run``: ``coro.send(value)`` returns the next effect, the driver
performs it and sends the result back, or throws the port's ``OperatingError`` into the
coroutine. Any other exception (a harness error, a bug, a cancellation) closes the
coroutine and propagates: that is a crash, and nothing the engine would have done
afterwards reaches the store.

Effects are dispatched by exact type through two dicts built once per driver:

* *immediate* handlers (clock, ids, randomness, log lines) are plain functions;
* *awaited* handlers return an awaitable. For the store effects the handler returns the
  store method's coroutine itself, so a durable effect costs one store call and no
  wrapper coroutine.

``ResolvePaths`` is answered on the loop by the tool runner's ``resolve_paths`` (for
``WorkspaceTools`` the resolver its tools act through).

Tools (``ExecuteTools``) get the store's committed watermark once per segment (the
simulator does the same) and the clock at each call's start. With ``tools_in_thread``
a segment runs in a thread pool of its own under the batch rules (TOOL-5: at most
``workers_max`` at once, the start-order gate, the deadline; ``hermes_ref.shell.tool_pool``):
a call still running at the deadline gets a timed-out result with disposition
``unknown`` (its thread cannot be stopped and finishes on its own), a call that never
started gets one with disposition ``none``. The bounds are the turn's (on the effect),
tightened by the driver's own ``tool_workers_max`` and ``tool_batch_deadline_s``.
Without threads the calls run one after another on the loop; the deadline is checked
between calls, since a running call cannot be interrupted.

``Emit`` stamps the event (its clock time, its ``turn_seq``: ``hermes_ref.delivery``) and
logs it with the store (it commits with the next write); a ``turn.exit`` event also becomes
the one turn-exit log line (FIN-7). Events reach ``on_event`` and the live subscribers
(``subscribe``) only once a write has committed them (DEL-2): the store calls back after
each commit. A reconnecting client replays with ``events_after``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from hermes_ref import delivery  # DEL-2
from hermes_ref import effects as fx
from hermes_ref import lease as lease_rules
from hermes_ref.admission import Ack, Refusal
from hermes_ref.errors import OperatingError, TurnInterrupted
from hermes_ref.models import Closed, Event, EventKind, LeaseGrant, ToolResult
from hermes_ref.outcomes import ExitLine
from hermes_ref.ports import AsyncProvider, AsyncStore, ToolRunner
from hermes_ref.shell import liveness, tool_pool, turn_tasks  # TOOL-5: tool_pool

__all__ = ["AsyncDriver", "AsyncProvider"]

T = TypeVar("T")
_random = random.SystemRandom()  # production jitter needs no seed; the simulator's has one
Immediate = Callable[[Any], Any]
Awaited = Callable[[Any], Awaitable[Any]]

_EXIT_LINE = "turn exit reason=%s api_calls=%s budget=%s/%s last_role=%s response_len=%s"


@runtime_checkable
class PathResolver(Protocol):
    """A tool runner that can say where its path arguments land (``ResolvePaths``)."""

    def resolve_paths(self, paths: tuple[str, ...]) -> tuple[str | None, ...]: ...


class AsyncDriver:
    """Performs a turn's effects through real ports; see the module docstring."""

    def __init__(
        self,
        *,
        store: AsyncStore,
        provider: AsyncProvider,
        providers: Mapping[str, AsyncProvider] | None = None,  # LOOP-6: model -> its provider
        tools: ToolRunner,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tools_in_thread: bool = True,
        tool_workers_max: int = 8,
        tool_batch_deadline_s: float = 420.0,
        on_event: Callable[[Event], None] | None = None,
        on_ack: Callable[[Ack | Refusal], None] | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        if tool_workers_max < 1:
            raise ValueError(f"tool_workers_max must be at least 1, got {tool_workers_max}")
        self.store = store
        self.provider = provider
        self.providers = dict(providers or {})
        self._running: dict[str, turn_tasks.RunState] = {}  # run key -> its state (interrupts)
        self.tools = tools
        self.clock = clock
        self.tools_in_thread = tools_in_thread
        self.tool_workers_max = tool_workers_max
        self.tool_batch_deadline_s = tool_batch_deadline_s
        self.on_event = on_event
        self.on_ack = on_ack  # ADM: hands the door's answers to whoever submitted
        self.log = log or logging.getLogger(__name__)
        self._sleep = sleep
        # DEL-2: the live feed of committed events and each turn's event numbers
        self.hub = delivery.Hub()
        self._turn_seqs = delivery.TurnSeqs()
        listen = getattr(store, "add_commit_listener", None)
        if listen is not None:
            listen(self._committed)
        self._corrections: dict[str, list[str]] = {}  # LOOP-4: session -> undrained corrections
        self._immediate = self._immediate_handlers()
        self._awaited = self._awaited_handlers()

    def _immediate_handlers(self) -> dict[type[Any], Immediate]:
        """Effects answered without awaiting anything."""
        clock = self.clock
        return {
            fx.Now: lambda e: clock(),
            fx.Jitter: lambda e: _random.random(),
            fx.MintId: _mint_id,
            fx.ResolvePaths: self._resolve_paths,
            fx.Acknowledge: self._acknowledge,  # ADM
            fx.RandomBits: lambda e: secrets.randbits(e.bits),  # SES: no seed in production
        }

    def _awaited_handlers(self) -> dict[type[Any], Awaited]:
        """Effects answered by an awaitable; store effects map one to one onto the port."""
        store = self.store
        return {
            fx.Sleep: self._sleep_effect,
            fx.LoadMessages: lambda e: store.load_messages(e.session_id, e.after_row_id),
            fx.OpenTurn: self._open_turn,
            fx.AcquireLease: lambda e: store.acquire_lease(e.session_id, e.holder, e.now, e.ttl_s,
                                                           e.poll_s),
            fx.ReleaseLease: lambda e: store.release_lease(e.lease),
            fx.CloseTurn: self._close_turn,
            fx.AppendMessages: lambda e: store.append_messages(
                e.session_id, e.lease_token, e.messages),
            fx.CallProvider: self._call_provider,
            fx.RefreshCredentials: self._refresh_credentials,  # LOOP-5
            fx.DrainRedirects: self._drain_redirects,  # LOOP-4
            fx.ExecuteTools: self._execute_tools,
            fx.Emit: self._emit,
            fx.FlushEvents: lambda e: store.flush_events(),
            **self._lease_handlers(),  # LEASE
            **self._admission_handlers(),
            **self._lane_handlers(),  # SES
            **self._compaction_handlers(),  # CMP-5, CMP-6
        }

    def _lease_handlers(self) -> dict[type[Any], Awaited]:
        """LEASE: refresh through the store; the refresher runs beside the turn (a timer
        through its first sleep, then a task: ``turn_tasks.Refresher``)."""
        store = self.store
        return {
            fx.RefreshLease: lambda e: store.refresh_lease(e.lease, e.now, e.ttl_s),
            fx.LeaveLeaseQueue: lambda e: store.leave_lease_queue(e.session_id, e.holder),
            fx.StartRefresher: self._start_refresher,
            fx.StopRefresher: lambda e: turn_tasks.CURRENT.get().stop(e.handle),
            fx.InterruptTurn: self._interrupt_turn,
            fx.ClearInterrupt: self._clear_interrupt,
        }

    async def _open_turn(self, effect: fx.OpenTurn) -> LeaseGrant:
        """The grant, and with it the opening's rows and events when it applies (``Opening``).

        The opening's events are numbered now, as an ``Emit`` would number them (DEL-1); if
        they were not committed, they never existed and the turn numbers its own from 1.
        """
        opening = self._turn_seqs.number_opening(effect.opening, self.clock())
        committed = False
        try:
            grant = await self.store.open_turn(effect.record, effect.holder, effect.now,
                                               effect.ttl_s, effect.poll_s, opening, effect.create)
            committed = bool(grant.opened)
        finally:
            self._turn_seqs.settle_opening(opening, committed)  # bookkeeping, not an effect
        return grant

    async def _close_turn(self, effect: fx.CloseTurn) -> Closed:
        """The final rows, the ending and the release in one commit (``Closing``).

        The closing's events are numbered now, as an ``Emit`` would number them (DEL-1); if
        the rows were not committed, those events never existed and the turn numbers the
        ending it then emits from where it stood. The exit line is logged once committed.
        """
        closing = self._turn_seqs.number_closing(effect.closing, self.clock())
        committed = False
        try:
            closed = await self.store.close_turn(effect.lease, closing)
            committed = True
        finally:
            self._turn_seqs.settle_closing(closing, committed)  # bookkeeping, not an effect
        for event in closing.events:
            if event.kind is EventKind.TURN_EXIT:
                self._exit_line(ExitLine.of(event))
        return closed

    def _sleep_effect(self, effect: fx.Sleep) -> Awaitable[None]:
        """A turn sleeps through the injected ``sleep`` (interruptibly); a refresher keeps
        real time whatever was injected, since its whole job is to beat the wall clock."""
        state = turn_tasks.CURRENT.get()
        if state.parent is not None:
            return asyncio.sleep(effect.seconds)
        return turn_tasks.interruptible(state, self._sleep(effect.seconds))

    async def _start_refresher(self, effect: fx.StartRefresher) -> int:
        parent = turn_tasks.CURRENT.get()
        child = turn_tasks.RunState(parent=parent, handle=turn_tasks.next_handle())
        keeper = lease_rules.keep_lease(effect.lease, effect.interval_s, effect.ttl_s,
                                        effect.first_s)
        parent.refreshers[child.handle] = turn_tasks.Refresher(
            keeper, lambda coro: self._run(coro, child))
        return child.handle

    async def _interrupt_turn(self, effect: fx.InterruptTurn) -> None:
        """The refresher lost the lease: the turn it serves stops now (LEASE-4)."""
        state = turn_tasks.CURRENT.get()
        if state.parent is not None:
            state.parent.lost.add(state.handle)
            state.parent.raise_interrupt(effect.reason)
        self.log.warning("turn interrupted: %s (holder %s)", effect.reason, effect.holder)

    async def _clear_interrupt(self, effect: fx.ClearInterrupt) -> None:
        turn_tasks.CURRENT.get().clear_interrupt()

    def _admission_handlers(self) -> dict[type[Any], Awaited]:
        """ADM: the door's store writes map one to one onto the port."""
        store = self.store
        return {
            fx.LoadBinding: lambda e: store.get_binding(e.principal_id, e.session_id),
            fx.BeginEpoch: lambda e: store.begin_epoch(
                e.now, e.holder or liveness.holder_identity()),
            fx.RecoverEpochs: lambda e: store.recover_epochs(e.epoch, e.now),
            fx.AdmitInput: lambda e: store.admit_input(e.candidate),
            fx.ClaimAdmission: lambda e: store.claim_admission(e.session_id, e.epoch, e.now),
            fx.MoveAdmission: lambda e: store.move_admission(
                e.admission_id, e.session_id, e.move, e.epoch, e.now, e.outcome, e.turn_id),
        }

    def _lane_handlers(self) -> dict[type[Any], Awaited]:
        """SES: the router's reads and writes map one to one onto the port."""
        store = self.store
        return {
            fx.LoadRoute: lambda e: store.get_route(e.key),
            fx.LoadRoutes: lambda e: store.latest_routes(),
            fx.PutRoute: lambda e: store.put_route(e.route, e.end_session_id, e.end_reason,
                                                   e.start),
            fx.LoadSession: lambda e: store.get_session(e.session_id),
            fx.ReadMarkers: lambda e: store.read_markers(),
            fx.WriteLane: lambda e: store.write_lane(e.markers, e.log),
            fx.LiveBackground: lambda e: store.live_background(),
        }

    def _compaction_handlers(self) -> dict[type[Any], Awaited]:
        """CMP-5, CMP-6: the lock, the compaction and the tip map one to one onto the port."""
        store = self.store
        return {
            fx.TakeCompressionLock: lambda e: store.take_compression_lock(
                e.session_id, e.holder, e.now, e.ttl_s),
            fx.ReleaseCompressionLock: lambda e: store.release_compression_lock(
                e.session_id, e.holder, e.now),
            fx.CompactSession: lambda e: store.compact_session(
                e.session_id, e.lease_token, e.messages, e.child, e.at, e.flush),
            fx.LoadTip: lambda e: store.compression_tip(e.session_id),
        }

    # -- the stepping loop ----------------------------------------------------------------
    async def run(self, coro: Coroutine[Any, Any, T], *, key: str | None = None) -> T:
        """Drive ``coro`` to its return value, performing every effect it awaits.

        ``key`` (a session id, say) names the run, so ``interrupt(key)`` can stop it.
        """
        state = turn_tasks.RunState()
        if key is None:
            return await self._run(coro, state)
        self._running[key] = state
        try:
            return await self._run(coro, state)
        finally:
            if self._running.get(key) is state:
                del self._running[key]

    def interrupt(self, key: str, reason: str = "interrupted_by_user") -> bool:
        """FIN-4: the user stops the run named ``key``: its model call, tool batch or sleep
        ends at once with ``TurnInterrupted`` (the path a lost lease takes). False when no
        run has that name."""
        state = self._running.get(key)
        if state is None:
            return False
        state.raise_interrupt(reason)
        return True

    async def _run(self, coro: Coroutine[Any, Any, T], state: turn_tasks.RunState) -> T:
        token = turn_tasks.CURRENT.set(state)
        try:
            return await self._step(coro)
        finally:  # no refresher outlives the coroutine that started it
            await state.close()
            turn_tasks.CURRENT.reset(token)

    async def _step(self, coro: Coroutine[Any, Any, T]) -> T:
        immediate, awaited = self._immediate, self._awaited
        send, throw = coro.send, coro.throw
        value: Any = None
        error: OperatingError | None = None
        while True:
            try:
                effect = send(value) if error is None else throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            error = None
            try:
                handler = immediate.get(type(effect))
                if handler is not None:
                    value = handler(effect)
                else:
                    value = await awaited.get(type(effect), _unknown_effect)(effect)
            except OperatingError as failure:
                value, error = None, failure
            except BaseException:
                coro.close()  # a crash: the engine does nothing more
                raise

    # -- handlers -------------------------------------------------------------------------
    def _call_provider(self, effect: fx.CallProvider) -> Awaitable[Any]:
        provider = self.providers.get(effect.request.model, self.provider)  # LOOP-6
        return self._vouched("model call", effect.session_id, effect.lease_token,
                             lambda: provider.complete(effect.request))

    async def _vouched(self, what: str, session_id: str, lease_token: int,
                       act: Callable[[], Awaitable[T]]) -> T:
        """LEASE-4 for acts the store cannot fence: ask the store first whether a write with
        the turn's token would be accepted; if not (the lease expired while this process
        was stalled, or another holder took it), the act is refused and the turn stops.
        ``act`` is only called once the store has vouched, so nothing of it has begun.

        The act, not the check, is interruptible: an interrupt that comes while the store
        is asked is met by ``interruptible``'s first look, before the act begins, and so
        the turn is told truly that nothing went out (``unsent``)."""
        await self._vouch(what, session_id, lease_token)
        return await turn_tasks.interruptible(turn_tasks.CURRENT.get(), act())

    async def _vouch(self, what: str, session_id: str, lease_token: int, *,
                     unsent: bool = True) -> None:
        """Refuse the act (``TurnInterrupted``) unless the store vouches for the lease
        (``unsent``: nothing of the effect has begun)."""
        if lease_token and not await self.store.lease_holds(session_id, lease_token):
            self.log.warning("%s with lease token %s refused: the lease of %s is gone",
                             what, lease_token, session_id)
            raise TurnInterrupted(f"{lease_rules.LOST_REASON} (gone before the {what})",
                                  unsent=unsent)

    async def _refresh_credentials(self, effect: fx.RefreshCredentials) -> None:
        """LOOP-5: a provider that can renew its credentials does (``refresh_credentials``);
        one that cannot is asked again with the ones it has."""
        refresh = getattr(self.providers.get(effect.model, self.provider), "refresh_credentials",
                          None)
        if refresh is not None:
            await refresh()
        self.log.info("provider credentials refreshed for %s", effect.model)

    def redirect(self, key: str, text: str) -> None:
        """LOOP-4: queue a user's correction for the run named ``key`` (the name ``interrupt``
        takes: the session id the run was started on); the turn takes it in at the top of its
        next loop iteration (the call in flight runs on). It is the run's, so a turn that
        rotated its session mid-way (CMP-5) still finds it. With no such run under way it
        waits for the session's next turn, under ``key`` as a session id."""
        state = self._running.get(key)
        if state is not None:
            state.corrections.append(text)
        else:
            self._corrections.setdefault(key, []).append(text)

    async def _drain_redirects(self, effect: fx.DrainRedirects) -> tuple[str, ...]:
        """The corrections queued before the turn began, then those sent to its run."""
        run = turn_tasks.CURRENT.get().root()
        sent, run.corrections = run.corrections, []
        return (*self._corrections.pop(effect.session_id, ()), *sent)

    async def _emit(self, effect: fx.Emit) -> None:
        event = self._turn_seqs.stamp(effect.event, self.clock())  # at, turn_seq (DEL-2)
        await self.store.log_event(event)  # handed to on_event once committed (_committed)
        if event.kind is EventKind.TURN_EXIT:
            self._exit_line(ExitLine.of(event))
        elif event.kind is EventKind.TURN_OVERLAP:  # CTX-9: a warning, naming both turns
            self.log.warning("turn %s started before turn %s made its final persist",
                             event.turn_id, event.data.get("previous_turn_id"))

    def _committed(self, events: Sequence[Event]) -> None:
        """DEL-2: a write committed these events; only now do subscribers get them."""
        self.hub.publish(events)
        if self.on_event is not None:
            for event in events:
                self.on_event(event)

    def subscribe(self, session_id: str, listener: Callable[[Event], None],
                  turn_id: str | None = None) -> delivery.Subscription:
        """DEL-2: a live feed of the session's (or one turn's) events, each once committed."""
        return self.hub.subscribe(session_id, listener, turn_id)

    async def events_after(self, session_id: str, turn_id: str,
                           after_seq: int) -> tuple[Event, ...]:
        """DEL-2: a reconnecting client's replay: the turn's committed events after its last."""
        return await self.store.events_after(session_id, turn_id, after_seq)

    def _exit_line(self, line: ExitLine) -> None:
        """FIN-7: one line per turn; WARNING when the engine says so."""
        level = logging.WARNING if line.level == "WARNING" else logging.INFO
        if self.log.isEnabledFor(level):
            self.log.log(level, _EXIT_LINE, line.reason.value, line.api_calls, line.budget_used,
                         line.budget_max, line.last_role, line.response_len)

    def _acknowledge(self, effect: fx.Acknowledge) -> None:
        """ADM-1: the door's answer reaches the submitter (its row is already committed)."""
        if self.on_ack is not None:
            self.on_ack(effect.answer)

    # -- tools ----------------------------------------------------------------------------
    def _resolve_paths(self, effect: fx.ResolvePaths) -> tuple[str | None, ...]:
        """Answered by the tools' own resolver, on the loop: a few ``lstat`` calls.

        A runner without one cannot say where a path lands, so every path is unknown
        (None) and the planner lets no writer share a segment with another path call.
        """
        if isinstance(self.tools, PathResolver):
            return self.tools.resolve_paths(effect.paths)
        return tuple(None for _ in effect.paths)

    async def _execute_tools(self, effect: fx.ExecuteTools) -> tuple[ToolResult, ...]:
        return await self._vouched("tool run", effect.session_id, effect.lease_token,
                                   lambda: self._run_tools(effect))

    async def _run_tools(self, effect: fx.ExecuteTools) -> tuple[ToolResult, ...]:
        """TOOL-5 in ``hermes_ref.shell.tool_pool``: the turn's bounds, tightened by this
        driver's own ceiling (``tool_workers_max``, ``tool_batch_deadline_s``). A call
        that begins after the batch is vouched for again as it begins (LEASE-4)."""
        watermark = await self.store.watermark()
        bounds = effect.bounds.tighter(self.tool_workers_max, self.tool_batch_deadline_s)

        async def vouch() -> None:  # earlier calls of the batch may have run: not unsent
            await self._vouch("tool call", effect.session_id, effect.lease_token, unsent=False)
        if not self.tools_in_thread:
            return await tool_pool.run_inline(self.tools, self.clock, effect.calls, watermark,
                                              bounds, vouch=vouch)
        return await tool_pool.run_segment(self.tools, self.clock, effect.calls, watermark,
                                           bounds, parallel=effect.parallel, vouch=vouch)


async def _unknown_effect(effect: object) -> None:
    raise TypeError(f"AsyncDriver cannot perform {type(effect).__name__}: {effect!r}")


def _mint_id(effect: fx.MintId) -> str:
    return f"{effect.prefix}-{uuid.uuid4().hex[:12]}"
