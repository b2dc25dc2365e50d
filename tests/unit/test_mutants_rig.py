"""A scripted driver for the mutation tests, and the tests that it drives faithfully.

The engine's coroutines only await effect values, so a test can step one by hand. ``Rig``
answers each effect with a handler chosen by the effect's type, records every effect in
order, and throws an ``OperatingError`` into the coroutine when a handler raises one,
just as the real drivers do. Its defaults are a calm world: the store numbers rows from
1, every tool call succeeds, a path lands where it says, the clock stands at 100 s. A test overrides only the
handlers its story needs, then asserts what the turn did: the rows it wrote, the
requests it sent, the result it returned.

``context`` builds a ``TurnContext`` in a chosen phase, so a decision of the loop, the
tool round or the finalizer can be run on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

import pytest

from hermes_ref import effects as fx
from hermes_ref.context import IterationBudget, SessionCache, TurnContext, TurnState
from hermes_ref.errors import OperatingError, PersistenceError, ProviderServerError
from hermes_ref.limits import Limits
from hermes_ref.models import Closed, Lease, Message, ProviderReply, Role, ToolResult, ToolSpec
from hermes_ref.phases import Phase, PhaseTracker
from hermes_ref.tool_specs import relative_path
from hermes_ref.transcript import Transcript

T = TypeVar("T")
Handler = Callable[[Any], Any]

# Phases a context can be put in, each with the legal path that reaches it.
_PATHS: dict[Phase, tuple[Phase, ...]] = {
    Phase.PROLOGUE: (Phase.PROLOGUE,),
    Phase.MODEL_CALL: (Phase.PROLOGUE, Phase.PREFLIGHT, Phase.MODEL_CALL),
    Phase.TOOL_ROUND: (Phase.PROLOGUE, Phase.PREFLIGHT, Phase.MODEL_CALL, Phase.TOOL_ROUND),
    Phase.FINALIZE: (Phase.PROLOGUE, Phase.FINALIZE),
}


class Rig:
    """Answers effects from handlers; ``effects`` is everything the coroutine awaited."""

    def __init__(self, replies: Iterable[ProviderReply | OperatingError] = (),
                 **handlers: Handler) -> None:
        self.effects: list[Any] = []
        self.replies = list(replies)
        self.next_row_id = 1
        self._handlers: dict[type[Any], Handler] = {
            fx.Now: lambda e: 100.0,
            fx.Sleep: lambda e: None,
            fx.Jitter: lambda e: 0.5,
            fx.MintId: lambda e: f"{e.prefix}-1",
            fx.Emit: lambda e: None,
            fx.FlushEvents: lambda e: None,
            fx.ReleaseLease: lambda e: None,
            fx.LeaveLeaseQueue: lambda e: None,
            fx.StartRefresher: lambda e: 1,     # the refresher would run beside the turn
            fx.StopRefresher: lambda e: False,
            fx.ClearInterrupt: lambda e: None,
            fx.DrainRedirects: lambda e: (),         # no correction arrives (LOOP-4)
            fx.RefreshCredentials: lambda e: None,   # the credentials are renewed (LOOP-5)
            fx.AppendMessages: self.store,
            fx.CloseTurn: self.close,
            fx.CallProvider: self.reply,
            fx.ExecuteTools: lambda e: tuple(
                ToolResult(call_id=c.id, name=c.name, content=f"ran {c.name}") for c in e.calls),
        }
        resolve = getattr(fx, "ResolvePaths", None)  # the tool world places path arguments
        if resolve is not None:
            self._handlers[resolve] = lambda e: tuple(relative_path(p) or "." for p in e.paths)
        for name, handler in handlers.items():
            self._handlers[getattr(fx, name)] = handler

    def store(self, effect: fx.AppendMessages) -> tuple[Message, ...]:
        """Commit rows with fresh, increasing row ids (what every store does)."""
        rows = []
        for message in effect.messages:
            rows.append(message.model_copy(update={"row_id": self.next_row_id}))
            self.next_row_id += 1
        return tuple(rows)

    def close(self, effect: fx.CloseTurn) -> Closed:
        """One commit of the final rows and the release, each through its own handler (an
        overridden ``AppendMessages`` fails the rows, an overridden ``ReleaseLease`` the
        release alone), as every store's ``close_turn`` does."""
        lease = effect.lease
        rows = self._handlers[fx.AppendMessages](fx.AppendMessages(
            lease.token, lease.session_id, effect.closing.rows, fx.Site.FINAL))
        try:
            self._handlers[fx.ReleaseLease](fx.ReleaseLease(lease))
        except PersistenceError as error:
            return Closed(stored=rows, release_failure=(error.cause, str(error)))
        return Closed(stored=rows)

    def reply(self, effect: fx.CallProvider) -> ProviderReply:
        answer = self.replies.pop(0)
        if isinstance(answer, OperatingError):
            raise answer
        return answer

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        value: Any = None
        error: OperatingError | None = None
        while True:
            try:
                effect = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            self.effects.append(effect)
            value, error = None, None
            try:
                value = self._handlers[type(effect)](effect)
            except OperatingError as failure:
                error = failure

    def of(self, kind: type[T]) -> list[T]:
        """The effects of one kind, in the order they were awaited."""
        return [e for e in self.effects if isinstance(e, kind)]

    def written(self) -> list[Message]:
        """Every row handed to a write, in order."""
        return [m for e in self.effects if isinstance(e, fx.AppendMessages | fx.CloseTurn)
                for m in (e.messages if isinstance(e, fx.AppendMessages) else e.closing.rows)]


