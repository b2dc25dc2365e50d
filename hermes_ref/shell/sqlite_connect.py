"""Opening a durable store's SQLite file: refuse what is not a usable database, then prepare it.

Theory of operation
-------------------
``open_connection`` is ``check_header`` + ``connect`` + ``prepare``; the async store calls
the three separately so the last two run on aiosqlite's worker thread.

* ``check_header`` reads the first 100 bytes before sqlite3 sees the file, so a file that
  is not SQLite at all, or is truncated, is a ``BadInput`` naming the path; a missing or
  empty file is a new database.
* ``connect`` returns a ``StoreConnection`` in autocommit mode: every transaction in
  ``sqlite_ops`` is explicit, and the connection counts the ones it committed.
* ``prepare`` applies the PRAGMAs, runs ``PRAGMA quick_check`` and the migrations
  (``sqlite_schema``). A damaged file is ``BadInput`` naming it; any other sqlite3 error
  leaves as ``PersistenceError``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hermes_ref.errors import BadInput
from hermes_ref.shell.sqlite_codec import error_cause, persistence_error
from hermes_ref.shell.sqlite_schema import (
    DEFAULT_BUSY_TIMEOUT_MS,
    check_synchronous,
    configure,
    migrate,
)


class StoreConnection(sqlite3.Connection):
    """A sqlite3 connection that counts the write transactions it committed."""

    commits: int = 0


_MAGIC = b"SQLite format 3\x00"


def open_connection(
    path: str | Path,
    *,
    synchronous: str = "FULL",
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
) -> StoreConnection:
    """Open, check, configure and migrate the database at ``path``."""
    mode = check_synchronous(synchronous)
    check_header(path)
    conn = connect(path, busy_timeout_ms=busy_timeout_ms)
    try:
        prepare(conn, path, synchronous=mode, busy_timeout_ms=busy_timeout_ms)
    except BaseException:
        conn.close()
        raise
    return conn


def connect(path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> StoreConnection:
    """The bare connection (autocommit mode); ``prepare`` must run on it before use."""
    try:
        return sqlite3.connect(
            path, timeout=busy_timeout_ms / 1000, isolation_level=None, factory=StoreConnection
        )
    except sqlite3.Error as exc:
        raise BadInput(f"{path}: cannot open as a SQLite database: {exc}") from exc


def prepare(
    conn: StoreConnection,
    path: str | Path,
    *,
    synchronous: str = "FULL",
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
) -> None:
    """PRAGMAs, ``quick_check`` and migrations; a damaged file is ``BadInput`` naming it."""
    try:
        configure(conn, synchronous, busy_timeout_ms)
        _check_integrity(conn, str(path))
        migrate(conn, str(path))
    except sqlite3.Error as exc:
        if error_cause(exc) == "corrupt":
            raise BadInput(f"{path}: not a usable SQLite database: {exc}") from exc
        raise persistence_error(exc) from exc


def check_header(path: str | Path) -> None:
    """A clear message for a file that is not SQLite at all (before sqlite3 sees it)."""
    where = str(path)
    if where == ":memory:" or where.startswith("file:"):
        return
    try:
        with open(where, "rb") as handle:
            head = handle.read(100)
    except FileNotFoundError:
        return  # a new database
    except OSError as exc:
        raise BadInput(f"{where}: cannot read the database file: {exc.strerror}") from exc
    if not head:
        return  # an empty file is a new database to SQLite
    if not head.startswith(_MAGIC):
        raise BadInput(
            f"{where}: not a SQLite database (the file starts with {head[:16]!r}, "
            f"expected {_MAGIC!r})"
        )
    if len(head) < 100:
        raise BadInput(f"{where}: truncated SQLite database ({len(head)} bytes of header)")


def _check_integrity(conn: sqlite3.Connection, where: str) -> None:
    rows = conn.execute("PRAGMA quick_check").fetchall()
    if rows != [("ok",)]:
        problems = "; ".join(str(row[0]) for row in rows[:3])
        raise BadInput(f"{where}: database is corrupt (quick_check: {problems})")
