"""What only the SQLite stores have: schema, PRAGMAs, files on disk, error mapping."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_ref.errors import BadInput, PersistenceError
from hermes_ref.models import Event, Lease, Message, Role, SessionRecord, ToolCall
from hermes_ref.shell.sqlite_connect import open_connection
from hermes_ref.shell.sqlite_schema import LATEST_VERSION
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from sim.sqlite_store import SqliteStore


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "hermes.db"


@pytest.fixture
def store(db: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(db)
    yield s
    s.close()


def raw(path: Path) -> sqlite3.Connection:
    """A plain connection, as someone editing the file by hand would have."""
    return sqlite3.connect(path, isolation_level=None)


def sql(path: Path, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Run one statement on a plain connection and close it."""
    conn = raw(path)
    try:
        return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


def with_rows(store: SqliteStore) -> tuple[Lease, tuple[Message, ...]]:
    store.create_session(SessionRecord(id="s1", key="k", system_prompt="p", started_at=1.0))
    lease = store.acquire_lease("s1", "w1", 0.0, 60.0)
    assert lease is not None
    rows = store.append_messages(
        "s1",
        lease.token,
        (
            Message(role=Role.USER, content="hi"),
            Message(role=Role.ASSISTANT, tool_calls=(ToolCall(id="c", name="ls"),)),
        ),
    )
    return lease, rows


# -- schema --------------------------------------------------------------------------------


def test_migrations_are_recorded_and_reopen_is_idempotent(db: Path) -> None:
    store = SqliteStore(db)
    _, rows = with_rows(store)
    store.close()
    first = sql(db, "SELECT version, applied_at FROM schema_migrations")
    assert [v for v, _ in first] == list(range(1, LATEST_VERSION + 1))
    again = SqliteStore(db)
    assert sql(db, "SELECT version, applied_at FROM schema_migrations") == first
    assert again.load_messages("s1") == rows
    again.close()


def test_a_newer_schema_is_refused(db: Path) -> None:
    SqliteStore(db).close()
    sql(db, "INSERT INTO schema_migrations VALUES (?, 0)", (LATEST_VERSION + 98,))
    with pytest.raises(BadInput) as info:
        SqliteStore(db)
    message = str(info.value)
    assert str(LATEST_VERSION + 98) in message and str(LATEST_VERSION) in message
    assert str(db) in message


async def test_a_newer_schema_is_refused_by_the_async_store(db: Path) -> None:
    SqliteStore(db).close()
    sql(db, "INSERT INTO schema_migrations VALUES (?, 0)", (LATEST_VERSION + 1,))
    with pytest.raises(BadInput, match="newer"):
        await AsyncSqliteStore.open(db)


# -- bad files -----------------------------------------------------------------------------


def test_a_garbage_file_is_refused_naming_the_path(db: Path) -> None:
    db.write_bytes(b"this is a text file, not a database\n" * 50)
    with pytest.raises(BadInput) as info:
        SqliteStore(db)
    assert str(db) in str(info.value) and "not a SQLite database" in str(info.value)


def test_a_corrupt_database_is_refused_naming_the_path(db: Path) -> None:
    store = SqliteStore(db)
    with_rows(store)
    store.close()
    sql(db, "PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # keep the header, wreck page 1's b-tree
    db.write_bytes(bytes(data))
    with pytest.raises(BadInput) as info:
        SqliteStore(db)
    assert str(db) in str(info.value)


async def test_a_garbage_file_is_refused_by_the_async_store(db: Path) -> None:
    db.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(BadInput, match="not a SQLite database"):
        await AsyncSqliteStore.open(db)


def test_an_unknown_synchronous_mode_is_refused(db: Path) -> None:
    with pytest.raises(BadInput, match="synchronous"):
        SqliteStore(db, synchronous="EXTRA; DROP TABLE x")


# -- rows that do not decode ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value"),
    [("role", "robot"), ("tool_calls", "not json"), ("tool_calls", '[{"id": 1}]'), ("hidden", 7)],
)
def test_a_hand_corrupted_row_names_table_row_and_column(
    store: SqliteStore, db: Path, column: str, value: object
) -> None:
    lease, rows = with_rows(store)
    target = rows[1].row_id
    hand = raw(db)
    hand.execute("PRAGMA ignore_check_constraints = ON")
    hand.execute(f"UPDATE messages SET {column} = ? WHERE id = ?", (value, target))
    hand.close()
    before = sql(db, "SELECT * FROM messages ORDER BY id")
    for read in (
        lambda: store.load_messages("s1"),
        store.snapshot,
        lambda: store.rewrite_message("s1", lease.token, target or 0, "new"),
    ):
        with pytest.raises(BadInput) as info:
            read()
        assert f"table messages, row {target}, column {column}" in str(info.value)
    assert sql(db, "SELECT * FROM messages ORDER BY id") == before


