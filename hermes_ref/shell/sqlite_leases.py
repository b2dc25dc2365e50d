"""The turn lease in SQLite: grants, the fence, refreshes and the grant history (LEASE).

Theory of operation
-------------------
``turn_leases`` holds each session's current grant; ``lease_grants`` (schema v5) keeps
every grant ever made, so a reader of the file alone can tell which holder was entitled
to write at any moment: a grant is live from ``acquired_at`` until the first of
``expires_at`` (moved on by each refresh) and ``ended_at`` (its release, or the moment the
next grant replaced it after expiry or its holder's death).

``take`` is the one way a grant is made, inside the caller's write transaction: a dead
holder's unexpired lease is marked expired first (LEASE-3), the grant is an upsert that
succeeds only if the lease is free, released or expired, and the previous grant's history
row is closed with the reason it ended. ``check_fence`` is every fenced write's first
statement: the token must be current and, by the store's clock, unexpired (LEASE-4).
``refresh`` extends only the caller's own unexpired grant.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from hermes_ref import lease as lease_rules
from hermes_ref.errors import LeaseLost, PersistenceError
from hermes_ref.models import Lease
from hermes_ref.ports import LeaseGrantRow

GRANTS_DDL: tuple[str, ...] = (
    """CREATE TABLE lease_grants (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        token INTEGER NOT NULL,
        holder TEXT NOT NULL,
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        ended_at REAL,
        end_reason TEXT,
        PRIMARY KEY (session_id, token)
    )""",
    # the turns waiting for a busy lease, in the order they first asked (fairness)
    """CREATE TABLE lease_waiters (
        session_id TEXT NOT NULL,
        holder TEXT NOT NULL,
        seq INTEGER NOT NULL,
        valid_until REAL NOT NULL,
        PRIMARY KEY (session_id, holder)
    )""",
)

_ACQUIRE = (
    "INSERT INTO turn_leases(session_id, holder, token, acquired_at, expires_at) "
    "VALUES (?, ?, 1, ?, ?) "
    "ON CONFLICT(session_id) DO UPDATE SET holder = excluded.holder, "
    "token = turn_leases.token + 1, acquired_at = excluded.acquired_at, "
    "expires_at = excluded.expires_at "
    "WHERE turn_leases.holder IS NULL OR turn_leases.expires_at <= excluded.acquired_at "
    "RETURNING token"
)
_CURRENT = "SELECT holder, token, expires_at FROM turn_leases WHERE session_id = ?"
_FENCE = (
    "SELECT l.holder, l.token, l.expires_at FROM sessions s "
    "LEFT JOIN turn_leases l ON l.session_id = s.id WHERE s.id = ?"
)
_EXPIRE = "UPDATE turn_leases SET expires_at = ? WHERE session_id = ?"
_CLOSE = (
    "UPDATE lease_grants SET ended_at = ?, end_reason = ? "
    "WHERE session_id = ? AND ended_at IS NULL"
)
_INSERT_GRANT = (
    "INSERT INTO lease_grants(session_id, token, holder, acquired_at, expires_at) "
    "VALUES (?, ?, ?, ?, ?)"
)
_REFRESH = (
    "UPDATE turn_leases SET expires_at = MAX(expires_at, ?) "
    "WHERE session_id = ? AND token = ? AND holder = ? AND expires_at > ? RETURNING expires_at"
)
_REFRESH_GRANT = "UPDATE lease_grants SET expires_at = ? WHERE session_id = ? AND token = ?"
_SELECT_GRANTS = (
    "SELECT session_id, token, holder, acquired_at, expires_at, ended_at, end_reason "
    "FROM lease_grants ORDER BY rowid"
)


def take(conn: sqlite3.Connection, session_id: str, holder: str, now: float, ttl_s: float,
         holder_alive: Callable[[str], bool] | None, poll_s: float = 0.0, *,
         new_session: bool = False) -> int | None:
    """Grant the lease inside the open transaction; the new token, or None when busy.

    With ``poll_s`` the asker waits in line: it is refused while a live waiter that asked
    before it still waits, and a refusal (re)writes its place in the queue. A grant takes
    the asker's place out of the queue, if the queue showed it one (or was not read).

    ``new_session``: this transaction has just inserted the session's row. A lease and its
    grants can only be written for a session that exists (foreign keys), a place in the
    queue only beside a live lease or an earlier place, and no session row is ever
    deleted: so a new session has no lease, no grant and no queue, and its first grant is
    made without reading them.
    """
    if new_session:
        return _grant(conn, session_id, holder, now, ttl_s, holder_alive, current=None)
    queued = True  # unread: the asker may hold a place from an earlier poll
    if poll_s > 0:
        first, queued = _first_in_line(conn, session_id, holder, now, holder_alive)
        if not first:
            _join_queue(conn, session_id, holder, now, poll_s)
            return None
    token = _grant(conn, session_id, holder, now, ttl_s, holder_alive,
                   current=conn.execute(_CURRENT, (session_id,)).fetchone())
    if token is None and poll_s > 0:
        _join_queue(conn, session_id, holder, now, poll_s)
    elif token is not None and queued:
        conn.execute(_LEAVE, (session_id, holder))
    return token


_WAITERS = "SELECT holder, seq, valid_until FROM lease_waiters WHERE session_id = ?"
_LEAVE = "DELETE FROM lease_waiters WHERE session_id = ? AND holder = ?"
_CARRY_LINE = "UPDATE lease_waiters SET session_id = ? WHERE session_id = ?"
_JOIN = (
    "INSERT INTO lease_waiters(session_id, holder, seq, valid_until) VALUES (?, ?, "
    "(SELECT COALESCE(MAX(seq), 0) + 1 FROM lease_waiters), ?) "
    "ON CONFLICT(session_id, holder) DO UPDATE SET valid_until = excluded.valid_until"
)


def _first_in_line(conn: sqlite3.Connection, session_id: str, holder: str, now: float,
                   holder_alive: Callable[[str], bool] | None) -> tuple[bool, bool]:
    """Is the asker first in line, and does it hold a live place in the queue?"""
    mine, others = None, []
    for waiter, seq, valid_until in conn.execute(_WAITERS, (session_id,)).fetchall():
        if valid_until <= now or (holder_alive is not None and not holder_alive(waiter)):
            conn.execute(_LEAVE, (session_id, waiter))  # stopped asking, or died
        elif waiter == holder:
            mine = int(seq)
        else:
            others.append(int(seq))
    return lease_rules.first_in_line(mine, others), mine is not None


def leave_queue(conn: sqlite3.Connection, session_id: str, holder: str) -> None:
    conn.execute(_LEAVE, (session_id, holder))


def carry_line(conn: sqlite3.Connection, parent: str, child: str) -> None:
    """A rotation carries the lease to the child (LEASE-1 per lineage root), and the turns
    waiting for it keep their places: the line is the lease's, not the session row's. Left
    behind, every waiter would join the child's line anew, behind a turn that first asked
    after the rotation."""
    conn.execute(_CARRY_LINE, (child, parent))


def _join_queue(conn: sqlite3.Connection, session_id: str, holder: str, now: float,
                poll_s: float) -> None:
    conn.execute(_JOIN, (session_id, holder, now + 2 * poll_s))


def _grant(conn: sqlite3.Connection, session_id: str, holder: str, now: float, ttl_s: float,
           holder_alive: Callable[[str], bool] | None,
           current: tuple[Any, ...] | None) -> int | None:
    """The upsert of the grant; ``current`` is the lease row as it stood (``_CURRENT``)."""
    reason = "expired"
    if current is not None and current[0] is not None and current[2] > now:
        incumbent = str(current[0])
        dead = holder_alive is not None and lease_rules.reclaimable(
            current[2], now, lambda: not holder_alive(incumbent))
        if dead:
            conn.execute(_EXPIRE, (now, session_id))  # LEASE-3: its holder is dead
            reason = "holder_dead"
    granted = conn.execute(_ACQUIRE, (session_id, holder, now, now + ttl_s)).fetchall()
    if not granted:
        return None
    if current is not None and current[0] is not None:
        conn.execute(_CLOSE, (min(now, current[2]) if reason == "expired" else now, reason,
                              session_id))
    token: int = granted[0][0]
    conn.execute(_INSERT_GRANT, (session_id, token, holder, now, now + ttl_s))
    return token


def check_fence(conn: sqlite3.Connection, session_id: str, lease_token: int, now: float | None,
                *, session_required: bool) -> None:
    """LEASE-4: the session's lease must be held, carry ``lease_token`` and be unexpired."""
    row = conn.execute(_FENCE, (session_id,)).fetchone()
    if row is None and session_required:
        raise PersistenceError(f"no session {session_id!r}", cause="foreign_key")
    holder, token, expires_at = row if row is not None else (None, None, None)
    if not lease_rules.fence_holds(lease_token, token, holder is not None, expires_at, now):
        expired = now is not None and expires_at is not None and expires_at <= now
        state = "expired" if expired else f"the current token is {token}"
        raise LeaseLost(f"write to session {session_id!r} with lease token {lease_token} "
                        f"but {state}")


