"""The served simulator on a socket, and the same answers in process.

Theory of operation
-------------------
``Simulator.answer`` is transport-neutral: a method, a path and a body in, a ``Plan``
(``sim.serve.wire``) and the journal's fields out. Two players play a plan:

* ``SimServer``, a ``ThreadingHTTPServer`` with a listen backlog of ``BACKLOG`` (the
  stdlib's 5 made a 1 s tail at 20 clients: refused SYNs are retried after a second),
  one ``sim.serve.handler.Handler`` per connection (bounded reads, chunked streams);
* ``Simulator.httpx_handler``: an ``httpx`` handler for ``MockTransport`` or respx, where a
  stall is ``httpx.ReadTimeout``, a cut ``httpx.RemoteProtocolError`` and pauses are
  skipped (in process there is no wall clock worth waiting on).

``start`` binds (loopback by default) and turns every bind failure (a busy port, a host
that is no address of this machine, a port out of range) into a one-line ``BadInput``.
``stop`` releases stalled handlers at once, then closes the socket.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from hermes_ref.errors import BadInput
from sim.serve import wire
from sim.serve.cursor import Cursor
from sim.serve.handler import Handler
from sim.serve.journal import Journal, body_value, masked
from sim.serve.prefix import PrefixCache
from sim.serve.request import Refusal, read
from sim.serve.script import Reply, Script

BACKLOG = 1024
BODY_MAX_BYTES = 32 * 1024 * 1024


class Simulator:
    """A script, its cursor, its journal and the clock; answers one request at a time."""

    def __init__(self, script: Script, journal: Journal | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.script = script
        self.cursor = Cursor(script)
        self.prompt_cache = PrefixCache()
        self.journal = journal or Journal(None)
        self.harness_errors: list[str] = []
        self._clock = clock
        self._start = clock()
        self._last_arrival: float | None = None
        self._arrivals = 0
        self.in_flight = 0
        self._last_activity = self._start
        self._lock = threading.Lock()

    def idle_s(self) -> float:
        """Seconds since the last request arrived (since the start if none came), or 0.0
        while one is in flight."""
        with self._lock:
            if self.in_flight:
                return 0.0
            return self._clock() - self._last_activity

    def arrive(self) -> dict[str, Any]:
        """The arrival fields of a journal record (``seq``, ``at_s``, ``gap_s``)."""
        with self._lock:
            now = self._clock()
            gap = None if self._last_arrival is None else round(now - self._last_arrival, 6)
            self._last_arrival = now
            self._arrivals += 1
            self.in_flight += 1
            return {"seq": self._arrivals - 1, "at_s": round(now - self._start, 6),
                    "gap_s": gap, "_t0": now}

    def answer(self, method: str, path: str, body: bytes) -> tuple[wire.Plan, dict[str, Any]]:
        route = urlsplit(path).path.rstrip("/")
        if method == "GET" and route == "/v1/models":
            return wire.models_plan(self.script, None), {}
        if method == "GET" and route.startswith("/v1/models/") and len(route) > len("/v1/models/"):
            # a model id may hold a slash (org/model), sent as is or percent-encoded
            return wire.models_plan(self.script, unquote(route[len("/v1/models/"):])), {}
        if method != "POST" or route != "/v1/chat/completions":
            return wire.not_found_plan(method, path), {}
        view = read(body)
        if isinstance(view, Refusal):
            return wire.refusal_plan(view), {"refused": view.message}
        taken = self.cursor.take(view)
        fields: dict[str, Any] = {"route": taken.route, "unknown": list(view.unknown)}
        if taken.step is None:
            message = (f"harness error: the script's {taken.route!r} route is used up "
                       f"(request #{taken.seq}, last user message "
                       f"{view.last_user_text[:80]!r})")
            self.harness_errors.append(message)
            return wire.harness_plan(message), {**fields, "step": None, "past_end": True}
        fields.update(step=taken.step.label, past_end=taken.overflow)
        ids = wire.Ids(self.script.seed, taken.seq)
        # only an answered request is remembered: an error reply leaves nothing cached
        shared = self.prompt_cache.observe(view) if isinstance(taken.step.answer, Reply) else 0
        return wire.plan(taken.step, view, ids, self.script, taken.seq, shared), fields

    def record(self, arrival: dict[str, Any], method: str, path: str,
               headers: list[tuple[str, str]], body: bytes, plan: wire.Plan,
               fields: dict[str, Any], outcome: str) -> None:
        t0 = arrival.pop("_t0")
        self.journal.write({
            **arrival, "method": method, "path": path, "headers": masked(headers),
            "body": body_value(body) if body else None, **fields, "status": plan.status,
            "outcome": outcome, "reply": plan.summary,
            "duration_s": round(self._clock() - t0, 6),
        })
        with self._lock:  # after the write: settle() means every record is in the journal
            self.in_flight -= 1
            self._last_activity = self._clock()

    def settle(self, timeout_s: float = 5.0) -> bool:
        """Wait until no request is in flight (a client may read its answer before the
        handler has journaled it); False if one still is after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self.in_flight:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def httpx_handler(self, request: httpx.Request) -> httpx.Response:
        """Answer an httpx request in process (``httpx.MockTransport`` or respx)."""
        arrival = self.arrive()
        body = request.content
        plan, fields = self.answer(request.method, request.url.raw_path.decode(), body)
        kinds = {a.kind for a in plan.actions}
        outcome = "stall" if plan.status == 0 else "cut" if "cut" in kinds else "answered"
        self.record(arrival, request.method, request.url.raw_path.decode(),
                    list(request.headers.items()), body, plan, fields, outcome)
        if plan.status == 0:
            raise httpx.ReadTimeout("the simulator did not answer", request=request)
        if "cut" in kinds:
            raise httpx.RemoteProtocolError("the simulator dropped the connection mid-body",
                                            request=request)
        return httpx.Response(plan.status, headers=list(plan.headers), content=plan.body)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.httpx_handler)


