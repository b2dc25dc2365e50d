"""DDL, PRAGMAs and migrations of the durable SQLite store.

Theory of operation
-------------------
The schema is an ordered tuple of ``Migration`` values. ``schema_migrations`` records
each applied version; ``migrate`` applies every missing one, each in its own
``BEGIN IMMEDIATE`` transaction that also records the version, so a crash mid-migration
leaves the database at the previous version. The version is re-read inside that
transaction, so two processes opening the same new file cannot both apply v1. A database
whose recorded version is newer than this code knows is refused with ``BadInput``: a
newer program wrote it, and guessing its layout could lose data.

Every database this program makes carries ``APPLICATION_ID`` in its header (``PRAGMA
application_id``, written by migration 2 in the same transaction that records it), so
the opener (``sqlite_connect.classify``) can tell a file of ours from any other SQLite file
without guessing from table names. Files made before the mark existed are recognised by
their exact schema instead (``schema_objects``: the ``sqlite_master`` rows a database at a
given version has, built in memory from ``MIGRATIONS`` so the expectation cannot drift
from the DDL); opening one applies migration 2 and marks it.

``configure`` sets the per-connection PRAGMAs (they are not stored in the file, except
WAL mode) and must run on every connection before anything else.

The connection is expected in autocommit mode (``isolation_level=None``): every
transaction here is explicit.

Message scaffolding (``Message.scaffold``) is deliberately not a column: scaffolding is
never persisted (SCAF-1), and the store refuses it before it reaches SQL.
"""

from __future__ import annotations

import sqlite3
import time
from functools import cache
from typing import NamedTuple

from hermes_ref.errors import BadInput
from hermes_ref.shell.sqlite_leases import GRANTS_DDL

SYNCHRONOUS_MODES = frozenset({"NORMAL", "FULL", "OFF"})
DEFAULT_BUSY_TIMEOUT_MS = 5000


class Migration(NamedTuple):
    version: int
    description: str
    statements: tuple[str, ...]


_V1 = (
    """CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        key TEXT NOT NULL,
        platform TEXT NOT NULL,
        chat_type TEXT NOT NULL,
        parent_session_id TEXT REFERENCES sessions(id),
        system_prompt TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        end_reason TEXT
    )""",
    "CREATE INDEX idx_sessions_key ON sessions(key)",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
        content TEXT,
        api_content TEXT,
        tool_calls TEXT,
        tool_call_id TEXT,
        tool_name TEXT,
        finish_reason TEXT,
        turn_id TEXT,
        hidden INTEGER NOT NULL DEFAULT 0,
        created_at REAL
    )""",
    # load_messages(session, after_row_id) and the foreign key from messages
    "CREATE INDEX idx_messages_session ON messages(session_id, id)",
    """CREATE TABLE admissions (
        admission_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        principal_id TEXT NOT NULL,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        request_id TEXT NOT NULL,
        payload_json TEXT NOT NULL,
        payload_digest TEXT NOT NULL,
        intent TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('queued', 'started', 'unknown', 'terminal')),
        outcome TEXT,
        owner_epoch INTEGER,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        UNIQUE (principal_id, session_id, request_id)
    )""",
    "CREATE INDEX idx_admissions_session ON admissions(session_id, status)",
    """CREATE TABLE turn_leases (
        session_id TEXT PRIMARY KEY REFERENCES sessions(id),
        holder TEXT,
        token INTEGER NOT NULL,
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL
    )""",
    """CREATE TABLE compression_locks (
        session_id TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL
    )""",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at REAL NOT NULL
    )""",
)

