"""``hermes-ref audit PATH [--schema auto|ref|hermes] [--json] [--strict]``.

Theory of operation
-------------------
``audit(path, schema)`` opens the database read-only (``sim.audit.source``), picks the
reader (``auto`` detects it; naming a schema the file does not hold is refused), runs
every judge and returns an ``Audit``. The command prints one line per finding (kind,
invariant id, session, message id, what is wrong), then one summary line; ``--json``
prints one JSON document instead. Exit status: 0 when no violation was found, 1 when
one was (with ``--strict`` an open turn counts as one), 2 for a path that is no
transcript database (missing, not SQLite, corrupt, another program's), in one line.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hermes_ref.errors import BadInput
from sim.audit import read_hermes, read_ref
from sim.audit.judges import judge
from sim.audit.record import OPEN, VIOLATION, Finding
from sim.audit.source import detect, open_readonly

READERS = {"ref": read_ref.read, "hermes": read_hermes.read}


@dataclass
class Audit:
    path: str
    schema: str
    version: int | None
    sessions: int
    messages: int
    findings: list[Finding]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def violations(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == VIOLATION]

    @property
    def open_turns(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == OPEN]

    def failed(self, strict: bool = False) -> bool:
        return bool(self.violations or (strict and self.open_turns))

    def summary(self) -> str:
        version = f" v{self.version}" if self.version is not None else ""
        return (f"audit {self.path} ({self.schema}{version}): {self.sessions} session(s), "
                f"{self.messages} message(s); {len(self.violations)} violation(s), "
                f"{len(self.open_turns)} open turn(s)")

    def as_json(self, strict: bool = False) -> dict[str, Any]:
        return {"path": self.path, "schema": self.schema, "schema_version": self.version,
                "sessions": self.sessions, "messages": self.messages,
                "violations": len(self.violations), "open_turns": len(self.open_turns),
                "strict": strict, "ok": not self.failed(strict), "notes": self.notes,
                "findings": [f.as_json() for f in self.findings]}


def audit(path: str | Path, schema: str = "auto") -> Audit:
    """Judge the database at ``path``; ``BadInput`` when it is no transcript database."""
    where = str(path)
    started = time.perf_counter()
    with open_readonly(where) as conn:
        found, version = detect(conn, where)
        if schema not in ("auto", found):
            raise BadInput(f"{where}: --schema {schema} given, but the file holds the "
                           f"{found} schema")
        try:
            record = READERS[found](conn, version)
            findings, count = judge(record)
        except Exception as exc:  # sqlite3.DatabaseError mid-scan: a damaged file
            if type(exc).__module__ != "sqlite3":
                raise
            raise BadInput(f"{where}: a damaged SQLite database: {exc}") from exc
    return Audit(where, found, version, len(record.sessions), count, findings,
                 time.perf_counter() - started, record.notes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="the SQLite transcript database (never changed)")
    parser.add_argument("--schema", choices=("auto", "ref", "hermes"), default="auto")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--strict", action="store_true", help="an open turn is a violation")


def main(args: argparse.Namespace, out: TextIO) -> int:
    result = audit(args.path, args.schema)
    if args.json:
        out.write(json.dumps(result.as_json(args.strict), indent=2) + "\n")
    else:
        for finding in result.findings:
            out.write(finding.line() + "\n")
        for note in result.notes:
            out.write(f"note: {note}\n")
        out.write(result.summary() + "\n")
    return 1 if result.failed(args.strict) else 0
