"""Invariant predicates over what the world recorded, never over the engine's memory.

Theory of operation
-------------------
A checker reads an ``Observation``: the store's durable record (sessions, messages,
leases, the event log), the tool world's side-effect ledger, and the provider's own log
of requests and replies. None of these is the engine's say-so: the store assigns row ids
and commits, the ledger is written by the tools when they act, the call log by the
provider when it is called. A broken engine therefore cannot talk a checker round.

Some rules hold only *at rest*: a session is at rest when its turn lease is released
(durably). A crash leaves the lease held, so a half-finished tool round after a crash is
not a violation until the next turn (which must repair it) has released the lease.

Each checker returns a list of ``Violation`` values; an empty list is a pass. Every
checker registers itself in ``CHECKERS`` with the invariant ids it decides; the modules
of this package group them by stage of the turn.
"""

from __future__ import annotations

from sim.checkers import (
    admission,
    compaction,  # CMP-1..4, CMP-7, CTX-5..7, LOOP-5's overflow branch
    context,
    delivery,
    finalizer,
    intake,
    lane_restarts,  # SES-7
    lease,  # LEASE, CTX-9
    loop_fire,  # LOOP-4/5/6/8, FIN-1, FIN-4: the loop under fire
    rotation,  # CMP-5, CMP-6, LEASE-1 per lineage
    sessions,
    streaming,  # DEL-1, DEL-2, FIN-2  # SES
    tool_limits,  # TOOL-5, TOOL-7: workers, gate, deadline, spills
    tools,
    transcript,
    turn,
    wire,
    wire_cache,  # stable bytes: the prompt-cache share, rewrites (CTX-3, WIRE-1, WIRE-2)
)
from sim.checkers.base import (
    CHECKERS,
    Check,
    Checker,
    Observation,
    Violation,
    checker,
    run_all,
)
from sim.checkers.wire import align_request

__all__ = [
    "CHECKERS",
    "Check",
    "Checker",
    "Observation",
    "Violation",
    "admission",
    "align_request",
    "checker",
    "compaction",
    "context",
    "delivery",
    "finalizer",
    "intake",
    "lane_restarts",
    "lease",
    "loop_fire",
    "rotation",
    "run_all",
    "sessions",
    "streaming",
    "tool_limits",
    "tools",
    "transcript",
    "turn",
    "wire",
    "wire_cache",
]
