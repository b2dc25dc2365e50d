"""One connection of the served simulator: read a request safely, play its plan.

Theory of operation
-------------------
``Handler`` is the ``BaseHTTPRequestHandler`` of ``SimServer``, speaking HTTP/1.1 with
keep-alive. Reading is bounded so that no request can hang or exhaust a thread: a
``Content-Length`` that is not a non-negative integer is a 400, one above the server's
``body_max_bytes`` a 413 (nothing is read), and a body that does not arrive within
``body_timeout_s`` a 400; each closes the connection. A chunked request body is read
chunk by chunk under the same limits.

Playing a plan (``sim.serve.wire``): the status and headers, then each action in turn.
A stream goes out with chunked transfer encoding, one chunk per event, so a *cut*
(``shutdown`` of the socket before the last chunk) is an incomplete body to any client,
never a clean end. Pauses and stalls wait on the server's ``stopping`` event, so
stopping the server releases them at once. A client that leaves first is noted as
``gone``. The simulator journals every request after its plan is played.
"""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from sim.serve import wire
from sim.serve.request import Refusal

if TYPE_CHECKING:
    from sim.serve.server import SimServer


class Handler(BaseHTTPRequestHandler):
    server: SimServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")  # the API's 404 in JSON, not the stdlib's HTML 501

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_OPTIONS(self) -> None:
        self._serve("OPTIONS")

    def handle_one_request(self) -> None:
        """A client that resets or drops its connection between requests ends it quietly."""
        try:
            super().handle_one_request()
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            self.close_connection = True

    def _serve(self, method: str) -> None:
        simulator = self.server.simulator
        arrival = simulator.arrive()
        body: bytes | Refusal = b""
        plan: wire.Plan | None = None
        fields: dict[str, Any] = {}
        outcome = "failed"
        try:  # whatever happens, the request is journaled and no longer counts as in flight
            body = self._read_body()
            if isinstance(body, Refusal):
                plan, fields = wire.refusal_plan(body), {"refused": body.message}
                self.close_connection = True
                body = b""
            else:
                plan, fields = simulator.answer(method, self.path, body)
            outcome = self._play(plan)
        finally:
            shown = plan if plan is not None else wire.refusal_plan(
                Refusal("The request could not be read."))
            simulator.record(arrival, method, self.path, list(self.headers.items()),
                             body if isinstance(body, bytes) else b"", shown, fields, outcome)

    def _read_body(self) -> bytes | Refusal:
        raw = self.headers.get("content-length")
        if raw is None:
            return self._read_chunked() if "chunked" in self.headers.get(
                "transfer-encoding", "").lower() else b""
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            return Refusal(f"Invalid Content-Length header: {raw[:40]!r}.")
        if length > self.server.body_max_bytes:
            return Refusal(f"Request too large: {length} bytes, the limit is "
                           f"{self.server.body_max_bytes}.", status=413)
        return self._read_exactly(length)

    def _read_exactly(self, length: int) -> bytes | Refusal:
        self.connection.settimeout(self.server.body_timeout_s)
        try:
            data = self.rfile.read(length)
        except (TimeoutError, OSError):
            data = b""
        finally:
            self.connection.settimeout(None)
        if len(data) < length:
            return Refusal(f"The body ended after {len(data)} of the {length} bytes its "
                           "Content-Length announced.")
        return data

    def _read_chunked(self) -> bytes | Refusal:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(100)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                return Refusal("Invalid chunked request body.")
            if size < 0:  # int() takes a sign; a chunk size never has one
                return Refusal("Invalid chunked request body.")
            total += size
            if total > self.server.body_max_bytes:
                return Refusal("Request too large.", status=413)
            if size == 0:
                self.rfile.readline(100)
                return b"".join(parts)
            chunk = self._read_exactly(size + 2)
            if isinstance(chunk, Refusal):
                return chunk
            parts.append(chunk[:-2])

    def _play(self, plan: wire.Plan) -> str:
        """Send a plan; the outcome the journal records (answered, stall, cut, gone)."""
        stopping = self.server.stopping
        try:
            if plan.status == 0:  # never answer
                stopping.wait(plan.actions[0].seconds)
                self.close_connection = True
                return "stall"
            self.send_response(plan.status)
            for name, value in plan.headers:
                self.send_header(name, value)
            cut = any(a.kind == "cut" for a in plan.actions)
            if plan.streamed:
                self.send_header("transfer-encoding", "chunked")
            elif not cut:
                self.send_header("content-length", str(len(plan.body)))
            self.end_headers()
            for action in plan.actions:
                if action.kind in ("sleep", "stall"):
                    self.wfile.flush()
                    stopping.wait(action.seconds)
                elif action.kind == "send":
                    self._send(action.data, plan.streamed)
                elif action.kind == "cut":
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return "cut"
            if plan.streamed:
                self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return "gone"  # the client left first (its timeout, say)
        return "answered"

    def _send(self, data: bytes, chunked: bool) -> None:
        if chunked:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        else:
            self.wfile.write(data)
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the journal is the record of requests, not an access log."""
