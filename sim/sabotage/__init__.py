"""Deliberately broken variants of the engine, kept here and never in the engine.

Theory of operation
-------------------
A checker is only real if a broken engine makes it fail. Each ``Sabotage`` swaps one
step of the engine for a plausible wrong version (the kind of change a hurried edit
makes: running tools before the write, forgetting a refund, writing the nudge to the
store) for the duration of a ``with`` block. ``hermes-ref invariants verify`` runs every
scenario that declares one of a sabotage's invariant ids under that sabotage and demands
that at least one of them fails; a sabotage nobody catches is a vacuous checker.

The engine reaches its steps through module attributes (``tool_round.run_tool_round``),
which is what makes the swap possible without touching engine code.
"""

from __future__ import annotations

from sim.sabotage import (
    admission,
    compaction,  # CMP-1..4, CMP-7, CTX-5..7, LOOP-5's overflow branch
    finalizer,
    intake,
    lease,  # LEASE, CTX-9
    loop,
    loop_fire,  # LOOP-4/5/6/8, FIN-1, FIN-4: the loop under fire
    paths,
    prologue,
    rotation,  # CMP-5, CMP-6, LEASE-1 per lineage
    rules,  # in-place edits of the small rules the checkers restate
    sessions,  # SES
    streaming,  # DEL-2, FIN-2
    tool_limits,  # TOOL-5, TOOL-7
    tool_round,
    wire_cache,  # stable bytes: the prompt cache, rewrites (CTX-3, WIRE-1, WIRE-2)
)
from sim.sabotage.base import SABOTAGES, Sabotage, sabotage

__all__ = ["SABOTAGES", "Sabotage", "admission", "compaction", "finalizer", "intake", "lease",
           "loop", "loop_fire", "paths", "prologue", "rotation", "rules", "sabotage", "sessions",
           "streaming", "tool_limits", "tool_round", "wire_cache"]
