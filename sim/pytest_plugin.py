"""A pytest plugin for testing your own agent against the simulator (entry point ``pytest11``).

Theory of operation
-------------------
Installing hermes-ref registers this module with pytest, so any project's tests get:

* ``served_sim``: a factory fixture, ``served_sim(script, journal=True)``, that serves a
  script (a list of steps, a script object, or a path) over HTTP on 127.0.0.1 and returns
  a ``ServedSim``: ``url`` (give it to your agent as its base URL), ``records`` (the
  journal), ``journal_path`` and ``report()`` (steps consumed and unused). Every server is
  stopped at teardown.
* ``sim_transport``: ``sim_transport(script)`` returns a ``ServedSim`` whose ``transport``
  is an ``httpx.MockTransport`` answering in process (no socket, pauses skipped);
* ``sim_respx``: ``sim_respx(script, base_url)`` mounts the same answers on respx for
  every URL under ``base_url`` (respx must be installed);
* ``fault_steps()`` and ``scripts()``: the fault catalogue as hypothesis strategies of
  script steps and whole scripts (hypothesis must be installed);
* ``assert_audit_clean(path, strict=False)``: audit a transcript database and fail the
  test with every finding, one per line.

Nothing here starts anything until a fixture is used; the module imports no test tool at
import time, so it costs nothing in a project that does not use it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sim.serve import script as script_file
from sim.serve.cursor import Report
from sim.serve.journal import Journal, open_journal
from sim.serve.server import SimServer, Simulator, start
from sim.serve.strategies import fault_steps, scripts

__all__ = ["ServedSim", "assert_audit_clean", "fault_steps", "scripts"]


@dataclass
class ServedSim:
    simulator: Simulator
    url: str
    server: SimServer | None = None
    journal_path: Path | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        """The journal so far, once every request in flight has been journaled."""
        self.simulator.settle()
        return self.simulator.journal.records

    def report(self) -> Report:
        self.simulator.settle()
        return self.simulator.cursor.report()

    @property
    def transport(self) -> Any:
        return self.simulator.transport()


def _script(script: object) -> script_file.Script:
    if isinstance(script, script_file.Script):
        return script
    if isinstance(script, str | Path):
        return script_file.load(script)
    return script_file.parse(json.loads(json.dumps(script)), "script")


@pytest.fixture
def served_sim(tmp_path: Path) -> Iterator[Any]:
    """Serve scripts over HTTP on 127.0.0.1; ``served_sim(script, journal=True)``."""
    running: list[tuple[SimServer, Journal]] = []

    def serve(script: object, journal: bool = True) -> ServedSim:
        path = tmp_path / f"journal-{len(running)}.jsonl" if journal else None
        log = Journal(open_journal(path) if path else None)
        simulator = Simulator(_script(script), log)
        server = start(simulator)
        running.append((server, log))
        return ServedSim(simulator, server.url, server, path)

    yield serve
    for server, log in running:
        server.stop()
        log.close()


@pytest.fixture
def sim_transport() -> Any:
    """In-process answers: ``sim_transport(script).transport`` is an httpx.MockTransport."""
    def make(script: object) -> ServedSim:
        return ServedSim(Simulator(_script(script)), "http://sim.test/v1")

    return make


@pytest.fixture
def sim_respx() -> Iterator[Any]:
    """Mount a script on respx: ``sim_respx(script, base_url="http://sim.test/v1")``."""
    import respx

    with respx.mock(assert_all_called=False) as router:
        def mount(script: object, base_url: str = "http://sim.test/v1") -> ServedSim:
            simulator = Simulator(_script(script))
            router.route(url__startswith=base_url.rstrip("/") + "/").mock(
                side_effect=simulator.httpx_handler)
            return ServedSim(simulator, base_url)

        yield mount


def assert_audit_clean(path: str | Path, *, strict: bool = False) -> None:
    """Fail with every finding when the database at ``path`` breaks an invariant."""
    from sim.audit.cli import audit

    result = audit(path)
    if result.failed(strict):
        lines = "\n".join(f.line() for f in result.findings)
        raise AssertionError(f"{result.summary()}\n{lines}")
