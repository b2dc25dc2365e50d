"""What the checkers judged during a run, for tests that compare it with the engine."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from sim.checkers.base import Observation
from sim.harness import Story


@contextmanager
def judged_observations() -> Iterator[list[Observation]]:
    """Every observation a story's checks judge while the block runs, in order: the last
    is the record as the run ended."""
    seen: list[Observation] = []
    observe = Story._observe

    def kept(story: Story) -> Any:
        obs = observe(story)
        seen.append(obs)
        return obs

    with mock.patch.object(Story, "_observe", kept):
        yield seen
