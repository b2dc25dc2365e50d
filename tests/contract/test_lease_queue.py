"""The lease queue's table in SQLite has no foreign key; these tests pin down why it needs none.

``lease_waiters`` rows are written only by ``sqlite_leases.take``: a place is (re)written
when the asker is refused, which needs a live lease (so a session row, by the lease's own
foreign key) or an earlier waiter of the same session. By induction no place ever names a
session the file does not hold, and a session's first grant (``take(new_session=True)``)
may skip reading the lease, the grant history and the queue. The property test plays any
history of asks, polls, openings, releases and leaves on sessions that exist and sessions
that do not, and checks both halves: no orphan place, and a store that always reads
(the fast path turned off) ends in the very same file.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_ref.errors import PersistenceError
from hermes_ref.models import SessionRecord
from hermes_ref.shell import sqlite_leases
from sim.sqlite_store import SqliteStore

SESSIONS = ("s1", "s2", "s3")
HOLDERS = ("h1", "h2", "h3")
TTL_S, POLL_S = 30.0, 1.0

asks = st.tuples(st.just("ask"), st.sampled_from(SESSIONS), st.sampled_from(HOLDERS),
                 st.sampled_from((0.0, POLL_S)))
opens = st.tuples(st.just("open"), st.sampled_from(SESSIONS), st.sampled_from(HOLDERS),
                  st.sampled_from((0.0, POLL_S)), st.booleans())
others = st.tuples(st.sampled_from(("release", "leave")), st.sampled_from(SESSIONS),
                   st.sampled_from(HOLDERS))
advances = st.tuples(st.just("advance"), st.sampled_from((0.5, 5.0, 40.0)))
histories = st.lists(st.one_of(asks, opens, others, advances), max_size=25)


def _record(sid: str) -> SessionRecord:
    return SessionRecord(id=sid, key=f"key-{sid}", system_prompt="be brief", started_at=0.0)


def _play(path: Path, history: list[tuple[Any, ...]]) -> None:
    now = 0.0
    store = SqliteStore(path, synchronous="OFF", clock=lambda: now)
    held: dict[tuple[str, str], Any] = {}
    try:
        for op in history:
            if op[0] == "advance":
                now += op[1]
                continue
            sid, holder = op[1], op[2]
            try:
                if op[0] == "ask":
                    lease = store.acquire_lease(sid, holder, now, TTL_S, op[3])
                elif op[0] == "open":
                    lease = store.open_turn(_record(sid), holder, now, TTL_S, op[3],
                                            create=op[4]).lease
                elif op[0] == "release":
                    lease = held.pop((sid, holder), None)
                    if lease is not None:
                        store.release_lease(lease)
                    continue
                else:
                    store.leave_lease_queue(sid, holder)
                    continue
            except PersistenceError:
                continue  # a missing session, refused: it must have written nothing
            if lease is not None:
                held[(lease.session_id, holder)] = lease
    finally:
        store.close()


def _tables(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
                for table in ("sessions", "turn_leases", "lease_grants", "lease_waiters")}
    finally:
        conn.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories)
def test_no_place_in_the_queue_names_a_missing_session(history: list[tuple[Any, ...]]) -> None:
    """Every place in ``lease_waiters`` belongs to a session the file holds."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "db.sqlite"
        _play(path, history)
        tables = _tables(path)
    known = {row[0] for row in tables["sessions"]}
    assert {row[0] for row in tables["lease_waiters"]} <= known


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories)
def test_a_first_grant_that_skips_its_reads_ends_in_the_same_file(
        history: list[tuple[Any, ...]]) -> None:
    """``take(new_session=True)`` writes exactly what reading the lease, the grant history
    and the queue first would have written."""
    fast = sqlite_leases.take
    with tempfile.TemporaryDirectory() as directory, pytest.MonkeyPatch.context() as patch:
        _play(Path(directory) / "fast.sqlite", history)

        def always_read(*args: Any, **kwargs: Any) -> int | None:
            kwargs["new_session"] = False
            return fast(*args, **kwargs)
        patch.setattr(sqlite_leases, "take", always_read)
        _play(Path(directory) / "read.sqlite", history)
        assert _tables(Path(directory) / "fast.sqlite") == _tables(Path(directory) / "read.sqlite")