def failing(cause: str = "disk_full") -> Handler:
    """A store handler that refuses every write."""
    def handler(effect: Any) -> Any:
        raise PersistenceError("the store refused the write", cause=cause)
    return handler


def context(messages: Iterable[Message] = (), *, phase: Phase = Phase.MODEL_CALL,
            limits: Limits | None = None, tools: tuple[ToolSpec, ...] = (),
            token: int = 5, system: str = "sys") -> TurnContext:
    """A turn context in ``phase`` over a working list of ``messages``."""
    limits = limits or Limits()
    tracker = PhaseTracker()
    for step in _PATHS[phase]:
        tracker.enter(step)
    cache = SessionCache("s", system, Message(role=Role.SYSTEM, content=system))
    lease = Lease(session_id="s", holder="h", token=token, acquired_at=0.0, expires_at=300.0)
    return TurnContext(session_id="s", turn_id="t", limits=limits, tools=tools, cache=cache,
                       lease=lease, tracker=tracker,
                       state=TurnState(budget=IterationBudget(limits.iteration_budget)),
                       transcript=Transcript(messages))


async def _write_then_read(ctx: TurnContext) -> tuple[bool, float]:
    ok = await ctx.persist((Message(role=Role.USER, content="q"),), fx.Site.USER)
    return ok, await fx.Now()


def test_rig_numbers_stored_rows_and_records_effects() -> None:
    """The rig's store gives rows increasing ids and the effects are kept in order."""
    rig = Rig()
    ctx = context(phase=Phase.PROLOGUE)
    assert rig.run(_write_then_read(ctx)) == (True, 100.0)
    assert [type(e) for e in rig.effects] == [fx.AppendMessages, fx.Now]
    assert [m.row_id for m in ctx.transcript] == [1]


def test_rig_throws_an_operating_error_into_the_coroutine() -> None:
    """A handler's operating error reaches the engine as a failed effect, not a crash."""
    rig = Rig(AppendMessages=failing())
    ctx = context(phase=Phase.PROLOGUE)
    assert rig.run(_write_then_read(ctx)) == (False, 100.0)
    assert ctx.state.persistence_failed


def test_rig_raises_scripted_provider_errors() -> None:
    """A scripted provider error is raised at the call, and the next reply follows it."""
    rig = Rig([ProviderServerError("down"), ProviderReply(content="hi")])
    with pytest.raises(ProviderServerError):
        rig.reply(fx.CallProvider(request=None))  # type: ignore[arg-type]
    assert rig.reply(fx.CallProvider(request=None)).content == "hi"  # type: ignore[arg-type]
