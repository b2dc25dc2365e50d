"""Opening a durable store's SQLite file: judge it read-only first, then create, open or refuse.

Theory of operation
-------------------
``ready`` is the one way both SQLite stores get a file ready to open: the simulator's
store through ``open_connection`` (``ready`` + ``connect`` + ``prepare``), the async store
by calling the three itself so that ``connect`` and ``prepare`` run on aiosqlite's worker
thread. ``ready`` runs ``classify`` first, and only a file judged to be ours is ever opened
read-write:

* nothing at the path, and no ``-wal``/``-shm``/``-journal`` left beside it: ``CREATE``, a
  new database of ours is built aside and linked into place (see below);
* ``:memory:``: ``MEMORY``, a private database with nothing on disk;
* ours at ``LATEST_VERSION``: ``OPEN``;
* ours and older (marked, or unmarked with exactly an older schema of ours): ``MIGRATE``,
  the migrations of ``sqlite_schema`` run on the read-write connection;
* refused: ours but newer; another application's ``application_id``; SQLite without our
  mark and schema (a foreign file, even one with a ``messages`` table); an empty (0-byte)
  file, because an empty file is not ours and the only database this program makes is one
  at a path where nothing exists yet; a file that is not SQLite, truncated or corrupt, or
  not a regular file; and ``-wal``/``-shm``/``-journal`` siblings with no main file, since
  replaying another database's log into a new file would corrupt it.

Every refusal is a one-line ``BadInput`` naming the path and what was found.

Why ``immutable=1``
-------------------
Any normal SQLite connection, even ``mode=ro``, takes a ``-wal`` it finds next to the file
as part of the database, whoever wrote that log (a read-write one copies it into the file
when it closes); it rebuilds and marks ``-shm``, and creates both files if they are missing.
``classify`` therefore reads through a ``mode=ro&immutable=1`` URI, with which SQLite opens
the main file alone, takes no locks and never touches a sibling. The price is twofold, and
both halves are handled:

* It does not see commits still only in the ``-wal``. A database this program creates has
  its whole schema and mark in the main file from the first moment (``_create``), so the
  mark and version it reads are never missing, only possibly behind; a version that is
  behind is re-read by ``migrate`` under the write lock, which also refuses one that turns
  out newer (that file is ours, so its own log may then be checkpointed on close, as any
  SQLite client would: its bytes move from log to file, its content does not change).
  An unmarked file whose schema is only in a ``-wal`` cannot be told from a foreign file
  next to a stale log, and is refused.
* It is not safe against a concurrent writer. A file of ours with a ``-wal`` may be in use
  by another process, which may checkpoint into it while it is read; if such a read fails,
  the verdict is ``MIGRATE`` with the version unknown, and the read-write open (with its
  locks, ``quick_check`` and ``migrate``) decides. Without a ``-wal`` nobody has our WAL
  database open, and a failed read is a refusal.

The header is read by SQLite, not by ``open()``: closing any descriptor of a file drops
every POSIX lock this process holds on it, including those of another store's connection
to the same file. Raw bytes are read only to describe a file SQLite called "not a
database".

Creating a database
-------------------
``_create`` builds the schema in a temporary file next to the path (rollback journal,
``synchronous=FULL``), switches it to WAL, closes it so nothing stays in a log, fsyncs it,
and gives it the path with ``os.link``, which fails when something is already there: so
the path holds either nothing or a complete, marked database of ours, even across a crash
(which can leave only a ``<name>.new-<hex>`` temporary behind). Two processes creating the
same path race safely: the loser's link fails and it opens the winner's file after
classifying it.

After the verdict, ``connect`` opens the read-write connection in autocommit mode (every
transaction in ``sqlite_ops`` is explicit, and the connection counts the ones it
committed) and ``prepare`` applies the PRAGMAs, ``PRAGMA quick_check`` and the
migrations. A damaged file is ``BadInput`` naming it; any other sqlite3 error leaves as
``PersistenceError``.
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import sqlite3
import stat
from pathlib import Path
from typing import NamedTuple

from hermes_ref.errors import BadInput, PersistenceError
from hermes_ref.shell.sqlite_codec import error_cause, persistence_error
from hermes_ref.shell.sqlite_schema import (
    APPLICATION_ID,
    DEFAULT_BUSY_TIMEOUT_MS,
    LATEST_VERSION,
    MARKED_SINCE,
    SCHEMA_OBJECTS,
    SchemaObject,
    check_synchronous,
    configure,
    migrate,
    recorded_version,
    schema_objects,
)


class StoreConnection(sqlite3.Connection):
    """A sqlite3 connection that counts the write transactions it committed.

    ``bare`` and ``spoiled`` belong to the group commit's first pass over a batch
    (``group_commit.run_batch``): while ``bare``, a write inside the open transaction takes
    no savepoint, and one that fails marks the transaction ``spoiled``.
    """

    commits: int = 0
    bare: bool = False
    spoiled: bool = False


class Verdict(enum.Enum):
    """What ``ready`` does with a path that ``classify`` did not refuse."""

    CREATE = "create"
    MEMORY = "memory"
    OPEN = "open"
    MIGRATE = "migrate"


class Found(NamedTuple):
    verdict: Verdict
    version: int | None = None
    """The schema version the main file records; ``None`` when none or not readable."""


_MAGIC = b"SQLite format 3\x00"
SIBLINGS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps next to a database (its write-ahead log, its index, its journal)."""


