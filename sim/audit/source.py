"""Open a transcript database strictly read-only, and tell which schema it holds.

Theory of operation
-------------------
An audit must not change one byte of any file. A plain SQLite connection, even
``mode=ro``, would take a ``-wal`` found beside the file as part of the database, build
or rewrite its ``-shm``, and a read-write one would checkpoint the log into the file on
close. So ``open_readonly`` does one of two things:

* with no ``-wal`` beside the file (or an empty one), it opens the file itself with
  ``mode=ro&immutable=1``: no locks taken, no sibling created or read;
* with a non-empty ``-wal`` (a process was killed, or is still writing), it copies the
  file and its log into a private temporary folder and opens the copy, where SQLite may
  recover the log as it likes. The copy is checked for a torn read (the originals' sizes
  and mtimes before and after the copy must agree) and removed when the audit ends.

``detect`` names the schema: ``ref`` (this project's ``application_id``, or its
``schema_migrations`` and ``sessions.key``), ``hermes`` (``schema_version`` and
``sessions.source``), or refuses the file. Every refusal is one ``BadInput`` line naming
the path and what was found: no such file, not a regular file, empty, not SQLite,
corrupt, another application's database.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hermes_ref.errors import BadInput
from hermes_ref.shell.sqlite_schema import APPLICATION_ID

_MAGIC = b"SQLite format 3\x00"
SCHEMAS = ("ref", "hermes")


def _check_file(where: str) -> os.stat_result:
    try:
        info = os.stat(where)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(where))
        if not os.path.isdir(parent):
            raise BadInput(f"{where}: no such file (the folder {parent!r} does not exist)") from None
        raise BadInput(f"{where}: no such file") from None
    except OSError as exc:
        raise BadInput(f"{where}: cannot read: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise BadInput(f"{where}: not a regular file, so not a database")
    if info.st_size == 0:
        raise BadInput(f"{where}: an empty file (0 bytes), not a transcript database")
    try:
        with open(where, "rb") as handle:
            head = handle.read(len(_MAGIC))
    except OSError as exc:
        raise BadInput(f"{where}: cannot read: {exc.strerror}") from exc
    if head != _MAGIC:
        raise BadInput(f"{where}: not a SQLite database (it starts with {head[:8]!r})")
    return info


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_size, info.st_mtime_ns)


@contextmanager
def open_readonly(path: str | Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``path`` (or to a private copy of it and its log)."""
    where = str(path)
    _check_file(where)
    wal = where + "-wal"
    if (_stamp(wal) or (0, 0))[0] == 0:
        uri = Path(os.path.abspath(where)).as_uri() + "?mode=ro&immutable=1"
        conn = _connect(uri, where)
        try:
            yield conn
        finally:
            conn.close()
        return
    with tempfile.TemporaryDirectory(prefix="hermes-audit-") as tmp:
        copy = os.path.join(tmp, "copy.db")
        before = (_stamp(where), _stamp(wal))
        try:
            shutil.copyfile(where, copy)
            shutil.copyfile(wal, copy + "-wal")
        except OSError as error:  # no room in the temporary folder, an unreadable -wal, ...
            raise BadInput(f"{where}: could not copy the database and its -wal to read them "
                           f"unchanged: {error.strerror or error}") from error
        if (_stamp(where), _stamp(wal)) != before:
            raise BadInput(f"{where}: the database changed while it was copied (a process is "
                           "writing to it); audit it when the writer is done")
        conn = _connect(Path(copy).as_uri(), where)
        try:
            yield conn
        finally:
            conn.close()


def _connect(uri: str, where: str) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise BadInput(f"{where}: not a readable SQLite database: {exc}") from exc
    return conn


def columns(conn: sqlite3.Connection, table: str) -> frozenset[str]:
    """The columns of ``table`` (empty when there is no such table)."""
    return frozenset(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))


def detect(conn: sqlite3.Connection, where: str) -> tuple[str, int | None]:
    """``(schema, version)`` of an open database; ``BadInput`` for a foreign one."""
    try:
        app: int = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        sessions = columns(conn, "sessions")
        if app == APPLICATION_ID or ("schema_migrations" in tables and "key" in sessions):
            version = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
            return "ref", version
        if app == 0 and "schema_version" in tables and "source" in sessions:
            version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
            return "hermes", version
    except sqlite3.Error as exc:
        raise BadInput(f"{where}: a damaged SQLite database: {exc}") from exc
    if app not in (0, APPLICATION_ID):
        raise BadInput(f"{where}: a SQLite database of another application (application_id "
                       f"{app & 0xFFFFFFFF:#010x}), not a transcript database")
    shown = ", ".join(sorted(tables)[:6]) or "none"
    raise BadInput(f"{where}: a SQLite database but not a transcript database of hermes-ref "
                   f"or Hermes Agent (tables: {shown})")
