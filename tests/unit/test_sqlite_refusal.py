"""Opening judges the file first: only a database of ours is opened, anything else is left byte-identical.

Every refusal runs on both stores (the simulator's ``SqliteStore`` and the production
``AsyncSqliteStore``) and compares the main file, its ``-wal``/``-shm``/``-journal``
siblings (bytes, existence and ``mtime_ns``) and the directory listing before and after
the attempt.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermes_ref.errors import BadInput
from hermes_ref.models import SessionRecord
from hermes_ref.shell.sqlite_connect import SIBLINGS, Verdict, classify
from hermes_ref.shell.sqlite_schema import APPLICATION_ID, LATEST_VERSION, MIGRATIONS
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from sim.sqlite_store import SqliteStore

STORES = ("sqlite", "async")
RECORD = SessionRecord(id="s1", key="k", system_prompt="p", started_at=1.0)

FileState = dict[str, tuple[bytes, int] | None]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "hermes.db"


def state(path: Path) -> tuple[FileState, list[str]]:
    """Bytes and mtime_ns of the file and each sibling (None: absent), and the folder listing."""
    files: FileState = {}
    for suffix in ("", *SIBLINGS):
        f = Path(f"{path}{suffix}")
        files[suffix] = (f.read_bytes(), f.stat().st_mtime_ns) if f.is_file() else None
    return files, sorted(os.listdir(path.parent))


async def attempt(kind: str, path: Path) -> None:
    """Open the path with one of the two stores and close it again."""
    if kind == "sqlite":
        SqliteStore(path).close()
    else:
        await (await AsyncSqliteStore.open(path)).close()


async def assert_refused(kind: str, path: Path, *needles: str) -> str:
    """The open is a one-line BadInput naming the path, and nothing on disk changed."""
    before = state(path)
    with pytest.raises(BadInput) as info:
        await attempt(kind, path)
    assert state(path) == before
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    for needle in needles:
        assert needle in message, message
    return message


def sql(path: Path, *statements: str) -> None:
    """Run statements on a plain connection, as another program would, and close it."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def ours(path: Path) -> None:
    """A database of ours with one session, closed cleanly."""
    store = SqliteStore(path)
    store.create_session(RECORD)
    store.close()


def legacy_v1(path: Path) -> None:
    """A database as versions before the application_id mark left it: schema 1, unmarked."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                     "version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        for statement in MIGRATIONS[0].statements:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (1, 0)")
        conn.execute("INSERT INTO sessions (id, key, platform, chat_type, system_prompt, started_at)"
                     " VALUES ('s1', 'k', 'cli', 'dm', 'p', 1.0)")
    finally:
        conn.close()


@pytest.fixture
def live_wal(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Build a WAL database whose last commits are only in its -wal, kept open meanwhile.

    ``make("plain")`` is a WAL database of some other program, ``make("ours")`` one of ours
    with a session committed after creation; both return the main file's path.
    """
    keep: list[Callable[[], None]] = []

    def make(flavour: str) -> Path:
        source = tmp_path / f"source-{flavour}" / "a.db"
        source.parent.mkdir()
        if flavour == "ours":
            store = SqliteStore(source)
            store.create_session(RECORD)
            keep.append(store.crash)
        else:
            conn = sqlite3.connect(source, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute("CREATE TABLE t (x)")
            conn.execute("INSERT INTO t VALUES (1)")
            keep.append(conn.close)
        assert Path(f"{source}-wal").stat().st_size > 0
        return source

    yield make
    for close in keep:
        close()


def copy_with_log(source: Path, target: Path, *, main: bool = True) -> None:
    """Copy a live database's -wal and -shm (and, with ``main``, the file) to ``target``."""
    if main:
        shutil.copyfile(source, target)
    for suffix in ("-wal", "-shm"):
        shutil.copyfile(f"{source}{suffix}", f"{target}{suffix}")


# -- what is opened ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
async def test_an_absent_path_becomes_a_new_marked_database_with_nothing_left_beside_it(
    kind: str, db: Path
) -> None:
    """A path where nothing exists is created as ours: marked, at the latest version, no temporaries."""
    await attempt(kind, db)
    assert os.listdir(db.parent) == [db.name]
    assert db.read_bytes()[68:72] == APPLICATION_ID.to_bytes(4, "big")
    assert classify(db) == (Verdict.OPEN, LATEST_VERSION)


@pytest.mark.parametrize("kind", STORES)
async def test_a_current_database_of_ours_opens_with_its_rows(kind: str, db: Path) -> None:
    """A database of ours at the latest version opens and keeps what it holds."""
    ours(db)
    assert classify(db).verdict is Verdict.OPEN
    if kind == "sqlite":
        store = SqliteStore(db)
        assert store.get_session("s1") == RECORD
        store.close()
    else:
        opened = await AsyncSqliteStore.open(db)
        assert await opened.get_session("s1") == RECORD
        await opened.close()


@pytest.mark.parametrize("kind", STORES)
async def test_an_unmarked_database_of_schema_1_is_migrated_and_marked(kind: str, db: Path) -> None:
    """A file made before the mark existed, with exactly schema 1, is migrated and then marked."""
    legacy_v1(db)
    assert classify(db) == (Verdict.MIGRATE, 1)
    await attempt(kind, db)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]
        assert versions == list(range(1, LATEST_VERSION + 1))
        assert conn.execute("SELECT id FROM sessions").fetchall() == [("s1",)]
    finally:
        conn.close()


