"""A sabotage: a named, reversible swap of one engine step for a plausibly broken one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sabotage:
    name: str
    invariants: tuple[str, ...]
    description: str
    patches: Callable[[], list[AbstractContextManager[Any]]]

    @contextmanager
    def applied(self) -> Iterator[None]:
        with ExitStack() as stack:
            for patch in self.patches():
                stack.enter_context(patch)
            yield


SABOTAGES: dict[str, Sabotage] = {}


def sabotage(name: str, invariants: tuple[str, ...], description: str) -> Callable[
    [Callable[[], list[AbstractContextManager[Any]]]], Callable[[], list[AbstractContextManager[Any]]]
]:
    def register(fn: Callable[[], list[AbstractContextManager[Any]]]) -> Callable[
        [], list[AbstractContextManager[Any]]
    ]:
        SABOTAGES[name] = Sabotage(name, invariants, description, fn)
        return fn
    return register
