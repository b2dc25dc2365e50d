"""The fixtures stay true: the schema dump matches the live schema, recorded bodies parse."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hermes_ref.errors import ContextOverflow, RateLimited
from hermes_ref.models import Role
from hermes_ref.shell.chat_wire import StreamAssembler, error_for_status, parse_completion
from sim.harness import Story
from sim.provider import load_script
from sim.sqlite_store import SqliteStore

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _schema(db: Path) -> str:
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
                        "AND name NOT LIKE 'sqlite_%' ORDER BY type, name").fetchall()
    version = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
    conn.close()
    return f"-- hermes-ref durable record, schema version {version}\n" + "".join(
        f"{sql};\n" for _, _, sql in rows)


def test_schema_dump_matches_a_fresh_database(tmp_path: Path) -> None:
    """A schema change without a migration and a new dump fails here."""
    SqliteStore(tmp_path / "fresh.db").close()
    assert _schema(tmp_path / "fresh.db") == (FIXTURES / "schema.sql").read_text()


@pytest.mark.parametrize("name", ["text_reply.json", "completion_with_extras.json"])
def test_text_bodies_parse(name: str) -> None:
    """Whole-body completions, with or without the extra fields servers add, parse to text."""
    reply = parse_completion(json.loads((FIXTURES / "provider" / name).read_text()))
    assert reply.content is not None and "milk" in reply.content and not reply.tool_calls


def _assemble(name: str) -> object:
    assembler = StreamAssembler()
    for line in (FIXTURES / "provider" / name).read_text().splitlines():
        assembler.feed_line(line)
    return assembler.finish()


def test_streams_assemble_to_the_same_reply_as_the_body() -> None:
    """A streamed tool call assembles to the same call as its whole-body twin."""
    whole = parse_completion(json.loads((FIXTURES / "provider" / "tool_call_reply.json").read_text()))
    assert _assemble("tool_call_stream.sse") == whole


def test_fragmented_stream_with_usage_chunk_assembles() -> None:
    """Arguments split mid-token join exactly; the empty-choices usage chunk sets usage."""
    reply = _assemble("stream_with_usage_chunk.sse")
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [  # type: ignore[attr-defined]
        ("call_Xq2", "read_file", '{"path": "notes.txt"}')]
    assert reply.usage.prompt_tokens == 84  # type: ignore[attr-defined]


def test_error_bodies_map_to_typed_errors() -> None:
    """A 400 context-length body is ContextOverflow; a 429 keeps its Retry-After."""
    overflow = error_for_status(400, (FIXTURES / "provider" / "error_context_length.json").read_bytes(),
                                retry_after=None, now=0.0)
    limited = error_for_status(429, (FIXTURES / "provider" / "error_rate_limit.json").read_bytes(),
                               retry_after="7", now=0.0)
    assert isinstance(overflow, ContextOverflow)
    assert isinstance(limited, RateLimited) and limited.retry_after_s == 7.0


@pytest.mark.parametrize("name", ["one_tool_round.json", "flaky_provider.json"])
def test_example_scripts_drive_a_full_turn(name: str, tmp_path: Path) -> None:
    """Each example script plays a whole turn on the engine, consumed, with every checker holding."""
    story = Story(store_kind="memory", workdir=tmp_path, trace=False)
    story.files({"notes.txt": "buy milk"})
    provider = load_script(FIXTURES / "scripts" / name)
    story.use_provider(provider)
    result = story.turn("Please help with my notes.")
    provider.assert_consumed()
    assert result is not None and result.completed
    assert story.transcript()[-1].role is Role.ASSISTANT
    assert not story.violations, [str(v) for v in story.violations]