# SES: session lanes. Route revisions are appended, never updated or deleted: the newest
# revision of a key is its route, and the primary key is the compare-and-set (a second
# writer of the same revision fails). Markers are clean_exit and restarts:<key>; the lane
# log records process starts and stops and background processes (sqlite_routes.py).
_V3_ROUTES = (
    """CREATE TABLE session_routes (
        key TEXT NOT NULL,
        revision INTEGER NOT NULL CHECK (revision >= 1),
        session_id TEXT NOT NULL,
        cause TEXT NOT NULL,
        at REAL NOT NULL,
        platform TEXT NOT NULL,
        chat_type TEXT NOT NULL,
        chat_id TEXT,
        thread_id TEXT,
        participant TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        suspended INTEGER NOT NULL,
        resume_pending INTEGER NOT NULL,
        resume_reason TEXT,
        resume_marked_at REAL,
        was_auto_reset INTEGER NOT NULL,
        auto_reset_reason TEXT,
        is_fresh_reset INTEGER NOT NULL,
        expiry_finalized INTEGER NOT NULL,
        retired INTEGER NOT NULL,
        notice_delivered INTEGER NOT NULL,
        resolution_order TEXT NOT NULL,
        PRIMARY KEY (key, revision)
    )""",
    """CREATE TABLE lane_markers (
        name TEXT PRIMARY KEY,
        value REAL NOT NULL
    )""",
    """CREATE TABLE lane_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        key TEXT NOT NULL
    )""",
)

# ADM: what the admission door needs beyond v1's unused ``admissions`` table: who admitted a
# row and with which role, its claim count and mark, the turn that ran it, how and when it
# was settled, and the store's admission clock (``tick``); principals' session bindings;
# the singleton runtime epoch row.
_V4_ADMISSION = (
    *(f"ALTER TABLE admissions ADD COLUMN {column}" for column in (
        "principal_kind TEXT NOT NULL DEFAULT 'user'",
        "role TEXT NOT NULL DEFAULT 'member'",
        "claims INTEGER NOT NULL DEFAULT 0",
        "claim_mark INTEGER",
        "turn_id TEXT",
        "settled_via TEXT",
        "settled_epoch INTEGER",
        "claimed_tick INTEGER",
        "unknown_tick INTEGER",
        "settled_tick INTEGER",
    )),
    """CREATE TABLE session_bindings (
        principal_id TEXT NOT NULL,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        kind TEXT NOT NULL,
        role TEXT NOT NULL,
        PRIMARY KEY (principal_id, session_id)
    )""",
    """CREATE TABLE runtime_epoch (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        epoch INTEGER NOT NULL,
        tick INTEGER NOT NULL,
        started_at REAL NOT NULL
    )""",
    # one row per process's epoch: whose (``pid=..:pidns=..``), since when, retired when
    """CREATE TABLE runtime_epochs (
        epoch INTEGER PRIMARY KEY,
        holder TEXT NOT NULL,
        started_at REAL NOT NULL,
        retired_at REAL
    )""",
)

# DEL-2: an event's place in its turn (stamped at emit time), and the index a reconnecting
# client's replay (``events_after``) reads. Events logged before v6 have no number (NULL).
_V6_TURN_SEQ = (
    "ALTER TABLE events ADD COLUMN turn_seq INTEGER",
    "CREATE INDEX idx_events_turn ON events(session_id, turn_id, turn_seq)",
)

# CMP-5, CMP-6: a compaction in place archives rows (``archived_at`` set: kept, never loaded
# again); every ask for a compression lock and every committed compaction is kept
# (sqlite_compaction.py).
_V7_COMPACTION = (
    "ALTER TABLE messages ADD COLUMN archived_at REAL",
    """CREATE TABLE compression_lock_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        holder TEXT NOT NULL,
        granted INTEGER NOT NULL,
        acquired_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        ended_at REAL,
        end_reason TEXT
    )""",
    """CREATE TABLE compactions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        child_id TEXT REFERENCES sessions(id),
        holder TEXT NOT NULL,
        token INTEGER NOT NULL,
        at REAL NOT NULL,
        rows_before INTEGER NOT NULL,
        rows_after INTEGER NOT NULL,
        first_row_id INTEGER NOT NULL
    )""",
    # the tip walk goes from a parent to its children
    "CREATE INDEX idx_sessions_parent ON sessions(parent_session_id)",
)

