"""The lease checkers on stories no scenario tells: they judge the record, not the story."""

from __future__ import annotations

from pathlib import Path

from sim.harness import Story
from sim.provider import text


def test_a_waiter_stalled_past_its_place_is_not_passed_over(tmp_path: Path) -> None:
    """A waiter whose process stalls for longer than two polls loses its place; the turn
    that asks meanwhile and gets the lease did not jump the queue (LEASE-1)."""
    s = Story(store_kind="memory", workdir=tmp_path)
    s.script(text("A."), text("C."), text("B."))
    first, waiting, later = s.main_process(), s.process(), s.process()
    s.delay_reply(1, 40.0)
    s.start_turn("a", process=first)
    s.start_turn("b", process=waiting, after_s=1.0)
    s.stall(waiting, 100.0, after_s=3.0)
    s.start_turn("c", process=later, after_s=50.0)
    s.run_all()
    assert s.violations == []