def test_a_corrupt_event_row_is_named(store: SqliteStore, db: Path) -> None:
    with_rows(store)
    store.log_event(Event(session_id="s1", turn_id="t", kind="turn.started"))
    store.flush_events()
    sql(db, "UPDATE events SET data = '[1, 2]'")
    with pytest.raises(BadInput, match="table events, row 1, column data"):
        store.snapshot()


# -- PRAGMAs -------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "level"), [("FULL", 2), ("NORMAL", 1), ("OFF", 0)])
def test_pragmas_are_applied(db: Path, mode: str, level: int) -> None:
    conn = open_connection(db, synchronous=mode, busy_timeout_ms=1234)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
        assert conn.execute("PRAGMA synchronous").fetchone() == (level,)
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (1234,)
        assert conn.isolation_level is None
    finally:
        conn.close()


async def test_the_async_store_connection_has_the_pragmas(db: Path) -> None:
    store = await AsyncSqliteStore.open(db, synchronous="NORMAL")
    try:
        def read(conn: sqlite3.Connection) -> list[object]:
            return [conn.execute(f"PRAGMA {p}").fetchone()[0]
                    for p in ("journal_mode", "foreign_keys", "synchronous")]

        assert await store._hop(read) == ["wal", 1, 1]
    finally:
        await store.close()


# -- crash and recovery --------------------------------------------------------------------


def test_reopen_after_crash_keeps_commits_and_loses_pending_events(
    store: SqliteStore, db: Path
) -> None:
    _, rows = with_rows(store)
    store.log_event(Event(session_id="s1", turn_id="t", kind="turn.started"))
    store.crash()
    with pytest.raises(PersistenceError) as info:
        store.watermark()
    assert info.value.cause == "closed"
    other = SqliteStore(db)
    assert other.load_messages("s1") == rows and other.snapshot().events == ()
    other.close()
    store.reopen()
    assert store.load_messages("s1") == rows and store.snapshot().events == ()


async def test_async_reopen_after_crash_keeps_commits_and_loses_pending_events(db: Path) -> None:
    store = await AsyncSqliteStore.open(db)
    store.clock = lambda: 0.0  # the grants below are made at t=0 and never expire by it
    await store.create_session(SessionRecord(id="s1", key="k", system_prompt="p", started_at=1))
    lease = await store.acquire_lease("s1", "w", 0.0, 9.0)
    assert lease is not None
    rows = await store.append_messages("s1", lease.token, (Message(role=Role.USER, content="x"),))
    await store.log_event(Event(session_id="s1", turn_id="t", kind="turn.started"))
    await store.crash()
    with pytest.raises(PersistenceError, match="closed"):
        await store.watermark()
    again = await AsyncSqliteStore.open(db)
    try:
        assert await again.load_messages("s1") == rows
        assert (await again.snapshot()).events == ()
    finally:
        await again.close()


# -- errors and counters -------------------------------------------------------------------


def test_a_held_write_lock_maps_to_locked(db: Path) -> None:
    store = SqliteStore(db, busy_timeout_ms=50)
    blocker = raw(db)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(PersistenceError) as info:
            store.create_session(SessionRecord(id="s", key="k", system_prompt="p", started_at=0))
        assert info.value.cause == "locked"
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        store.close()


def test_text_sqlite_cannot_store_is_a_persistence_error(store: SqliteStore) -> None:
    lease, _ = with_rows(store)
    with pytest.raises(PersistenceError) as info:
        store.append_messages("s1", lease.token, (Message(role=Role.USER, content="\ud800"),))
    assert info.value.cause == "encoding"
    assert len(store.load_messages("s1")) == 2


def test_commits_count_committed_write_transactions(store: SqliteStore) -> None:
    lease, _ = with_rows(store)  # create, acquire, append
    assert store.commits == 3
    assert store.acquire_lease("s1", "w2", 1.0, 5.0) is None  # refused: no commit
    store.load_messages("s1")
    store.snapshot()
    store.flush_events()  # nothing pending: no transaction
    assert store.commits == 3
    store.release_lease(lease)
    store.reopen()
    assert store.commits == 4


async def test_async_commits_and_multi_row_ids(db: Path) -> None:
    store = await AsyncSqliteStore.open(db)
    store.clock = lambda: 0.0  # the grants below are made at t=0 and never expire by it
    try:
        await store.create_session(SessionRecord(id="s", key="k", system_prompt="p", started_at=0))
        lease = await store.acquire_lease("s", "w", 0.0, 9.0)
        assert lease is not None
        batch = tuple(Message(role=Role.USER, content=str(i)) for i in range(5))
        rows = await store.append_messages("s", lease.token, batch)
        assert [m.row_id for m in rows] == [1, 2, 3, 4, 5]
        assert await store.load_messages("s") == rows
        assert store.commits == 3
    finally:
        await store.close()
