"""What the explored stories share (a module whose name starts with ``_`` holds no stories)."""

from __future__ import annotations

from sim.explore.run import calm_phase
from sim.harness import Story


def calm(s: Story) -> None:
    """Run the story's actors out, then the explorer's calm phase (faults off: recover,
    reconcile, drain until done), and demand that every admission reached a terminal state."""
    s.run_all()
    stuck = calm_phase(s)
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")
