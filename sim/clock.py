"""A virtual clock: time moves only when the simulation says so.

``sleep`` and tool durations advance it instantly, so a 30-minute lease wait costs no
wall time and every run of a seed sees the same timestamps.
"""

from __future__ import annotations

DEFAULT_EPOCH_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z: a fixed start, so snapshots are stable


class VirtualClock:
    __slots__ = ("_now",)

    def __init__(self, start_s: float = DEFAULT_EPOCH_S) -> None:
        self._now = start_s

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"the clock cannot go back ({seconds} s)")
        self._now += seconds
