"""How a turn ends: the exit reasons, the one owner of a turn's ending, the exit line.

Theory of operation
-------------------
A turn's ending is three facts that must agree: *why* it ended (one ``ExitReason`` from a
closed set: LOOP-3), *what the user is told* (the answer) and *whether it failed*. One
``Ending`` value holds all three and is the only thing that sets them:

* ``finish(reason, detail, answer=..., failed=...)`` records the loop's exit once; later
  calls keep the first reason (the first cause is the true one);
* ``amend_answer`` changes only the text delivered for an exit already recorded (the grace
  summary, the failed-write footer);
* ``fail_unanswered`` and ``replace`` are the finalizer's two guards, and
  ``keep_held_answer`` its rescue of an answer the verification gate held back: they
  change the outcome on purpose and say so in their names.

Every event a turn emits is one of four typed records defined here: ``TurnStarted``,
``ToolProgress``, the ``ExitLine`` (FIN-7, one per turn) and the ``Completion`` (DEL-1,
the authoritative final answer). Each travels as ``Event`` data and is read back with
``.of(event)``, so drivers and checkers never index untyped keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Literal, Self

from hermes_ref.errors import InvariantBroken
from hermes_ref.models import Event, EventKind, Frozen, Message, Role


class ExitReason(StrEnum):
    TEXT_RESPONSE = "text_response"
    MAX_ITERATIONS = "max_iterations_reached"
    BUDGET_EXHAUSTED = "budget_exhausted"
    INTERRUPTED = "interrupted"
    COMPRESSION_TIMEOUT = "context_compression_timeout"
    COMPRESSION_EXHAUSTED = "context_compression_exhausted"  # CMP-7: failed closed, not sent
    GUARDRAIL_HALT = "guardrail_halt"
    PERSISTENCE_FAILED = "session_persistence_failed"
    EMPTY_RESPONSE_EXHAUSTED = "empty_response_exhausted"
    LOCAL_PROCESSING_ERROR = "local_processing_error"
    TERMINAL_PROVIDER_ERROR = "terminal_provider_error"
    PENDING_TOOL_RESULT = "pending_tool_result"
    INVALID_TOOL_CALLS = "invalid_tool_calls"
    TRUNCATED_TOOL_CALL = "truncated_tool_call"
    LEASE_TIMEOUT = "session_turn_lease_timeout"


# Exits after which the turn counts as failed (the user gets an explanation, not an answer).
FAILED_EXITS = frozenset({
    ExitReason.PERSISTENCE_FAILED,
    ExitReason.EMPTY_RESPONSE_EXHAUSTED,
    ExitReason.LOCAL_PROCESSING_ERROR,
    ExitReason.TERMINAL_PROVIDER_ERROR,
    ExitReason.PENDING_TOOL_RESULT,
    ExitReason.INVALID_TOOL_CALLS,
    ExitReason.TRUNCATED_TOOL_CALL,
    ExitReason.LEASE_TIMEOUT,
    ExitReason.COMPRESSION_TIMEOUT,
    ExitReason.COMPRESSION_EXHAUSTED,
})

# Failures caused by context pressure: FIN-5 adds no boundary row after these.
CONTEXT_PRESSURE_EXITS = frozenset({ExitReason.COMPRESSION_TIMEOUT, ExitReason.COMPRESSION_EXHAUSTED})

# Failures of the check the verification gate asks for (FIN-1's gate), after which the
# answer it held back still stands (FIN-6): the request could not be sent or relieved,
# the provider refused it or failed past its retries, or the model's replies to it were no
# use (the empty ladder ran out, a reply that cannot be processed, a tool call cut off,
# rounds of tools that do not exist). Each ends before a call is left open. A lost lease
# or an interrupt is not here (the turn ends ``interrupted``), nor a failed write: its
# rows may leave calls open that only the failure boundary (FIN-5) closes.
CHECK_FAILURE_EXITS = CONTEXT_PRESSURE_EXITS | frozenset({
    ExitReason.TERMINAL_PROVIDER_ERROR,
    ExitReason.EMPTY_RESPONSE_EXHAUSTED,
    ExitReason.LOCAL_PROCESSING_ERROR,
    ExitReason.TRUNCATED_TOOL_CALL,
    ExitReason.INVALID_TOOL_CALLS,
})

# Reasons LOOP-3 names whose paths are not built yet (guardrails): no engine path records
# them, and a test keeps this list true.
EXITS_NOT_YET_PRODUCED = frozenset({
    ExitReason.GUARDRAIL_HALT,
})


@dataclass(slots=True)
class Ending:
    """Reason, answer and failure of one turn, set together (see the module docstring)."""

    reason: ExitReason | None = None
    detail: str = ""
    answer: str | None = None
    failed: bool = False

    def finish(self, reason: ExitReason, detail: str = "", *, answer: str | None = None,
               failed: bool = False) -> None:
        """Record the exit once (LOOP-3); a later call keeps the first reason and answer."""
        if self.reason is not None:
            return
        self.reason, self.detail, self.failed = reason, detail, failed
        if answer is not None:
            self.answer = answer

    def amend_answer(self, text: str) -> None:
        """Change what is delivered for an exit already recorded (summary, footer)."""
        self.answer = text

    def fail_unanswered(self, text: str) -> None:
        """A turn with no answer at all fails, and the user is told why."""
        self.failed, self.answer = True, text

    def lose_lease(self, detail: str) -> None:
        """LEASE-4: the store fenced a write off, so another holder may own the session now.

        Whatever the turn had recorded, it ends ``interrupted`` and delivers nothing as a
        success: an answer this process can no longer make durable would contradict the
        record the new holder works from. This overrules first-reason-wins on purpose.
        """
        self.reason, self.detail, self.answer, self.failed = (
            ExitReason.INTERRUPTED, detail, None, True)

    def interrupt_summary(self, detail: str) -> None:
        """FIN-1: an interrupt during the grace call ends the turn ``interrupted``.

        The budget's reason was recorded before the summary was asked for; the stop that
        came while it was being asked for is the later, truer end, so FIN-8 does not call
        the turn a silent stop. This overrules first-reason-wins on purpose.
        """
        self.reason = ExitReason.INTERRUPTED
        self.detail = f"{self.detail}; grace call interrupted: {detail}" if self.detail else detail

    def keep_held_answer(self) -> None:
        """FIN-6: the check the verification gate asked for failed (``CHECK_FAILURE_EXITS``)
        while the gate held an answer; that answer stands (the finalizer sets it), so the
        turn did not fail. The reason stays, first-reason-wins; only the failure is
        overruled, on purpose."""
        self.failed = False

    def replace(self, reason: ExitReason, answer: str, *, failed: bool) -> None:
        """Overrule the recorded exit with a more specific truth (FIN-8's guard only)."""
        self.reason, self.answer, self.failed = reason, answer, failed

    @property
    def delivered(self) -> bool:
        """An answer with visible text reaches the user as a success."""
        return bool(self.answer and self.answer.strip()) and not self.failed

    @property
    def reason_text(self) -> str:
        return self.reason.value if self.reason is not None else "unknown"


class EventRecord(Frozen):
    """A typed record that travels as the data of one event kind, and is read back from it."""

    kind: ClassVar[EventKind]

    def event(self, session_id: str, turn_id: str) -> Event:
        return Event(session_id=session_id, turn_id=turn_id, kind=self.kind,
                     data=self.model_dump(mode="json"))

    @classmethod
    def of(cls, event: Event) -> Self:
        """Read the record back from the stream (a malformed one raises ValidationError)."""
        return cls.model_validate(event.data)


class TurnStarted(EventRecord):
    """The turn holds its lease and begins; CTX-1's session counters as this turn saw them."""

    kind: ClassVar[EventKind] = EventKind.TURN_STARTED

    lease_token: int
    user_turn: int          # this turn's place among the session's user turns
    memory_review: bool     # whether the memory review came due with this turn


class TurnOverlap(EventRecord):
    """CTX-9: a warning that this turn started before its predecessor's final persist.

    The predecessor's rows end open (a user row, an unanswered call or a tool result): it
    crashed, or it lost its lease while it still ran and was fenced off. Both turn ids are
    named, this one as the event's turn and the other here.
    """

    kind: ClassVar[EventKind] = EventKind.TURN_OVERLAP

    previous_turn_id: str


class ToolProgress(EventRecord):
    """DEL-1: one segment's results are durable (emitted only after they are)."""

    kind: ClassVar[EventKind] = EventKind.TOOL_PROGRESS

    calls: list[str]
    parallel: bool
    errors: int


class ExitLine(EventRecord):
    """FIN-7: the one turn-exit line; WARNING when the durable tail is a tool result and the
    turn was not interrupted (an interrupted turn, the user's stop or a lost lease, says why
    it rests there: its line is INFO)."""

    kind: ClassVar[EventKind] = EventKind.TURN_EXIT

    level: Literal["INFO", "WARNING"]
    reason: ExitReason
    detail: str
    api_calls: int
    max_iterations: int
    budget_used: int
    budget_max: int
    last_role: Literal["none", "system", "user", "assistant", "tool"]
    response_len: int
    cleanup_errors: int  # FIN-5 trusts the boundary row only at 0

    @classmethod
    def build(cls, ending: Ending, *, api_calls: int, max_iterations: int, budget_used: int,
              budget_max: int, tail: Message | None, cleanup_errors: int) -> ExitLine:
        if ending.reason is None:  # every path to the exit line records a reason first
            raise InvariantBroken("a turn reached its exit line without an exit reason")
        last_role = tail.role.value if tail is not None else "none"
        pending = last_role == Role.TOOL.value and ending.reason is not ExitReason.INTERRUPTED
        return cls(level="WARNING" if pending else "INFO",
                   reason=ending.reason, detail=ending.detail,
                   api_calls=api_calls, max_iterations=max_iterations, budget_used=budget_used,
                   budget_max=budget_max, last_role=last_role,
                   response_len=len(ending.answer or ""), cleanup_errors=cleanup_errors)


class Completion(EventRecord):
    """DEL-1: the completion event carries the authoritative final answer."""

    kind: ClassVar[EventKind] = EventKind.TURN_COMPLETED

    final_response: str | None
    failed: bool
    carried_input: str | None = None  # LEASE-5: the user's text, handed back


class TurnResult(Frozen):
    """What a caller gets back from one turn."""

    session_id: str
    turn_id: str
    final_response: str | None
    exit_reason: ExitReason
    exit_detail: str = ""
    api_calls: int = 0
    budget_used: int = 0
    completed: bool = False
    failed: bool = False
    failure_reason: str | None = None
    retryable: bool = False
    cleanup_errors: tuple[str, ...] = ()
    carried_input: Message | None = None  # LEASE-5: a refused turn hands its input back
