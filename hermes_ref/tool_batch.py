"""The rules of one concurrent tool batch: workers, start order, deadline (TOOL-5).

Theory of operation
-------------------
A segment of calls is run by a driver (the simulator on its virtual clock, the asyncio
driver with threads), but what the run must respect is decided here, once, as plain
functions over ``BatchBounds`` so both drivers obey the same words and a checker can
quote them. Times are seconds since the batch began (``t = 0``).

* **Workers.** At most ``workers(n) = min(workers_max, n)`` calls run at once. The pool
  hands a free worker to the waiting calls in call order; a call holding a worker is
  *ready*.
* **Start order.** A ready call starts only once every earlier call of the batch has
  started ("started" means its work has begun: a call that is slow to begin, waiting
  for an approval or a lock, holds back those after it). It never waits for that longer
  than the gate, ``gate_s = min(start_gate_s, deadline_s / 2)``, counted from when it
  became ready; past the gate it starts out of order (``may_start``). So a wedged call
  delays the calls behind it by at most the gate, never starves them.
* **Deadline.** A call's result counts only if it ended by ``deadline_s`` (``counts``).
  A call still running at the deadline gets a timed-out result in place, disposition
  ``unknown`` (it may have acted); a call that never started gets one with disposition
  ``none`` (``timed_out``). Every call thus has exactly one result (TOOL-3).
* **Order of results.** A driver may hand results back in any order (the simulator's
  come as they finished); the tool round puts them in call order (``tool_round``).
* **The lease (LEASE-4).** The store cannot fence a tool run, so before the batch begins
  the driver asks it whether the turn's lease still holds. That answer is good for the
  instant it was given: a call that begins later (it waited for a worker, the gate or its
  own start) is vouched for again as it begins (``vouch_again``), because a process frozen
  in between may wake past its lease before its refresher has noticed. A call the store
  no longer vouches for never begins: the turn is interrupted, as a failed refresh would.

The catalog's figures are the defaults (``Limits.tool_workers_max`` 8,
``tool_batch_deadline_s`` 420, ``tool_start_gate_s`` 120), and the tool round puts the
turn's bounds on every ``ExecuteTools`` effect. A driver configured with tighter bounds
of its own (an operator's ceiling) applies the tighter of the two (``tighter``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hermes_ref.models import ToolCall, ToolResult

TIMED_OUT_MARK = "timed out after"  # both timed-out wordings contain it; checkers look for it
NOT_STARTED_MARK = "before it started"


@dataclass(frozen=True, slots=True)
class BatchBounds:
    """The bounds of one batch; see the module docstring."""

    workers_max: int = 8
    deadline_s: float = 420.0
    start_gate_s: float = 120.0

    def __post_init__(self) -> None:
        if self.workers_max < 1:
            raise ValueError(f"workers_max must be at least 1, got {self.workers_max}")
        if self.deadline_s <= 0 or self.start_gate_s < 0:
            raise ValueError("the batch deadline must be positive and the start gate not negative")

    @property
    def gate_s(self) -> float:
        """How long a ready call waits for the earlier calls to start, at most."""
        return min(self.start_gate_s, self.deadline_s / 2)

    def workers(self, calls: int) -> int:
        """How many calls of a batch of ``calls`` may run at once."""
        return max(1, min(self.workers_max, calls))

    def tighter(self, workers_max: int, deadline_s: float) -> BatchBounds:
        """These bounds, tightened by a driver's own ceiling."""
        return BatchBounds(min(self.workers_max, workers_max), min(self.deadline_s, deadline_s),
                           self.start_gate_s)


def may_start(ready_s: float, now_s: float, earlier_started: bool, bounds: BatchBounds) -> bool:
    """Start order with a bounded wait: every earlier call started, or the gate expired."""
    return earlier_started or now_s - ready_s >= bounds.gate_s


def release_s(ready_s: float, bounds: BatchBounds) -> float:
    """When the gate lets a call ready at ``ready_s`` start whatever the others do."""
    return ready_s + bounds.gate_s


def vouch_again(begins_s: float) -> bool:
    """Must the lease be vouched for again before a call that begins ``begins_s`` into the
    batch? Every call but one that begins at the very instant the batch was vouched for.
    On the virtual clock that instant is exact; the asyncio driver measures ``begins_s`` on
    a monotonic clock, where every call begins after it, so each is vouched for again."""
    return begins_s > 0.0


def gives_up_at(bounds: BatchBounds) -> float:
    """When the batch stops waiting: what has not ended by then is cut (the deadline)."""
    return bounds.deadline_s


def counts(ended_s: float, bounds: BatchBounds) -> bool:
    """Does a result that ended ``ended_s`` into the batch count? (the deadline)"""
    return ended_s <= gives_up_at(bounds)


def timed_out(call: ToolCall, bounds: BatchBounds, *, started: bool) -> ToolResult:
    """The result in place of a call the deadline cut off (TOOL-3: every call gets one)."""
    limit = f"{bounds.deadline_s:g}s"
    if started:
        content = f"{call.name} {TIMED_OUT_MARK} {limit}; its effects are unknown"
        return ToolResult(call_id=call.id, name=call.name, content=content,
                          is_error=True, disposition="unknown")
    content = f"{call.name} {TIMED_OUT_MARK} {limit} {NOT_STARTED_MARK}; it did not run"
    return ToolResult(call_id=call.id, name=call.name, content=content,
                      is_error=True, disposition="none")


def is_timed_out(content: str | None, bounds: BatchBounds) -> bool:
    """Is this result text the batch deadline's own (``timed_out``)?"""
    return content is not None and f"{TIMED_OUT_MARK} {bounds.deadline_s:g}s" in content
