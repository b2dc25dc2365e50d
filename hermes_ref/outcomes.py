"""How a turn ends: the closed set of exit reasons and the result value.

Every exit from the main loop records one ``ExitReason`` (LOOP-3). The set is closed:
adding a reason means adding it here, where the docs and the checkers read it.
"""

from __future__ import annotations

from enum import StrEnum

from hermes_ref.models import Frozen, Message


class ExitReason(StrEnum):
    TEXT_RESPONSE = "text_response"
    MAX_ITERATIONS = "max_iterations_reached"
    BUDGET_EXHAUSTED = "budget_exhausted"
    INTERRUPTED = "interrupted"
    COMPRESSION_TIMEOUT = "context_compression_timeout"
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
})

# Failures caused by context pressure: FIN-5 adds no boundary row after these.
CONTEXT_PRESSURE_EXITS = frozenset({ExitReason.COMPRESSION_TIMEOUT})


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
    interrupted: bool = False
    failure_reason: str | None = None
    retryable: bool = False
    cleanup_errors: tuple[str, ...] = ()
    carried_input: Message | None = None  # LEASE-5: a refused turn hands its input back