@pytest.mark.parametrize("kind", STORES)
async def test_commits_only_in_the_wal_of_our_database_are_recovered(
    kind: str, db: Path, live_wal: Callable[[str], Path]
) -> None:
    """A database of ours copied mid-run (its last commits only in -wal) opens with them."""
    copy_with_log(live_wal("ours"), db)
    if kind == "sqlite":
        store = SqliteStore(db)
        assert store.get_session("s1") == RECORD
        store.close()
    else:
        opened = await AsyncSqliteStore.open(db)
        assert await opened.get_session("s1") == RECORD
        await opened.close()


def test_openers_racing_on_a_new_path_share_one_database(db: Path) -> None:
    """Several stores creating the same new path at once all open the one database that wins."""
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_one() -> None:
        barrier.wait()
        try:
            store = SqliteStore(db)  # a connection is used on the thread that made it
            try:
                seen.append(store.ensure_session(RECORD)[0])
            finally:
                store.close()
        except BaseException as exc:
            errors.append(exc)

    seen: list[SessionRecord] = []
    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and seen == [RECORD] * 4
    assert os.listdir(db.parent) == [db.name]
    assert classify(db) == (Verdict.OPEN, LATEST_VERSION)


def test_a_path_with_uri_characters_is_judged_as_itself(tmp_path: Path) -> None:
    """Characters that mean something in a URI ('?', '#', '%', ' ') do not change which file is read."""
    path = tmp_path / "a b?c#d%20e.db"
    ours(path)
    assert classify(path) == (Verdict.OPEN, LATEST_VERSION)
    (tmp_path / "a b").write_text("a decoy a misread URI would name")
    store = SqliteStore(path)
    assert store.get_session("s1") == RECORD
    store.close()


def test_memory_is_a_private_new_database() -> None:
    """':memory:' opens as a new database of ours with nothing on disk."""
    assert classify(":memory:").verdict is Verdict.MEMORY
    store = SqliteStore(":memory:")
    store.create_session(RECORD)
    assert store.get_session("s1") == RECORD
    store.close()


# -- what is refused, untouched ------------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
async def test_an_empty_file_is_refused(kind: str, db: Path) -> None:
    """A 0-byte file is not adopted as a new database."""
    db.write_bytes(b"")
    await assert_refused(kind, db, "empty file (0 bytes)")


@pytest.mark.parametrize("kind", STORES)
async def test_a_text_file_is_refused(kind: str, db: Path) -> None:
    """A text file is not SQLite and is refused, showing how it starts."""
    db.write_text("notes about my week\n" * 200)
    await assert_refused(kind, db, "not a SQLite database", "notes about my")


@pytest.mark.parametrize("kind", STORES)
async def test_random_bytes_are_refused(kind: str, db: Path) -> None:
    """A file of random bytes is not SQLite and is refused."""
    db.write_bytes(random.Random(7).randbytes(16384))
    await assert_refused(kind, db, "not a SQLite database")


@pytest.mark.parametrize("kind", STORES)
async def test_a_truncated_database_is_refused(kind: str, db: Path) -> None:
    """The first bytes of a database of ours, cut short, are refused as not usable, with the size."""
    ours(db)
    db.write_bytes(db.read_bytes()[:60])
    await assert_refused(kind, db, "not a usable SQLite database", "(60 bytes)")


