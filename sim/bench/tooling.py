"""Benchmark rows of the testing tools: audit throughput and the served simulator's latency tail.

Theory of operation
-------------------
Two families of rows, each also given as a ratio to the calibration measured in the same
run (docs/performance.md sets every target on such a ratio):

* ``audit_messages_per_s``: ``sim.audit.cli.audit`` over a generated database of this
  project's schema (sessions of ten rows: user, a call, its result, an answer, and again,
  with one open turn every 1,000 sessions so the judges have something to say). The
  database is built once per run; the audit is timed ``reps`` times. Beside it,
  ``audit_scan_rows_per_s`` times the bare ``SELECT`` the reader issues, fetched and
  dropped: the ceiling no judge can beat. Ratios: the audit's share of that scan, and
  messages audited per calibration turn (audit rate / calibration turns/s).
  The default run uses ``AUDIT_MESSAGES_DEFAULT`` messages (the row says how many);
  ``HERMES_REF_AUDIT_MESSAGES=1000000`` (``nox -s audit_bench``) or
  ``python -m sim.bench.tooling_cli --messages 1000000`` measures the full size.
* ``serve_latency_ms_p50`` / ``_p99``: 20 client threads, each opening a new connection
  per request (the case a small listen backlog punishes), against the served simulator
  answering a text step in a child process; beside it (full size only) the same load
  against a server with the stdlib's backlog of 5, the diagnostic that shows why the
  backlog was raised. Ratios: p99 / p50, and p50 in
  calibration turns (p50 seconds x calibration turns/s).
"""

from __future__ import annotations

import http.client
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from hermes_ref.shell.sqlite_connect import open_connection
from sim.audit.cli import audit
from sim.serve.server import BACKLOG

AUDIT_MESSAGES_DEFAULT = 100_000
AUDIT_MESSAGES_ENV = "HERMES_REF_AUDIT_MESSAGES"
CLIENTS = 20
REQUESTS_PER_CLIENT = 15


def stat(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def build_database(path: Path, messages: int) -> None:
    """A database of ours with ``messages`` rows in sessions of ten (one open turn per 1,000)."""
    conn = open_connection(path, synchronous="OFF")
    sessions = max(1, messages // 10)
    def call(cid: str) -> str:
        return json.dumps([{"id": cid, "name": "read_file", "arguments": "{}"}])

    shape = (("user", "read it", None, None), ("assistant", "", call("a"), None),
             ("tool", "text", None, "a"), ("assistant", "done", None, None),
             ("user", "more", None, None), ("assistant", "", call("b"), None),
             ("tool", "text", None, "b"), ("assistant", "done", None, None),
             ("user", "thanks", None, None), ("assistant", "ok", None, None))
    open_tail = ("user", "again", None, None)  # every 1,000th session ends on a user row
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO sessions (id, key, platform, chat_type, system_prompt, started_at) "
        "VALUES (?, 'k', 'cli', 'dm', 'p', 0)", ((f"s{i}",) for i in range(sessions)))

    def rows() -> Any:
        for n in range(messages):
            session, k = divmod(n, 10)
            row = open_tail if k == 9 and session % 1000 == 999 else shape[k]
            yield (f"s{session}", *row)

    conn.executemany("INSERT INTO messages (session_id, role, content, tool_calls, "
                     "tool_call_id) VALUES (?, ?, ?, ?, ?)", rows())
    conn.execute("COMMIT")
    conn.close()


def _scan(path: Path) -> int:
    uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True)
    count = 0
    for _row in conn.execute("SELECT session_id, id, role, tool_calls, tool_call_id, "
                             "content IN ('a', 'b', 'c') FROM messages ORDER BY id"):
        count += 1
    conn.close()
    return count


def audit_rows(reps: int, messages: int, calibration: dict[str, float] | None,
               progress: TextIO | None = None) -> dict[str, Any]:
    """The audit rows; ``calibration`` is the run's calibration turns/s figure (or None)."""
    with tempfile.TemporaryDirectory(prefix="hermes-bench-audit-") as tmp:
        path = Path(tmp) / "audit.db"
        _say(progress, f"audit: building a database of {messages:,} messages")
        build_database(path, messages)
        rates, scans = [], []
        for _ in range(reps):
            started = time.perf_counter()
            result = audit(path)
            rates.append(result.messages / (time.perf_counter() - started))
            started = time.perf_counter()
            scans.append(_scan(path) / (time.perf_counter() - started))
        assert result.messages == messages and not result.violations
    out: dict[str, Any] = {
        "audit_messages": {"median": messages, "min": messages, "max": messages},
        "audit_messages_per_s": stat(rates),
        "audit_scan_rows_per_s": stat(scans),
    }
    out["audit_share_of_scan"] = {k: out["audit_messages_per_s"][k] / out[
        "audit_scan_rows_per_s"]["median"] for k in ("median", "min", "max")}
    if calibration:
        out["audit_messages_per_calibration_turn"] = {
            k: v / calibration["median"] for k, v in out["audit_messages_per_s"].items()}
    return out


