"""The auditor on Hermes state.db and hermes-ref databases: each violation, each open turn."""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from sim.audit.cli import audit
from sim.audit.hermes_v22 import HermesDb
from sim.cli import main

Build = Callable[[HermesDb], None]
CALL = ("call_1", "terminal", {"command": "echo ok"})


def happy(db: HermesDb, sid: str = "20261129_181230_98276b") -> None:
    """The rows of the documented happy run: user, assistant call, tool result, answer."""
    db.session(sid)
    db.message(sid, "user", "Run echo ok in the terminal.")
    db.message(sid, "assistant", "", calls=[CALL])
    db.message(sid, "tool", '{"output": "ok"}', answers="call_1", tool_name="terminal")
    db.message(sid, "assistant", "ok")


def build(tmp_path: Path, *steps: Build) -> Path:
    path = tmp_path / "state.db"
    db = HermesDb(path)
    for step in steps:
        step(db)
    db.close()
    return path


def findings(path: Path, strict: bool = False) -> list[tuple[str, str]]:
    return [(f.kind, f.invariant) for f in audit(path).findings]


def test_a_clean_database_passes(tmp_path: Path) -> None:
    """The happy run's rows hold every invariant: no finding, exit 0."""
    path = build(tmp_path, happy)
    out = io.StringIO()
    assert main(["audit", str(path)], out=out) == 0
    assert out.getvalue().splitlines()[-1].endswith("0 violation(s), 0 open turn(s)")


def rows(*spec: tuple[str, str | None, object]) -> Build:
    """A session 's' whose rows are (role, answered id, calls or raw tool_calls text)."""
    def step(db: HermesDb) -> None:
        db.session("s")
        for role, answers, calls in spec:
            db.message("s", role, "text", answers=answers,
                       calls=calls if isinstance(calls, list) else None,
                       raw_calls=calls if isinstance(calls, str) else None)
    return step


U, A, T = "user", "assistant", "tool"
C1, C2 = ("c1", "f", {}), ("c2", "f", {})
VIOLATIONS = {
    "result-without-call": (rows((U, None, None), (T, "c9", None), (A, None, None)), "TOOL-3"),
    "second-result": (rows((U, None, None), (A, None, [C1]), (T, "c1", None), (T, "c1", None),
                           (A, None, None)), "TOOL-3"),
    "answered-late": (rows((U, None, None), (A, None, [C1]), (A, None, None)), "TOOL-3"),
    "one-id-twice-in-a-row": (rows((U, None, None), (A, None, [C1, C1]), (T, "c1", None),
                                   (A, None, None)), "TOOL-3"),
    "out-of-order": (rows((U, None, None), (A, None, [C1, C2]), (T, "c2", None),
                          (T, "c1", None), (A, None, None)), "TOOL-5"),
    "unreadable-calls": (rows((U, None, None), (A, None, "{not json"), (A, None, None)),
                         "TOOL-2"),
    "user-after-call": (rows((U, None, None), (A, None, [C1]), (U, None, None),
                             (A, None, None)), "FIN-4"),
    "user-after-tool": (rows((U, None, None), (A, None, [C1]), (T, "c1", None),
                             (U, None, None), (A, None, None)), "FIN-5"),
    "ended-on-call": (rows((U, None, None), (A, None, [C1])), "FIN-4"),
    "ended-on-tool": (rows((U, None, None), (A, None, [C1]), (T, "c1", None)), "FIN-8"),
    "ended-on-user": (rows((U, None, None)), "FIN-5"),
}


@pytest.mark.parametrize("name", list(VIOLATIONS))
def test_each_violation_is_found_under_its_id(tmp_path: Path, name: str) -> None:
    """A database with one kind of violation: one finding of that id, and exit 1."""
    step, invariant = VIOLATIONS[name]
    path = build(tmp_path, step)
    assert findings(path) == [("violation", invariant)]
    assert main(["audit", str(path)], out=io.StringIO()) == 1


@pytest.mark.parametrize(("tail", "invariant"), [
    ([(U, None, None)], "FIN-5"),
    ([(U, None, None), (A, None, [C1])], "FIN-4"),
    ([(U, None, None), (A, None, [C1]), (T, "c1", None)], "FIN-8"),
], ids=["user", "unanswered-call", "tool"])
def test_each_open_turn_is_reported_and_strict_fails_it(
        tmp_path: Path, tail: list[tuple[str, str | None, object]], invariant: str) -> None:
    """A live session's open tail is an open turn: exit 0, and exit 1 with --strict."""
    def live(db: HermesDb) -> None:
        db.session("live", ended=False, reason=None)
        for role, answers, calls in tail:
            db.message("live", role, "x", answers=answers,
                       calls=calls if isinstance(calls, list) else None)

    path = build(tmp_path, happy, live)
    assert findings(path) == [("open", invariant)]
    out = io.StringIO()
    assert main(["audit", str(path)], out=out) == 0
    assert "OPEN TURN" in out.getvalue() and "session live" in out.getvalue()
    assert main(["audit", str(path), "--strict"], out=io.StringIO()) == 1