@pytest.mark.parametrize("kind", STORES)
async def test_a_corrupt_database_of_ours_is_refused(kind: str, db: Path) -> None:
    """A database of ours whose first page is wrecked is refused as not usable."""
    ours(db)
    data = bytearray(db.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # keep the header, wreck page 1's b-tree
    db.write_bytes(bytes(data))
    await assert_refused(kind, db, "not a usable SQLite database")


@pytest.mark.parametrize("kind", STORES)
async def test_a_foreign_database_with_a_messages_table_is_refused(kind: str, db: Path) -> None:
    """Another program's database that has a 'messages' table is refused, and gains no table."""
    sql(db, "CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)",
        "INSERT INTO messages (body) VALUES ('hello')")
    await assert_refused(kind, db, "not a hermes-ref database", "tables: messages")


@pytest.mark.parametrize("kind", STORES)
async def test_an_empty_sqlite_database_is_refused(kind: str, db: Path) -> None:
    """A SQLite database with no tables and no mark is not ours."""
    sql(db, "PRAGMA user_version = 7")
    await assert_refused(kind, db, "no tables")


@pytest.mark.parametrize("kind", STORES)
async def test_another_applications_database_is_refused(kind: str, db: Path) -> None:
    """A database marked with another application_id is refused, naming both ids."""
    sql(db, "PRAGMA application_id = 305419896", "CREATE TABLE t (x)")
    await assert_refused(kind, db, "0x12345678", f"{APPLICATION_ID:#010x}")


@pytest.mark.parametrize("kind", STORES)
async def test_a_foreign_schema_migrations_table_is_not_a_mark(kind: str, db: Path) -> None:
    """Another migration tool's 'schema_migrations' table does not make a file ours."""
    sql(db, "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, dirty BOOLEAN NOT NULL)",
        "INSERT INTO schema_migrations VALUES (1, 0)")
    await assert_refused(kind, db, "tables: schema_migrations")


@pytest.mark.parametrize("kind", STORES)
async def test_an_unmarked_copy_of_our_schema_with_more_tables_is_refused(kind: str, db: Path) -> None:
    """Without the mark, only exactly an old schema of ours is ours: one extra table is refused."""
    legacy_v1(db)
    sql(db, "CREATE TABLE notes (x)")
    await assert_refused(kind, db, "not a hermes-ref database", "notes")


@pytest.mark.parametrize("kind", STORES)
async def test_a_newer_database_of_ours_is_refused(kind: str, db: Path) -> None:
    """A database of ours at a schema version newer than this program's is refused."""
    ours(db)
    sql(db, f"INSERT INTO schema_migrations VALUES ({LATEST_VERSION + 1}, 0)")
    await assert_refused(kind, db, "newer", str(LATEST_VERSION + 1))


@pytest.mark.parametrize("kind", STORES)
async def test_a_directory_is_refused(kind: str, db: Path) -> None:
    """A directory at the path is refused as not a regular file."""
    db.mkdir()
    await assert_refused(kind, db, "not a regular file")


@pytest.mark.parametrize("kind", STORES)
async def test_a_dangling_symlink_is_refused(kind: str, db: Path) -> None:
    """A symbolic link to a missing file is refused, not followed to create its target."""
    db.symlink_to(db.parent / "elsewhere.db")
    await assert_refused(kind, db, "symbolic link")


@pytest.mark.parametrize("flavour", ["plain", "ours"])
@pytest.mark.parametrize("kind", STORES)
async def test_a_foreign_file_beside_a_stale_wal_is_refused_and_the_wal_is_not_merged(
    kind: str, flavour: str, db: Path, live_wal: Callable[[str], Path]
) -> None:
    """A foreign database next to another database's live -wal/-shm is refused; no log is replayed."""
    sql(db, "CREATE TABLE foreign_notes (x)", "INSERT INTO foreign_notes VALUES ('mine')")
    copy_with_log(live_wal(flavour), db, main=False)
    await assert_refused(kind, db, "tables: foreign_notes", f"{db}-wal was not read")
    await assert_refused(kind, db)  # and again: nothing was merged by the first attempt


@pytest.mark.parametrize("kind", STORES)
async def test_an_unmarked_main_file_whose_schema_is_only_in_a_wal_is_refused(
    kind: str, db: Path, live_wal: Callable[[str], Path]
) -> None:
    """An empty SQLite file beside a -wal holding a schema is refused: whose log it is cannot be known."""
    sql(db, "PRAGMA user_version = 7")
    copy_with_log(live_wal("ours"), db, main=False)
    await assert_refused(kind, db, "no tables", "was not read")


@pytest.mark.parametrize("suffix", ["-wal", "-journal"])
@pytest.mark.parametrize("kind", STORES)
async def test_leftover_siblings_without_a_main_file_are_refused(
    kind: str, suffix: str, db: Path, live_wal: Callable[[str], Path]
) -> None:
    """A missing path next to another database's log is not created: that log would be replayed into it."""
    source = live_wal("plain")
    if suffix == "-wal":
        copy_with_log(source, db, main=False)
    else:
        Path(f"{db}-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + bytes(504))
    await assert_refused(kind, db, f"{db}{suffix}", "left over")
    assert not db.exists()


def test_a_marked_file_unreadable_beside_a_wal_is_left_to_the_locked_open(
    db: Path, live_wal: Callable[[str], Path]
) -> None:
    """Marked but unreadable beside a -wal (a checkpoint may be in flight): the locked open decides."""
    ours(db)
    data = bytearray(db.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)
    db.write_bytes(bytes(data))
    with pytest.raises(BadInput, match="not a usable SQLite database"):
        classify(db)  # no -wal: nobody can be writing it, so the damage is real
    copy_with_log(live_wal("ours"), db, main=False)
    assert classify(db) == (Verdict.MIGRATE, None)
