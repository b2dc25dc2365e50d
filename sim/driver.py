"""The synchronous simulator driver: runs engine coroutines against a ``World``.

Theory of operation
-------------------
``SimDriver.run(coro)`` steps the coroutine by hand: each ``send`` returns the next
effect, the driver performs it against the world and sends the result back, or throws
the world's ``OperatingError`` into the coroutine. There is no event loop and no thread,
so the order of everything is fixed by the seed and the script.

Before and after each effect the driver consults the fault plan. A crash is the driver
*dropping* the coroutine: it closes it (so any stray effect inside a ``finally`` would
surface as a RuntimeError — the house rule forbids those), tells the store to lose its
pending writes, and raises ``Crashed``. Nothing the engine would have done after that
point can reach the world. The caller then starts a new ``Engine`` on the same world.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

from hermes_ref import effects as fx
from hermes_ref.effects import Site
from hermes_ref.errors import OperatingError, PersistenceError, ProviderRejected, RateLimited
from hermes_ref.models import EventKind, ToolResult
from hermes_ref.outcomes import ExitLine
from sim.faults import Crashed
from sim.world import CallRecord, World

T = TypeVar("T")
Handler = Callable[[Any], Any]


# Set by ``run_scenario(verbose=True)``: narrate whole texts instead of a short prefix.
FULL_TEXT: ContextVar[bool] = ContextVar("hermes_ref_sim_full_text", default=False)


def _short(text: str | None, limit: int = 48) -> str:
    if text is None:
        return "None"
    if FULL_TEXT.get():
        return repr(text)
    flat = text.replace("\n", " ")
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


class SimDriver:
    def __init__(self, world: World) -> None:
        self.world = world
        self.effects_performed = 0
        self._handlers: dict[type[Any], Handler] = {
            fx.Now: lambda e: world.clock.now(),
            fx.Sleep: self._sleep,
            fx.Jitter: lambda e: world.chooser.fraction("backoff"),
            fx.MintId: lambda e: world.mint_id(e.prefix),
            fx.LoadMessages: lambda e: world.store.load_messages(e.session_id, e.after_row_id),
            fx.OpenTurn: self._open_turn,
            fx.AcquireLease: self._acquire_lease,
            fx.ReleaseLease: self._release_lease,
            fx.AppendMessages: self._append,
            fx.CallProvider: self._call_provider,
            fx.ResolvePaths: self._resolve_paths,
            fx.ExecuteTools: self._execute_tools,
            fx.Emit: self._emit,
            fx.FlushEvents: self._flush_events,
        }

    # -- the stepping loop ----------------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        faults = self.world.fault_state
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            planned = faults.crashes_planned
            if planned:
                self._crash_before(coro, effect)
            try:
                value = self._handlers[type(effect)](effect)
            except OperatingError as failure:
                error = failure
            self.effects_performed += 1
            site = effect.site
            if planned and error is None and site is not None and faults.crash_due("after", site):
                self._drop(coro, f"after:{site.value}")

    def _crash_before(self, coro: Coroutine[Any, Any, Any], effect: Any) -> None:
        faults = self.world.fault_state
        if faults.effect_crash_due():
            self._drop(coro, f"effect#{faults.effects}:{effect.kind}")
        site = effect.site
        if site is not None and faults.crash_due("before", site):
            self._drop(coro, f"before:{site.value}")

    def _drop(self, coro: Coroutine[Any, Any, Any], point: str) -> None:
        if self.world.on_crash is not None:
            self.world.on_crash(point)  # a real crash: the process may die right here
        coro.close()
        self.world.crash(point, self.effects_performed)
        raise Crashed(point)

    # -- handlers -------------------------------------------------------------------
    def _sleep(self, effect: fx.Sleep) -> None:
        self.world.clock.advance(effect.seconds)
        self.world.timeline.add("sleep", f"{round(effect.seconds, 3):g} s")

    def _fail_if_planned(self, site: Site) -> None:
        if self.world.fault_state.write_fails(site):
            cause = self.world.faults.write_failure_cause
            self.world.write_failures += 1
            self.world.timeline.add("FAULT", f"write at {site} fails ({cause})")
            raise PersistenceError(f"simulated store failure at {site}", cause=cause)

    def _open_turn(self, effect: fx.OpenTurn) -> Any:
        self._fail_if_planned(Site.LEASE)
        grant = self.world.store.open_turn(effect.record, effect.holder, effect.now, effect.ttl_s)
        if grant.created:
            self.world.timeline.add("write", f"session   {effect.record.id} created")
        got = f"token {grant.lease.token}" if grant.lease else "busy"
        self.world.timeline.add("write", f"lease     {effect.record.id} {got}")
        return grant

    def _acquire_lease(self, effect: fx.AcquireLease) -> Any:
        self._fail_if_planned(Site.LEASE)
        lease = self.world.store.acquire_lease(
            effect.session_id, effect.holder, effect.now, effect.ttl_s
        )
        got = f"token {lease.token}" if lease else "busy"
        self.world.timeline.add("write", f"lease     {effect.session_id} {got}")
        return lease

    def _release_lease(self, effect: fx.ReleaseLease) -> None:
        self._fail_if_planned(Site.RELEASE)
        self.world.store.release_lease(effect.lease)
        self.world.timeline.add("write", f"release   token {effect.lease.token}")

    def _append(self, effect: fx.AppendMessages) -> Any:
        self._fail_if_planned(effect.label)
        rows = self.world.store.append_messages(
            effect.session_id, effect.lease_token, effect.messages
        )
        if self.world.timeline.enabled:
            for row in rows:
                self.world.timeline.add("write", f"{effect.label:<9} #{row.row_id} {_describe(row)}")
        return rows

    def _call_provider(self, effect: fx.CallProvider) -> Any:
        world = self.world
        provider = world.provider
        watermark, at = world.store.watermark(), world.clock.now()
        try:
            body = effect.request.wire_body()  # what production would send, or nothing at all
        except ProviderRejected as refused:
            world.timeline.add("call", f"primary -> not sent: {refused}")
            raise
        try:
            reply = provider.complete(effect.request)
        except Exception as failure:  # the world logs every request it got, even a scripting error
            retry_after = failure.retry_after_s if isinstance(failure, RateLimited) else None
            world.calls.append(CallRecord(self.effects_performed, effect.session_id,
                                          effect.turn_id, effect.request, None,
                                          type(failure).__name__, watermark, at, retry_after, body))
            world.timeline.add("call", f"primary -> {type(failure).__name__}: {failure}")
            raise
        world.calls.append(CallRecord(self.effects_performed, effect.session_id, effect.turn_id,
                                      effect.request, reply, None, watermark, at, None, body))
        if world.timeline.enabled:
            if reply.tool_calls:
                calls = ", ".join(f"{c.name}({c.id})" for c in reply.tool_calls)
                world.timeline.add("call", f"primary -> tool_calls {calls}")
            else:
                world.timeline.add(
                    "call", f"primary -> {reply.finish_reason} {_short(reply.content)}"
                )
        return reply

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

    def _execute_tools(self, effect: fx.ExecuteTools) -> tuple[ToolResult, ...]:
        """Run a segment: a parallel one in waves of ``tool_workers_max`` (TOOL-5), started
        together and finished when the slowest ends; a sequential one call after call."""
        world = self.world
        watermark = world.store.watermark()
        width = world.tool_workers_max if effect.parallel else 1
        results: list[ToolResult] = []
        for start in range(0, len(effect.calls), width):
            wave = effect.calls[start:start + width]
            at = world.clock.now()
            results.extend(world.tools.run(call, watermark=watermark, at=at) for call in wave)
            world.batches.append(tuple(call.id for call in wave))
            world.clock.advance(max(self._cost_s(call.name) for call in wave))
        if world.timeline.enabled:
            mode = "parallel" if effect.parallel else "sequential"
            for result in results:
                state = "error" if result.is_error else "ok"
                world.timeline.add("tool", f"{mode:<10} {result.call_id} {result.name} {state}")
        return tuple(results)

    def _cost_s(self, name: str) -> float:
        tools = self.world.tools
        return self.world.tool_batch_deadline_s if tools.is_hung(name) else tools.cost_s(name)

    def _flush_events(self, effect: fx.FlushEvents) -> None:
        self._fail_if_planned(Site.EVENTS)
        self.world.store.flush_events()

    def _emit(self, effect: fx.Emit) -> None:
        world = self.world
        event = effect.event
        if event.at is None:
            event = event.model_copy(update={"at": world.clock.now()})
        world.store.log_event(event)
        world.stream.append(event)
        for subscriber in world.subscribers:
            subscriber(event)
        if world.timeline.enabled and event.kind is EventKind.TURN_EXIT:
            line = ExitLine.of(event)
            world.timeline.add(
                "exit", f"{line.level} reason={line.reason.value} calls={line.api_calls} "
                f"budget={line.budget_used}/{line.budget_max} last={line.last_role}",
            )


def _describe(row: Any) -> str:
    role = row.role.value
    if row.tool_calls:
        return f"{role} calls " + ", ".join(f"{c.id} {c.name}" for c in row.tool_calls)
    if role == "tool":
        return f"tool result {row.tool_call_id} {_short(row.content, 32)}"
    return f"{role} {_short(row.content)}"
