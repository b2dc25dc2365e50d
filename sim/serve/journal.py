"""The request journal: one JSON line per request, what the agent sent and what it got.

Theory of operation
-------------------
A record holds the request (method, path, headers with the credential masked, the body
as JSON, or as text when it is not JSON), the fields the API does not know
(``unknown``), the route and step that answered, the status, the reply (the JSON body,
or the list of stream events), and three timings in seconds: ``at_s`` since the server
started, ``gap_s`` since the previous request arrived (the agent's backoff between
retries is read here), and ``duration_s`` until the answer was played out.

Records are written in the order requests *finish*, each with its arrival number
``seq``, under a lock, flushed line by line, so a journal is readable while the server
runs and complete after it stops. The journal file must not exist yet: a journal never
overwrites a file (``open_journal`` says so in one line).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import IO, Any

from hermes_ref.errors import BadInput


def open_journal(path: str | Path) -> IO[str]:
    """A new journal file; ``BadInput`` when the folder is missing or the file exists."""
    where = Path(path)
    if not where.parent.is_dir():
        raise BadInput(f"{path}: the journal's folder {str(where.parent)!r} does not exist")
    try:
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError as exc:
        raise BadInput(f"{path}: the journal file already exists; give a new path") from exc
    except OSError as exc:
        raise BadInput(f"{path}: cannot create the journal: {exc.strerror}") from exc
    return os.fdopen(fd, "w", encoding="utf-8")


def masked(headers: list[tuple[str, str]]) -> dict[str, str]:
    """Request headers with the credential's value cut to its scheme and last four chars."""
    result: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key in ("authorization", "api-key", "x-api-key"):
            scheme, _, secret = value.partition(" ")
            secret = secret or scheme
            value = (f"{scheme} " if secret is not scheme else "") + f"…{secret[-4:]}"
        result[key] = value
    return result


def body_value(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return body.decode("utf-8", "replace")


class Journal:
    """Thread-safe JSONL writer; a ``Journal(None)`` keeps records in memory only."""

    def __init__(self, stream: IO[str] | None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=True)
        with self._lock:
            self.records.append(record)
            if self._stream is not None:
                self._stream.write(line + "\n")
                self._stream.flush()

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
