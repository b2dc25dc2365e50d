"""A sabotage: a named, reversible swap of one engine step for a plausibly broken one."""

from __future__ import annotations

import inspect
import textwrap
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


def one_line_changed(module: Any, name: str, old: str, new: str) -> Any:
    """``module.name`` rebuilt from its own source with ``old`` replaced by ``new`` (which
    must occur once), in the module's namespace: the engine's step with one line broken."""
    source = textwrap.dedent(inspect.getsource(getattr(module, name)))
    if source.count(old) != 1:
        raise RuntimeError(f"{module.__name__}.{name} no longer holds {old!r} once")
    namespace: dict[str, Any] = {}
    exec(compile(source.replace(old, new), inspect.getfile(module), "exec"),
         vars(module), namespace)
    return namespace[name]