_CLOSE_RELEASED = (
    "UPDATE lease_grants SET "
    "end_reason = CASE WHEN ? > 0 AND ? >= expires_at THEN 'expired' ELSE 'released' END, "
    "ended_at = CASE WHEN ? > 0 THEN MIN(?, expires_at) ELSE expires_at END "
    "WHERE session_id = ? AND token = ? AND ended_at IS NULL"
)


def close_released(conn: sqlite3.Connection, lease: Lease, now: float) -> None:
    """The history side of a release that matched the caller's own grant: it ended at
    ``now``, or at its (possibly refreshed) expiry if that came first, and then it counts
    as expired: a release after the expiry came too late to matter."""
    conn.execute(_CLOSE_RELEASED, (now, now, now, now, lease.session_id, lease.token))


def refresh(conn: sqlite3.Connection, lease: Lease, now: float, ttl_s: float,
            clock_now: float) -> Lease:
    """Extend the caller's own unexpired grant to ``now + ttl_s``; LeaseLost otherwise."""
    rows = conn.execute(_REFRESH, (now + ttl_s, lease.session_id, lease.token, lease.holder,
                                   clock_now)).fetchall()
    if not rows:
        raise LeaseLost(f"refresh of session {lease.session_id!r} lease token {lease.token} "
                        "by a holder that no longer has it")
    expires_at = float(rows[0][0])
    conn.execute(_REFRESH_GRANT, (expires_at, lease.session_id, lease.token))
    return lease.model_copy(update={"expires_at": expires_at})


def read_grants(conn: sqlite3.Connection) -> tuple[LeaseGrantRow, ...]:
    rows: Sequence[tuple[object, ...]] = conn.execute(_SELECT_GRANTS).fetchall()
    return tuple(LeaseGrantRow(session_id=str(r[0]), token=int(str(r[1])), holder=str(r[2]),
                               acquired_at=float(str(r[3])), expires_at=float(str(r[4])),
                               ended_at=None if r[5] is None else float(str(r[5])),
                               end_reason=None if r[6] is None else str(r[6]))
                 for r in rows)