APPLICATION_ID = 0x48726D52
"""``PRAGMA application_id`` of a hermes-ref database: the bytes ``HrmR`` at header offset 68."""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _V1),
    # PRAGMA application_id is transactional: the mark and its schema_migrations row
    # commit together, so a marked file always records at least this version.
    Migration(2, "mark the file as hermes-ref's", (f"PRAGMA application_id = {APPLICATION_ID}",)),
    Migration(3, "session lanes: route revisions, lane markers, lane log", _V3_ROUTES),
    Migration(4, "the admission door: row history, bindings, runtime epochs", _V4_ADMISSION),
    Migration(5, "every turn-lease grant, kept after it ends", GRANTS_DDL),
    Migration(6, "each event's place in its turn, for replay after a reconnect", _V6_TURN_SEQ),
    # CMP-5, CMP-6: archived rows, every compression-lock ask, every compaction
    Migration(7, "compaction: the archive, the lock's history, the compactions",
              _V7_COMPACTION),
)
LATEST_VERSION = MIGRATIONS[-1].version
MARKED_SINCE = 2
"""The first schema version whose files carry ``APPLICATION_ID``; older ones do not."""

_CREATE_MIGRATIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
)
_CURRENT_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_migrations"


def check_synchronous(synchronous: str) -> str:
    """The PRAGMA synchronous value, upper-cased; BadInput for anything else."""
    mode = synchronous.upper()
    if mode not in SYNCHRONOUS_MODES:
        raise BadInput(
            f"synchronous={synchronous!r} is not one of {sorted(SYNCHRONOUS_MODES)}"
        )
    return mode


def configure(
    conn: sqlite3.Connection,
    synchronous: str = "FULL",
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
) -> None:
    """Apply the per-connection PRAGMAs. Values are checked, never interpolated raw."""
    mode = check_synchronous(synchronous)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode = WAL").fetchall()
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(f"PRAGMA synchronous = {mode}")


def current_version(conn: sqlite3.Connection) -> int:
    """The recorded schema version, creating an empty ``schema_migrations`` if absent."""
    conn.execute(_CREATE_MIGRATIONS_TABLE)
    return recorded_version(conn)


def recorded_version(conn: sqlite3.Connection) -> int:
    """The highest version in ``schema_migrations`` (0 when empty); reads only."""
    version: int = conn.execute(_CURRENT_VERSION).fetchone()[0]
    return version


SchemaObject = tuple[str, str, str, str | None]
"""One ``sqlite_master`` row: type, name, tbl_name, sql (``None`` for automatic indexes)."""

SCHEMA_OBJECTS = "SELECT type, name, tbl_name, sql FROM sqlite_master"


@cache
def schema_objects(version: int) -> frozenset[SchemaObject]:
    """The ``sqlite_master`` rows of a database of ours at ``version``, built in memory.

    SQLite stores each CREATE statement's text as given (minus ``IF NOT EXISTS``), so a file
    migrated to ``version`` by this module has exactly these rows.
    """
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute(_CREATE_MIGRATIONS_TABLE)
        for migration in MIGRATIONS:
            if migration.version <= version:
                for statement in migration.statements:
                    conn.execute(statement)
        return frozenset(conn.execute(SCHEMA_OBJECTS).fetchall())
    finally:
        conn.close()


def migrate(conn: sqlite3.Connection, where: str) -> int:
    """Bring the schema to ``LATEST_VERSION``; returns the version found before.

    ``where`` names the database in error messages.
    """
    found = current_version(conn)
    if found > LATEST_VERSION:
        raise BadInput(
            f"{where}: database schema version {found} is newer than the newest version "
            f"this program knows ({LATEST_VERSION})"
        )
    for migration in MIGRATIONS:
        if migration.version > found:
            _apply(conn, migration)
    return found


def _apply(conn: sqlite3.Connection, migration: Migration) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        # re-read under the write lock: another connection may have migrated meanwhile
        if conn.execute(_CURRENT_VERSION).fetchone()[0] >= migration.version:
            conn.execute("ROLLBACK")
            return
        for statement in migration.statements:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations(version, applied_at) VALUES (?, ?)",
            (migration.version, time.time()),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