def test_sessions_scaffolding_and_lineage(tmp_path: Path) -> None:
    """SES-2 ends without reasons, SCAF-1 stored nudges, CMP-5 broken lineage."""
    from hermes_ref.scaffolding import DROPPED_TOOLCALL_NUDGE

    def broken(db: HermesDb) -> None:
        db.session("no-reason", reason=None)
        db.session("reason-only", ended=False, reason="agent_close")
        db.session("parent", ended=False, reason=None)
        db.session("child", parent="parent")
        db.session("scaf")
        db.message("scaf", "user", DROPPED_TOOLCALL_NUDGE)
        db.message("scaf", "assistant", "ok")
        db.conn.execute("PRAGMA foreign_keys=OFF")
        db.session("orphan", parent="gone")

    path = build(tmp_path, broken)
    assert sorted(findings(path)) == sorted([
        ("violation", "SES-2"), ("violation", "SES-2"), ("violation", "CMP-5"),
        ("violation", "SCAF-1"), ("violation", "CMP-5")])


def test_a_later_round_may_reuse_an_id(tmp_path: Path) -> None:
    """Pairing is per round, as on the wire: call_0 in two rounds, each answered, is clean."""
    again = rows((U, None, None), (A, None, [C1]), (T, "c1", None), (A, None, [C1]),
                 (T, "c1", None), (A, None, None))
    assert findings(build(tmp_path, again)) == []


def test_compacted_rows_are_not_paired(tmp_path: Path) -> None:
    """Rows compacted away (active = 0) are not part of the live transcript."""
    def compacted(db: HermesDb) -> None:
        happy(db, "s")
        db.message("s", "assistant", "", calls=[("old", "f", {})], active=0)

    assert findings(build(tmp_path, compacted)) == []


def test_json_output_is_one_document(tmp_path: Path) -> None:
    """--json prints one document with the counts and every finding."""
    path = build(tmp_path, VIOLATIONS["out-of-order"][0])
    out = io.StringIO()
    assert main(["audit", str(path), "--json"], out=out) == 1
    report = json.loads(out.getvalue())
    assert (report["schema"], report["schema_version"], report["violations"]) == ("hermes", 22, 1)
    assert report["findings"][0] == {"kind": "violation", "invariant": "TOOL-5", "session": "s",
                                     "message_id": 3, "detail": report["findings"][0]["detail"]}


def test_refuses_what_is_no_transcript_database(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Missing, empty, not SQLite, corrupt, foreign or the wrong --schema: one line, exit 2."""
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE things (x)")
    other_app = tmp_path / "other.db"
    with sqlite3.connect(other_app) as conn:
        conn.execute("PRAGMA application_id = 1234")
        conn.execute("CREATE TABLE t (x)")
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"SQLite format 3\x00" + b"\xff" * 2000)
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "text.db").write_text("hello")
    hermes = build(tmp_path, happy)
    cases = {
        str(tmp_path / "nowhere" / "x.db"): "does not exist",
        str(tmp_path / "empty.db"): "empty file",
        str(tmp_path / "text.db"): "not a SQLite database",
        str(corrupt): "SQLite database",
        str(foreign): "not a transcript database",
        str(other_app): "another application",
    }
    before = {p: Path(p).read_bytes() for p in cases if Path(p).exists()}
    for path, says in cases.items():
        assert main(["audit", path]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert main(["audit", str(hermes), "--schema", "ref"]) == 2
    assert "holds the hermes schema" in capsys.readouterr().err
    assert {p: Path(p).read_bytes() for p in before} == before


def test_a_wal_that_cannot_be_copied_is_a_one_line_error(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """When the database and its -wal cannot be copied aside, the audit says so and exits 2."""
    path = build(tmp_path, happy)
    (tmp_path / (path.name + "-wal")).mkdir()  # a -wal that is not a file
    assert main(["audit", str(path)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "could not copy" in err and "Traceback" not in err


def test_the_recording_command_checks_its_arguments(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The Hermes recording command refuses missing arguments, a missing binary or folder."""
    from sim.serve.hermes_agent import main as record
    assert record([]) == 2
    assert record([str(tmp_path / "no-hermes"), str(tmp_path)]) == 2
    assert record([__file__, str(tmp_path / "no-folder")]) == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "not an executable" in err and "Traceback" not in err