_CHILD = """
import sys
from sim.serve import script
from sim.serve.server import SimServer, Simulator
cls = type("Bench", (SimServer,), {"request_queue_size": int(sys.argv[1])})
server = cls(("127.0.0.1", 0), Simulator(script.parse([{"text": "ok", "repeat": "always"}])))
server.start()
print(server.server_address[1], flush=True)
sys.stdin.read()
server.stop()
"""


def _load(port: int, clients: int, per_client: int) -> tuple[list[float], int]:
    """Latencies of ``clients`` threads, each opening a new connection per request, and how
    many requests the server's full backlog reset (a client whose connection is reset
    stops: the small-backlog diagnostic counts them instead of timing them)."""
    latencies: list[float] = []
    resets = 0
    lock = threading.Lock()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    def client() -> None:
        nonlocal resets
        mine = []
        for _ in range(per_client):
            started = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("POST", "/v1/chat/completions", body,
                             {"content-type": "application/json", "connection": "close"})
                response = conn.getresponse()
                response.read()
            except ConnectionError:
                with lock:
                    resets += 1
                break
            finally:
                conn.close()
            assert response.status == 200
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(latencies), resets


def _percentile_ms(values: list[float], share: float) -> float:
    return 1000 * values[min(len(values) - 1, int(share * len(values)))]


def serve_rows(calibration: dict[str, float] | None, per_client: int = REQUESTS_PER_CLIENT,
               *, diagnostic: bool = True) -> dict[str, Any]:
    """p50 and p99 latency at ``CLIENTS`` concurrent clients against a server in a child
    process (so client and server do not share one interpreter lock)."""
    out: dict[str, Any] = {}
    runs = (("serve", BACKLOG), ("serve_backlog5", 5)) if diagnostic else (("serve", BACKLOG),)
    for label, backlog in runs:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(backlog)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline())
            latencies, resets = _load(port, CLIENTS, per_client)
        finally:
            child.communicate("", timeout=30)
        out[f"{label}_resets"] = {"median": resets, "min": resets, "max": resets}
        for pct, share in (("p50", 0.50), ("p99", 0.99)):
            value = _percentile_ms(latencies, share)
            out[f"{label}_latency_ms_{pct}"] = {"median": value, "min": value, "max": value}
    p50, p99 = out["serve_latency_ms_p50"]["median"], out["serve_latency_ms_p99"]["median"]
    out["serve_p99_over_p50"] = {"median": p99 / p50, "min": p99 / p50, "max": p99 / p50}
    if calibration:
        turns = p50 / 1000 * calibration["median"]
        out["serve_p50_in_calibration_turns"] = {"median": turns, "min": turns, "max": turns}
    return out


def rows(sizes: Any, report: dict[str, Any], progress: TextIO | None = None) -> dict[str, Any]:
    """Every row of this module, for ``sim.bench.runner.measure`` (one line there)."""
    full = sizes.name == "full"
    messages = int(os.environ.get(AUDIT_MESSAGES_ENV, "0") or 0) or (
        AUDIT_MESSAGES_DEFAULT if full else 5_000)
    calibration = report.get("calibration_turns_per_s")
    reps = max(1, min(3, sizes.reps))
    out = audit_rows(reps, messages, calibration, progress)
    _say(progress, "serve latency at 20 clients")
    out.update(serve_rows(calibration, REQUESTS_PER_CLIENT if full else 3, diagnostic=full))
    return out


LABELS = (
    ("audit_messages", "messages in the generated database (full size: 1,000,000)"),
    ("audit_messages_per_s", "hermes-ref audit, whole run (open, read, judge)"),
    ("audit_scan_rows_per_s", "the reader's bare SELECT, fetched and dropped"),
    ("audit_share_of_scan", "audit msgs/s / scan rows/s"),
    ("audit_messages_per_calibration_turn", "audit msgs/s / calibration turns/s"),
    ("serve_latency_ms_p50", "sim serve, 20 clients, new connection per request"),
    ("serve_latency_ms_p99", ""),
    ("serve_p99_over_p50", "the tail, as a ratio"),
    ("serve_p50_in_calibration_turns", "p50 s x calibration turns/s"),
    ("serve_backlog5_latency_ms_p50", "diagnostic: the same with the stdlib backlog of 5"),
    ("serve_backlog5_latency_ms_p99", ""),
)


def lines(report: dict[str, Any]) -> list[str]:
    """The rows as table lines, for ``sim.bench.render`` (one line there)."""
    out = ["testing tools (sim.bench.tooling):"]
    for name, how in LABELS:
        stat = report.get(name)
        if stat is not None:
            out.append(f"  {name:<38} {stat['median']:>12,.2f} [{stat['min']:,.2f} - "
                       f"{stat['max']:,.2f}]  {how}")
    return out


def _say(progress: TextIO | None, message: str) -> None:
    if progress is not None:
        progress.write(f"bench: {message}\n")
        progress.flush()
