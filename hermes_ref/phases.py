"""The phases of a turn and the only transitions between them.

Theory of operation
-------------------
A turn walks a small state machine. ``TRANSITIONS`` is the whole truth about which
phase may follow which; ``PhaseTracker.enter`` refuses anything else with
``IllegalTransition`` (an engine bug, never handled). The lifecycle diagram in
docs/lifecycle.md is generated from this table (``render_mermaid``), so the picture
cannot drift from the code.

    prologue ─► preflight ─► model_call ─► tool_round ─┐
        │           ▲  │         │  ▲                  │
        │           └──┼─────────┘  └── (retry) ───────┤
        ▼              ▼                               ▼
      done ◄──────── finalize ◄────────────────────────┘

A driver may observe phase changes (``PhaseTracker.observer``) to narrate a timeline;
observing costs nothing when nobody listens and never feeds back into the turn.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from hermes_ref.errors import IllegalTransition


class Phase(StrEnum):
    IDLE = "idle"
    PROLOGUE = "prologue"
    PREFLIGHT = "preflight"
    MODEL_CALL = "model_call"
    TOOL_ROUND = "tool_round"
    FINALIZE = "finalize"
    DONE = "done"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.IDLE: frozenset({Phase.PROLOGUE}),
    Phase.PROLOGUE: frozenset({Phase.PREFLIGHT, Phase.FINALIZE, Phase.DONE}),
    Phase.PREFLIGHT: frozenset({Phase.MODEL_CALL, Phase.FINALIZE}),
    Phase.MODEL_CALL: frozenset({Phase.TOOL_ROUND, Phase.PREFLIGHT, Phase.FINALIZE}),
    Phase.TOOL_ROUND: frozenset({Phase.PREFLIGHT, Phase.FINALIZE}),
    Phase.FINALIZE: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}

PhaseObserver = Callable[[Phase, Phase], None]


class PhaseTracker:
    """Holds the current phase of one turn and enforces the transition table."""

    __slots__ = ("observer", "phase")

    def __init__(self, observer: PhaseObserver | None = None) -> None:
        self.phase = Phase.IDLE
        self.observer = observer

    def enter(self, new: Phase) -> None:
        old = self.phase
        if new not in TRANSITIONS[old]:
            raise IllegalTransition(f"phase {old.value} cannot be followed by {new.value}")
        self.phase = new
        if self.observer is not None:
            self.observer(old, new)


def render_mermaid() -> str:
    """The transition table as a mermaid state diagram (used by the docs)."""
    lines = ["stateDiagram-v2", "    [*] --> prologue"]
    for source, targets in TRANSITIONS.items():
        if source is Phase.IDLE:
            continue
        for target in sorted(targets, key=lambda p: list(Phase).index(p)):
            lines.append(f"    {source.value} --> {target.value}")
    lines.append("    done --> [*]")
    return "\n".join(lines)