class SimServer(ThreadingHTTPServer):
    """A threaded HTTP/1.1 server in front of a ``Simulator``."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], simulator: Simulator, *,
                 body_timeout_s: float = 10.0, body_max_bytes: int = BODY_MAX_BYTES) -> None:
        super().__init__(address, Handler)
        self.simulator = simulator
        self.body_timeout_s = body_timeout_s
        self.body_max_bytes = body_max_bytes
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        text = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{text}]" if ":" in text else text
        return f"http://{shown}:{port}/v1"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,),
                                        name="sim-serve", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Release stalled handlers, stop accepting, close, and let answers in flight be
        journaled (for up to a second)."""
        self.stopping.set()
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join()
        self.simulator.settle(1.0)


class _Server6(SimServer):
    address_family = socket.AF_INET6


def start(simulator: Simulator, host: str = "127.0.0.1", port: int = 0,
          **options: Any) -> SimServer:
    """Bind and serve in a daemon thread; ``BadInput`` for any bind failure."""
    if not 0 <= port <= 65535:
        raise BadInput(f"port {port} is out of range: a port is from 0 to 65535")
    cls = _Server6 if ":" in host else SimServer
    try:
        server = cls((host, port), simulator, **options)
    except socket.gaierror as exc:
        raise BadInput(f"host {host!r} is not a known host or address: {exc.strerror}") from exc
    except OSError as exc:
        reasons = {errno.EADDRINUSE: "the port is busy (address already in use)",
                   errno.EADDRNOTAVAIL: "not an address of this machine",
                   errno.EACCES: "permission denied (ports below 1024 need privileges)"}
        reason = reasons.get(exc.errno or 0, exc.strerror or str(exc))
        raise BadInput(f"cannot listen on {host}:{port}: {reason}") from exc
    server.start()
    return server
