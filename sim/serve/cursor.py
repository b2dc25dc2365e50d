"""Which route a request belongs to and which step answers it; what was used and left.

Theory of operation
-------------------
``Cursor.take(view)`` is the one decision, made under a lock because the server answers
from many threads. The first declared route whose ``match`` holds owns the request, else
the main route. Within a route the steps are played in order, each for its ``repeat``
count (``"always"`` never runs out). A route that has run out answers with its own
``when_exhausted``, else the script's; with neither, the request is *past the end*: the
server answers 500 and counts a harness error.

``Cursor.report()`` is the summary's raw material: per route, the steps consumed and the
steps never (or not fully) used, and the requests that came past the end. A script is
*consumed exactly* when no step is left (an ``always`` step is never left: it answers
any number of requests, none included) and no request came past the end or was
answered by ``when_exhausted``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sim.serve.request import View
from sim.serve.script import Route, Script, Step


@dataclass(frozen=True)
class Taken:
    """The step that answers a request (None: past the end) and where it came from."""

    route: str
    step: Step | None
    seq: int  # 0-based count of requests taken so far, across routes
    overflow: bool = False  # answered by when_exhausted, or past the end


@dataclass
class _Queue:
    route: Route
    position: int = 0
    used: int = 0  # requests answered by the step at ``position``
    overflow: int = 0
    used_steps: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Report:
    consumed: tuple[str, ...]
    unused: tuple[str, ...]
    overflow: dict[str, int]
    requests: int

    @property
    def exact(self) -> bool:
        return not self.unused and not any(self.overflow.values())


def matches(route: Route, view: View) -> bool:
    """Whether a request belongs to a declared route."""
    for key, wanted in route.match:
        if key == "tools" and view.has_tools is not wanted:
            return False
        if key == "stream" and view.stream is not wanted:
            return False
        if key == "model" and view.model != wanted:
            return False
        if key == "last_user_contains" and str(wanted) not in view.last_user_text:
            return False
    return True


class Cursor:
    """The script's position, shared by every handler thread."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self._queues = [_Queue(r) for r in script.routes]
        self._lock = threading.Lock()
        self._seq = 0

    def take(self, view: View) -> Taken:
        with self._lock:
            seq = self._seq
            self._seq += 1
            queue = next((q for q in self._queues[:-1] if matches(q.route, view)),
                         self._queues[-1])
            step = self._advance(queue)
            if step is not None:
                return Taken(queue.route.name, step, seq)
            queue.overflow += 1
            fallback = queue.route.when_exhausted or self.script.when_exhausted
            return Taken(queue.route.name, fallback, seq, overflow=True)

    @staticmethod
    def _advance(queue: _Queue) -> Step | None:
        steps = queue.route.steps
        if queue.position >= len(steps):
            return None
        step = steps[queue.position]
        if queue.used == 0:
            queue.used_steps.append(step.label)
        queue.used += 1
        if step.repeat is not None and queue.used >= step.repeat:
            queue.position += 1
            queue.used = 0
        return step

    @property
    def remaining(self) -> int:
        """Steps not yet started or not fully repeated (``always`` steps never count)."""
        return len(self.report().unused)

    def report(self) -> Report:
        with self._lock:
            consumed: list[str] = []
            unused: list[str] = []
            for queue in self._queues:
                consumed += queue.used_steps
                for i, step in enumerate(queue.route.steps[queue.position:], queue.position):
                    started = i == queue.position and queue.used > 0
                    if step.repeat is None:
                        continue  # "always" answers any number of requests, none included
                    left = (step.repeat or 1) - (queue.used if started else 0)
                    unused.append(step.label if left == (step.repeat or 1)
                                  else f"{step.label} ({left} of {step.repeat} left)")
            overflow = {q.route.name: q.overflow for q in self._queues if q.overflow}
            return Report(tuple(consumed), tuple(unused), overflow, self._seq)