def open_connection(
    path: str | Path,
    *,
    synchronous: str = "FULL",
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
) -> StoreConnection:
    """``ready`` + ``connect`` + ``prepare``: the read-write connection to a database of ours."""
    mode = check_synchronous(synchronous)
    ready(path)
    conn = connect(path, busy_timeout_ms=busy_timeout_ms)
    try:
        prepare(conn, path, synchronous=mode, busy_timeout_ms=busy_timeout_ms)
    except BaseException:
        conn.close()
        raise
    return conn


def ready(path: str | Path) -> Found:
    """Classify ``path`` and create the database if nothing is there; refuse the rest untouched.

    Returns the verdict of the file now at the path (never ``CREATE``).
    """
    found = classify(path)
    if found.verdict is Verdict.CREATE:
        _create(str(path))
        # ours, or what a concurrent opener linked there first: judge it like any file
        found = classify(path)
        if found.verdict is Verdict.CREATE:
            raise PersistenceError(f"{path}: the new database vanished as it was created",
                                   cause="io")
    return found


def classify(path: str | Path) -> Found:
    """Judge what is at ``path`` without writing a byte; ``BadInput`` for what must not open."""
    where = str(path)
    if where == ":memory:":
        return Found(Verdict.MEMORY)
    try:
        info = os.stat(where)
    except FileNotFoundError:
        _refuse_leftovers(where)
        return Found(Verdict.CREATE)
    except OSError as exc:
        raise BadInput(f"{where}: cannot read the database file: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise BadInput(f"{where}: not a regular file, so not a database")
    if info.st_size == 0:
        # SQLite would take an empty file as a new database; we create only where nothing is
        raise BadInput(f"{where}: an empty file (0 bytes), not a hermes-ref database; a new "
                       f"database is created only at a path where no file exists")
    try:
        conn = sqlite3.connect(_immutable_uri(where), uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise _unreadable(where, exc) from exc
    try:
        return _judge(conn, where)
    except sqlite3.Error as exc:
        raise _unreadable(where, exc) from exc
    finally:
        conn.close()


def _immutable_uri(where: str) -> str:
    # as_uri percent-encodes '?', '#' and '%', which would otherwise end the file name
    return Path(os.path.abspath(where)).as_uri() + "?mode=ro&immutable=1"


def _judge(conn: sqlite3.Connection, where: str) -> Found:
    app: int = conn.execute("PRAGMA application_id").fetchone()[0]
    if app not in (0, APPLICATION_ID):
        raise BadInput(f"{where}: a SQLite database of another application (application_id "
                       f"{app & 0xFFFFFFFF:#010x}; hermes-ref's is {APPLICATION_ID:#010x})")
    try:
        objects: frozenset[SchemaObject] = frozenset(conn.execute(SCHEMA_OBJECTS).fetchall())
        has_versions = ("table", "schema_migrations") in {(o[0], o[1]) for o in objects}
        version = recorded_version(conn) if app == APPLICATION_ID and has_versions else None
    except sqlite3.DatabaseError:
        if app == APPLICATION_ID and os.path.exists(where + "-wal"):
            return Found(Verdict.MIGRATE)  # possibly a checkpoint in flight: see module doc
        raise
    if app == APPLICATION_ID:
        if version is None:
            raise BadInput(f"{where}: carries hermes-ref's application_id but has no "
                           f"schema_migrations table")
        if version > LATEST_VERSION:
            raise BadInput(
                f"{where}: database schema version {version} is newer than the newest "
                f"version this program knows ({LATEST_VERSION})")
        return Found(Verdict.OPEN if version == LATEST_VERSION else Verdict.MIGRATE, version)
    # unmarked: ours only if made before the mark existed, with exactly that schema
    for old in range(MARKED_SINCE):
        if objects == schema_objects(old) and recorded_version(conn) == old:
            return Found(Verdict.MIGRATE, old)
    raise BadInput(f"{where}: not a hermes-ref database (no hermes-ref application_id, "
                   f"{_describe(objects)}){_wal_note(where)}")


def _describe(objects: frozenset[SchemaObject]) -> str:
    tables = sorted(name for kind, name, _, _ in objects
                    if kind == "table" and not name.startswith("sqlite_"))
    if not tables:
        return "no tables"
    shown = ", ".join(tables[:6]) + (f" and {len(tables) - 6} more" if len(tables) > 6 else "")
    return f"tables: {shown}"


def _wal_note(where: str) -> str:
    if os.path.exists(where + "-wal"):
        return f"; {where}-wal was not read"
    return ""


def _refuse_leftovers(where: str) -> None:
    """A missing file is new only if nothing of another database is left beside it."""
    for suffix in SIBLINGS:
        if os.path.lexists(where + suffix):
            raise BadInput(f"{where}: no database here, but {where}{suffix} is left over from "
                           f"one; move it away or choose another path")
    if os.path.lexists(where):
        raise BadInput(f"{where}: a symbolic link to a missing file")


def _unreadable(where: str, exc: sqlite3.Error) -> BadInput | PersistenceError:
    """The error for a file SQLite could not read: what it is, in one line."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith("SQLITE_IOERR"):
        return persistence_error(exc)  # the disk failed, not the file's content
    if name == "SQLITE_NOTADB" and not (head := _head(where)).startswith(_MAGIC):
        return BadInput(f"{where}: not a SQLite database (the file starts with "
                        f"{head[:16]!r}, expected {_MAGIC!r})")
    if error_cause(exc) == "corrupt":  # truncated or damaged behind a valid header
        return BadInput(f"{where}: not a usable SQLite database "
                        f"({os.path.getsize(where)} bytes): {exc}")
    return BadInput(f"{where}: cannot read as a SQLite database: {exc}")


def _head(where: str) -> bytes:
    # a raw read is safe here: SQLite found no database, so no connection holds its locks
    try:
        with open(where, "rb") as handle:
            return handle.read(16)
    except OSError:
        return b""


def _create(where: str) -> None:
    """Build a new database of ours beside ``where``; link it there only when complete.

    Returns without error when another opener linked a file there first.
    """
    temp = f"{where}.new-{secrets.token_hex(4)}"
    try:
        # O_EXCL: a fresh name of our own; 0o644 before the umask, as SQLite creates files
        os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        conn = sqlite3.connect(temp, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous = FULL")
            migrate(conn, where)
            # last, so the schema and the mark are in the main file, not in a log
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
        finally:
            conn.close()
        _fsync(temp)
        try:
            os.link(temp, where)
        except FileExistsError:
            return
        _fsync(os.path.dirname(os.path.abspath(where)))  # make the new name durable
    except OSError as exc:
        raise BadInput(f"{where}: cannot create the database: {exc.strerror}") from exc
    except sqlite3.Error as exc:
        raise persistence_error(exc) from exc
    finally:
        for suffix in ("", *SIBLINGS):
            # the temporary name only; the database keeps its own link
            with contextlib.suppress(OSError):
                os.unlink(temp + suffix)


def _fsync(where: str) -> None:
    fd = os.open(where, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def connect(path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> StoreConnection:
    """The bare read-write connection (autocommit mode); ``prepare`` must run on it before use."""
    try:
        return sqlite3.connect(
            path, timeout=busy_timeout_ms / 1000, isolation_level=None, factory=StoreConnection
        )
    except sqlite3.Error as exc:
        raise BadInput(f"{path}: cannot open as a SQLite database: {exc}") from exc


def open_reader(path: str | Path) -> sqlite3.Connection | None:
    """A read-only connection for point reads on the event loop, or None if it cannot open.

    In WAL a reader never waits for the writer, so a read through it costs no thread hop
    and takes no place in the writer's queue (the worker runs the group commit's batches).
    It never waits at all (``busy_timeout`` 0): a read it cannot make at once (a database
    not in WAL, whose writer locks readers out while it commits) raises, and the caller asks
    on the worker instead. Call only after ``prepare`` ran on the writer.
    """
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True,
                               isolation_level=None, timeout=0)
        conn.execute("PRAGMA query_only = ON")
    except sqlite3.Error:
        return None
    return conn


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


def _check_integrity(conn: sqlite3.Connection, where: str) -> None:
    rows = conn.execute("PRAGMA quick_check").fetchall()
    if rows != [("ok",)]:
        problems = "; ".join(str(row[0]) for row in rows[:3])
        raise BadInput(f"{where}: database is corrupt (quick_check: {problems})")
