"""The synchronous simulator driver: performs one process's effects against a ``World``.

Theory of operation
-------------------
Each simulated process has one ``SimDriver``. The world's scheduler (``sim.scheduler``)
owns the actors (turns, lease refreshers) of every process and picks, step by step, whose
effect runs next; ``advance`` performs that one effect: it ``send``s the actor's last
answer into its coroutine, gets the next effect, performs it against the world and keeps
the answer (or the ``OperatingError``) for the next step. There is no event loop and no
thread, so the order of everything is fixed by the seed and the script.
``run(coro)`` is the one-turn form: spawn the coroutine and step the world until it ends.

An effect that takes time answers with a ``Wait``: the actor is parked and the clock
moves only when every actor waits (see the scheduler). Events are kept per process until
one of its writes commits them, as a real process keeps its own connection's pending
rows: another process's commit never carries them.

Before and after each effect the driver consults the fault plan. A crash is the driver
*dropping* every coroutine of the process: it closes them (so any stray effect inside a
``finally`` would surface as a RuntimeError: the house rule forbids those), the process's
pending writes are lost, and the actors are marked crashed; ``run`` raises ``Crashed``.
Nothing the engine would have done after that point can reach the world. The other
processes run on; the harness starts a new process on the same world to recover.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from hermes_ref import effects as fx
from hermes_ref.effects import Site
from hermes_ref.errors import (
    LeaseLost,
    OperatingError,
    PersistenceError,
    ProviderRejected,
    RateLimited,
    TurnInterrupted,
)
from hermes_ref.lease import LOST_REASON
from hermes_ref.models import Closed, Event, EventKind, Lease, LeaseGrant, ProviderReply
from hermes_ref.outcomes import ExitLine
from sim.compaction_handlers import CompactionHandlers  # CMP-5, CMP-6
from sim.door_handlers import AdmissionHandlers
from sim.faults import Crashed
from sim.lane_handlers import LaneHandlers  # SES
from sim.lease_actor import LeaseHandlers
from sim.scheduler import Actor, Wait
from sim.stream_driver import StreamHandlers  # DEL, FIN-2
from sim.summarizer import COMPRESSION_PURPOSE  # CMP-2
from sim.tool_batch import run_segment  # TOOL-5
from sim.world import CallRecord, FailedWrite, SimProcess, World

T = TypeVar("T")
R = TypeVar("R")
Handler = Callable[[Any], Any]

# Effects that take time or call out: a hard interrupt is delivered from these (LEASE-4).
INTERRUPTIBLE: frozenset[type[Any]] = frozenset({fx.CallProvider, fx.ExecuteTools, fx.Sleep})


# Set by ``run_scenario(verbose=True)``: narrate whole texts instead of a short prefix.
FULL_TEXT: ContextVar[bool] = ContextVar("hermes_ref_sim_full_text", default=False)


def _nothing() -> None:
    """The answer of a wait that only passes time (a sleep: ``None``)."""


def _short(text: str | None, limit: int = 48) -> str:
    if text is None:
        return "None"
    if FULL_TEXT.get():
        return repr(text)
    flat = text.replace("\n", " ")
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


class SimDriver(StreamHandlers, LeaseHandlers, AdmissionHandlers, LaneHandlers,
                CompactionHandlers):
    def __init__(self, world: World, process: SimProcess | None = None) -> None:
        self.world = world
        self.process = process if process is not None else world.processes[world.pid]
        self.current: Actor | None = None
        self._refreshers: dict[int, Actor] = {}
        self._kept: dict[int, Lease] = {}
        self._lost: set[int] = set()
        self._handlers: dict[type[Any], Handler] = {
            fx.Now: lambda e: world.clock.now(),
            fx.Sleep: self._sleep,
            fx.Jitter: lambda e: world.chooser.fraction("backoff"),
            fx.MintId: self._mint_id,
            fx.LoadMessages: lambda e: world.store.load_messages(e.session_id, e.after_row_id),
            fx.AppendMessages: self._append,
            fx.CallProvider: self._call_provider,
            fx.RefreshCredentials: self._refresh_credentials,  # LOOP-5
            fx.DrainRedirects: self._drain_redirects,  # LOOP-4
            fx.ResolvePaths: self._resolve_paths,
            fx.ExecuteTools: self._execute_tools,
            fx.Emit: self._emit,
            fx.FlushEvents: self._flush_events,
            **self.lease_handlers(),
            **self.admission_handlers(),  # ADM: sim/door_handlers.py
            **self.lane_handlers(),  # SES: sim/lane_handlers.py
            **self.compaction_handlers(),  # CMP: sim/compaction_handlers.py
        }

    @property
    def effects_performed(self) -> int:
        """Effects performed so far in the whole world (every process), in world order."""
        return self.world.effects_performed

    # -- actors -------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "turn",
              parent: Actor | None = None) -> Actor:
        """Make ``coro`` an actor of this process; the scheduler runs it from now on."""
        return self.world.scheduler.spawn(self, coro, name, parent)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one coroutine of this process to its end (other actors step meanwhile)."""
        actor = self.spawn(coro)
        self.world.scheduler.run_until(lambda: actor.done)
        return finished(actor)  # type: ignore[no-any-return]

    def advance(self, actor: Actor) -> None:
        """Perform the actor's next effect (the scheduler chose it)."""
        self.world.timeline.pid = self.process.pid  # whose lane the lines it adds go to
        try:
            coro = actor.coro
            effect = coro.send(actor.value) if actor.error is None else coro.throw(actor.error)
        except StopIteration as stop:
            self._end(actor, stop.value, None)
            return
        except BaseException as raised:  # the harness reports what the engine raised
            self._end(actor, None, raised)
            return
        actor.value, actor.error = None, None
        if self.world.fault_state.crashes_planned and self._crash_before(actor, effect):
            return
        kind = type(effect)
        if actor.interrupt is not None and kind in INTERRUPTIBLE:
            actor.error = TurnInterrupted(actor.interrupt, unsent=True)  # not performed: the turn stops
            return
        self._perform(actor, effect, self._handlers[kind], effect)

    def resume(self, actor: Actor) -> None:
        """The actor's wait is over: compute its answer (it may wait again)."""
        wait, effect = actor.wait, actor.pending
        assert wait is not None
        self.world.timeline.pid = self.process.pid
        self.world.scheduler.retire(actor)
        self._perform(actor, effect, wait.then)

    def _perform(self, actor: Actor, effect: Any, step: Callable[..., Any], *args: Any) -> None:
        """``step(*args)`` computes the effect's answer: its handler's (given the effect),
        or a finished wait's ``then()``."""
        self.current = actor
        try:
            outcome = step(*args)
        except OperatingError as failure:
            self._complete(actor, effect, None, failure)
            return
        if isinstance(outcome, Wait):
            self.world.scheduler.park(actor, effect, outcome)
            return
        self._complete(actor, effect, outcome, None)

    def _complete(self, actor: Actor, effect: Any, value: Any, error: BaseException | None) -> None:
        world = self.world
        world.effects_performed += 1
        actor.value, actor.error = value, error
        if not world.fault_state.crashes_planned or error is not None:
            return  # most effects: nothing planned to die after them
        site = effect.site
        if site is None:
            return
        if world.fault_state.crash_due("after", site):
            self._drop(f"after:{site.value}")
        elif isinstance(effect, fx.CloseTurn) and isinstance(value, Closed) \
                and value.release_failure is None and world.fault_state.crash_due("after", Site.RELEASE):
            self._drop(f"after:{Site.RELEASE.value}")  # the release rode the final row's commit
        elif isinstance(value, LeaseGrant) and value.opened \
                and world.fault_state.crash_due("after", Site.USER):
            self._drop(f"after:{Site.USER.value}")  # the user row rode the grant's commit

    def _end(self, actor: Actor, result: Any, raised: BaseException | None) -> None:
        """An actor ended; whatever it started and did not stop (a refresher) ends with it."""
        actor.done, actor.result, actor.raised = True, result, raised
        self.world.scheduler.ends += 1
        self.world.scheduler.retire(actor)
        for child in actor.children:
            self.stop_actor(child)

    def stop_actor(self, actor: Actor) -> None:
        """End an actor where it waits (a stopped refresher): its pending effect is over."""
        if actor.done:
            return
        if actor.wait is not None:
            self.world.effects_performed += 1  # its handler ran; the wait is cut short
        actor.coro.close()
        actor.done = True
        self.world.scheduler.ends += 1
        self.world.scheduler.retire(actor)

    def _crash_before(self, actor: Actor, effect: Any) -> bool:
        faults = self.world.fault_state
        if faults.effect_crash_due():
            self._drop(f"effect#{faults.effects}:{effect.kind}")
            return True
        site = effect.site
        if site is not None and faults.crash_due("before", site):
            self._drop(f"before:{site.value}")
            return True
        if self._opens_with_user_row(effect) and faults.crash_due("before", Site.USER):
            self._drop(f"before:{Site.USER.value}")  # the commit that would carry the user row
            return True
        if isinstance(effect, fx.CloseTurn) and faults.crash_due("before", Site.RELEASE):
            self._drop(f"before:{Site.RELEASE.value}")  # the commit that would carry the release
            return True
        return False

    def _opens_with_user_row(self, effect: Any) -> bool:
        """A lease request that will store the user row too (``Opening``): sites lease and
        user are one commit, and a crash point at either is at that commit."""
        if not isinstance(effect, fx.OpenTurn) or effect.opening is None:
            return False
        crash = self.world.fault_state.plan.crash
        if crash is None or crash.site is not Site.USER:
            return False  # only a planned crash at the user row needs to know
        return self.world.store.would_open(effect.record, effect.holder, effect.now, effect.ttl_s,
                                           effect.poll_s, effect.opening)

    def _drop(self, point: str) -> None:
        if self.world.on_crash is not None:
            self.world.on_crash(point)  # a real crash: the process may die right here
        self.crash_process(point)

    def crash_process(self, point: str) -> None:
        """This process dies at ``point``: every actor of it is dropped where it stands."""
        self.world.scheduler.drop_process(self.process.pid, point)
        self.world.crash(point, self.world.effects_performed, pid=self.process.pid)

    def _write(self, write: Callable[..., R], *args: Any,
               carried: Callable[[R], Sequence[Event]] | None = None) -> R:
        """A store write of this process: it commits this process's pending events with it.

        ``carried`` names the events the write itself carried and committed (an opening's,
        a closing's), given its result: they are handed out with the pending ones, after
        them, in the one hand-off of what this commit made durable."""
        store, pending = self.world.store, self.process.pending_events
        logged = list(pending)
        for event in pending:
            store.log_event(event)
        pending.clear()
        try:
            result = write(*args)
        finally:  # a refused or failed write commits nothing: the events stay this process's
            pending[:0] = store.take_pending_events()
        committed = logged[:len(logged) - len(pending)] if pending else logged
        extra = list(carried(result)) if carried is not None else []
        self._publish(committed + extra, 0)  # DEL-2: clients get only what is committed
        return result


    # -- handlers -------------------------------------------------------------------
    def _mint_id(self, effect: fx.MintId) -> str:
        minted = self.world.mint_id(effect.prefix)
        actor = self.current
        if effect.prefix == "turn" and actor is not None and actor.turn_id is None:
            actor.turn_id = minted
        return minted

    def _sleep(self, effect: fx.Sleep) -> Wait:
        """A turn's sleep is narrated when it ends; a refresher's is not (its refreshes are),
        nor is anything when no timeline is kept."""
        timeline = self.world.timeline
        if not timeline.enabled or (self.current is not None and self.current.parent is not None):
            return Wait(effect.seconds, _nothing)
        return Wait(effect.seconds,
                    lambda: timeline.add("sleep", f"{round(effect.seconds, 3):g} s"))

    def _fail_if_planned(self, site: Site) -> None:
        if self.world.fault_state.write_fails(site):
            cause = self.world.faults.write_failure_cause
            self.world.write_failures += 1
            turn_id = self.current.turn_id if self.current is not None else None
            if turn_id is not None:  # whose write it was, for turns that run side by side
                failed = self.world.write_failures_by_turn
                failed[turn_id] = failed.get(turn_id, 0) + 1
            self.world.failed_writes.append(FailedWrite(turn_id, str(site), self.world.clock.now()))
            self.world.timeline.add("FAULT", f"write at {site} fails ({cause})")
            raise PersistenceError(f"simulated store failure at {site}", cause=cause)

    def _append(self, effect: fx.AppendMessages) -> Any:
        self._fail_if_planned(effect.label)
        try:
            rows = self._write(self.world.store.append_messages, effect.session_id,
                               effect.lease_token, effect.messages)
        except LeaseLost:
            self.world.timeline.add("FENCED", f"{effect.label} write with token "
                                    f"{effect.lease_token} refused: the lease is gone")
            raise
        if self.world.timeline.enabled:
            for row in rows:
                self.world.timeline.add("write", f"{effect.label:<9} #{row.row_id} {describe_row(row)}")
        return rows

    def _vouch(self, what: str, session_id: str, lease_token: int, *,
               unsent: bool = True) -> None:
        """LEASE-4 for acts the store cannot fence: refuse one the lease no longer covers
        (``unsent``: nothing of the effect has begun)."""
        if lease_token and not self.world.store.lease_holds(session_id, lease_token):
            self.world.timeline.add("FENCED", f"{what} with token {lease_token} refused: "
                                    "the lease is gone")
            raise TurnInterrupted(f"{LOST_REASON} (gone before the {what})", unsent=unsent)

    def _call_provider(self, effect: fx.CallProvider) -> Any:
        self._vouch("model call", effect.session_id, effect.lease_token)
        if effect.request.purpose == COMPRESSION_PURPOSE:  # CMP-2: the auxiliary model
            return self._call_summarizer(effect)
        world = self.world
        provider = world.providers.get(effect.request.model, world.provider)  # LOOP-6: per route
        label = "primary" if provider is world.provider else effect.request.model
        watermark, at = world.store.watermark(), world.clock.now()
        try:
            body = effect.request.wire_body()  # what production would send, or nothing at all
        except ProviderRejected as refused:
            world.timeline.add("call", f"{label} -> not sent: {refused}")
            raise
        try:
            reply = provider.complete(effect.request)
        except Exception as failure:  # the world logs every request it got, even a scripting error
            retry_after = failure.retry_after_s if isinstance(failure, RateLimited) else None
            world.calls.append(CallRecord(self.effects_performed, effect.session_id,
                                          effect.turn_id, effect.request, None,
                                          type(failure).__name__, watermark, at, retry_after, body))
            world.timeline.add("call", f"{label} -> {type(failure).__name__}: {failure}")
            raise
        if effect.request.stream:  # DEL-1 / FIN-2: as deltas, maybe cut (sim/stream_driver.py)
            reply = self._streamed(effect, reply, watermark, at, body, label)
        world.calls.append(CallRecord(self.effects_performed, effect.session_id, effect.turn_id,
                                      effect.request, reply, None, watermark, at, None, body))
        if world.timeline.enabled:
            if reply.tool_calls:
                calls = ", ".join(f"{c.name}({c.id})" for c in reply.tool_calls)
                world.timeline.add("call", f"{label} -> tool_calls {calls}")
            else:
                world.timeline.add(
                    "call", f"{label} -> {reply.finish_reason} {_short(reply.content)}"
                )
        delay_s = world.provider_delays_s.get(len(world.calls), 0.0)
        if world.moments:  # LOOP-4: the user corrects the turn at this call
            delay_s = max(delay_s, self._moment(effect, reply))
        if delay_s <= 0:
            return reply
        actor = self.current
        if actor is not None:  # a slow reply streams meanwhile: a correction may cut it (LOOP-4)
            world.streaming[actor.seq] = reply
        return Wait(delay_s, lambda: reply)

    def _moment(self, effect: Any, reply: ProviderReply | None) -> float:
        """The first correction the user holds for this moment of the turn is sent
        (``sim.interventions.Moment``); returns how long the reply then streams."""
        for moment in self.world.moments:
            slow_s = moment.reached(self.world, self.current, effect, reply)
            if slow_s is not None:
                self.world.moments.remove(moment)
                return float(slow_s)
        return 0.0

    def _call_summarizer(self, effect: fx.CallProvider) -> Any:
        """A compaction summary request: the provider's summarizer answers, and the world
        logs it in ``summary_calls``, apart from the turn's calls (CMP-2, CMP-4)."""
        world = self.world
        for watch in list(world.summary_watchers):
            watch(effect.session_id, self.process.pid)
        watermark, at = world.store.watermark(), world.clock.now()
        body = effect.request.wire_body()
        summarizer = getattr(world.provider, "summarizer", None)
        try:
            if summarizer is None:
                raise ProviderRejected("this provider has no summarizer for compaction")
            reply = summarizer.complete(effect.request)
        except Exception as failure:  # logged like any call, then raised into the engine
            world.summary_calls.append(CallRecord(self.effects_performed, effect.session_id,
                                                  effect.turn_id, effect.request, None,
                                                  type(failure).__name__, watermark, at, None,
                                                  body))
            world.timeline.add("call", f"summarizer -> {type(failure).__name__}: {failure}")
            for watcher in list(world.summary_failure_watchers):
                watcher(effect.session_id)
            raise
        world.summary_calls.append(CallRecord(self.effects_performed, effect.session_id,
                                              effect.turn_id, effect.request, reply, None,
                                              watermark, at, None, body))
        world.timeline.add("call", f"summarizer -> {_short(reply.content)}")
        delay_s: float = getattr(summarizer, "delay_s", 0.0)  # a slow summarizer (a crash story)
        return Wait(delay_s, lambda: reply) if delay_s > 0 else reply

    def _refresh_credentials(self, effect: fx.RefreshCredentials) -> None:
        """LOOP-5: the world renews the route's credentials and keeps a note of it."""
        self._note("credentials", effect.session_id, effect.model, effect.turn_id)
        self.world.timeline.add("auth", f"credentials of {effect.model} renewed")

    def _drain_redirects(self, effect: fx.DrainRedirects) -> tuple[str, ...]:
        """LOOP-4: hand the turn the corrections sent to it, once each.

        They are the turn's, not the session's: the user corrected the turn that ran, in
        its process, so no other turn takes them in, and a turn that rotated its session
        mid-way (CMP-5) still finds them. The note names the session the user addressed."""
        sent = tuple(self.world.redirects.pop(effect.turn_id, ()))
        for session_id, text in sent:
            self._note("drained", session_id, text)
            self.world.timeline.add("redirect", f"{effect.turn_id} takes in {_short(text)}")
        return tuple(text for _, text in sent)

    def _note(self, what: str, session_id: str | None, text: str,
              turn_id: str | None = None) -> None:
        from sim.world import Intervention

        world, actor = self.world, self.current
        if not turn_id:  # the turn the effect named, else the one the actor minted first
            turn_id = actor.turn_id if actor is not None else None
        world.interventions.append(Intervention(what, session_id or "", turn_id, text,
                                                world.clock.now(), world.effects_performed))

    def _resolve_paths(self, effect: fx.ResolvePaths) -> tuple[str | None, ...]:
        """Answered by ``SimTools``' resolver, the one its tools act through.

        Narrated only where the answer differs from the path as written, so a story
        with plain relative paths keeps its timeline.
        """
        answers = self.world.tools.resolve_paths(effect.paths)
        if self.world.timeline.enabled:
            for path, answer in zip(effect.paths, answers, strict=True):
                if answer != posixpath.normpath(path):
                    landed = "refused" if answer is None else answer
                    self.world.timeline.add("resolve", f"{path} -> {landed}")
        return answers

    def _execute_tools(self, effect: fx.ExecuteTools) -> Wait:
        """Run a segment on the virtual clock under its batch bounds (TOOL-5): a pool of
        workers, the start gate and the deadline, in ``sim.tool_batch``.

        The batch moves from instant to instant as ``Wait``s, so other actors (a lease
        refresher) get their turns while a long batch is in flight. The lease is vouched
        for as the batch begins, and again for each call that begins later (LEASE-4).
        """
        self._vouch("tool run", effect.session_id, effect.lease_token)
        if self.world.moments:  # LOOP-4: the user corrects the turn during this round
            self._moment(effect, None)

        def vouch() -> None:  # a call beginning later: earlier calls of the batch may have run
            self._vouch("tool call", effect.session_id, effect.lease_token, unsent=False)
        return run_segment(self.world, effect, hung_s=self.world.tool_batch_deadline_s,
                           pid=self.process.pid, vouch=vouch)

    def _flush_events(self, effect: fx.FlushEvents) -> None:
        self._fail_if_planned(Site.EVENTS)
        self._write(self.world.store.flush_events)

    def _show(self, event: Event) -> None:
        """An emitted event joins the world's stream and reaches its subscribers."""
        self.world.stream.append(event)
        for subscriber in self.world.subscribers:
            subscriber(event)

    def _emit(self, effect: fx.Emit) -> None:
        world = self.world
        event = self._stamp(effect.event)  # its clock time and its place in the turn (DEL-2)
        self.process.pending_events.append(event)
        self._show(event)
        if world.timeline.enabled and event.kind is EventKind.TURN_OVERLAP:
            world.timeline.add("warn", f"{event.turn_id} started before "
                               f"{event.data.get('previous_turn_id')}'s final persist")
        if event.kind is EventKind.TURN_EXIT:
            self._narrate_exit(event)

    def _narrate_exit(self, event: Event) -> None:
        timeline = self.world.timeline
        if timeline.enabled:
            line = ExitLine.of(event)
            timeline.add("exit", f"{line.level} reason={line.reason.value} calls={line.api_calls} "
                         f"budget={line.budget_used}/{line.budget_max} last={line.last_role}")


def finished(actor: Actor) -> Any:
    """What an ended actor came to: its result, its crash as ``Crashed``, or what it raised."""
    if not actor.done:
        raise RuntimeError(f"the world went idle before {actor.name} ended (a deadlock)")
    if actor.crashed is not None:
        raise Crashed(actor.crashed)
    if actor.raised is not None:
        raise actor.raised
    return actor.result


def describe_row(row: Any) -> str:
    """One stored row, as the timeline shows it."""
    role = row.role.value
    if row.tool_calls:
        return f"{role} calls " + ", ".join(f"{c.id} {c.name}" for c in row.tool_calls)
    if role == "tool":
        return f"tool result {row.tool_call_id} {_short(row.content, 32)}"
    return f"{role} {_short(row.content)}"
