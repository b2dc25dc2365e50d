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


@contextmanager
def edited_in_place(module: Any, name: str, old: str, new: str) -> Iterator[None]:
    """``module.name`` with ``old`` replaced by ``new`` in its own body, for the block.

    ``one_line_changed`` builds a new function, which reaches only the callers that look
    it up on ``module``; a module that imported the function by name keeps the intact one.
    An engineer's edit reaches every holder, so this swaps the function's code object
    instead: whoever holds the function, the engine's modules and any checker that
    borrowed it, runs the broken line. That is how a sabotage shows that a checker does
    not share the engine's deciding function.
    """
    function = getattr(module, name)
    intact = function.__code__
    function.__code__ = one_line_changed(module, name, old, new).__code__
    try:
        yield
    finally:
        function.__code__ = intact
