"""A Hermes Agent ``state.db`` of schema version 22, for fixtures and tests.

Theory of operation
-------------------
The DDL below follows the schema of a Hermes Agent 0.19.0 ``state.db`` (version 22;
``fixtures/hermes/`` holds databases recorded from real runs): the tables the auditor
reads (``sessions`` with its 46 columns, ``messages``), the ones beside them
(``schema_version``, ``session_model_usage``, ``state_meta``, ``gateway_routing``,
``compression_locks``, ``async_delegations``), the full-text index with its triggers, and
the indexes. ``HermesDb`` writes sessions and messages the way 0.19.0 does: the system
prompt in ``sessions.system_prompt``, ``tool_calls`` as wire objects with ``call_id``
and ``response_item_id``, ``active = 1`` and ``compacted = 0``, WAL journal mode.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

SESSION_COLUMNS = (
    "id TEXT PRIMARY KEY", "source TEXT NOT NULL", "user_id TEXT", "session_key TEXT",
    "chat_id TEXT", "chat_type TEXT", "thread_id TEXT", "display_name TEXT", "origin_json TEXT",
    "expiry_finalized INTEGER DEFAULT 0", "model TEXT", "model_config TEXT",
    "system_prompt TEXT", "parent_session_id TEXT REFERENCES sessions(id)",
    "started_at REAL NOT NULL", "ended_at REAL", "end_reason TEXT",
    "message_count INTEGER DEFAULT 0", "tool_call_count INTEGER DEFAULT 0",
    "input_tokens INTEGER DEFAULT 0", "output_tokens INTEGER DEFAULT 0",
    "cache_read_tokens INTEGER DEFAULT 0", "cache_write_tokens INTEGER DEFAULT 0",
    "reasoning_tokens INTEGER DEFAULT 0", "billing_provider TEXT", "billing_base_url TEXT",
    "billing_mode TEXT", "estimated_cost_usd REAL", "actual_cost_usd REAL", "cost_status TEXT",
    "cost_source TEXT", "pricing_version TEXT", "cwd TEXT", "git_branch TEXT",
    "git_repo_root TEXT", "title TEXT", "api_call_count INTEGER DEFAULT 0",
    "handoff_target TEXT", "handoff_summary TEXT", "compression_failure_cooldown_until REAL",
    "compression_failure_error TEXT", "compression_fallback_streak INTEGER DEFAULT 0",
    "profile_name TEXT", "rewind_count INTEGER DEFAULT 0", "archived INTEGER DEFAULT 0",
    "handoff_at REAL",
)
MESSAGE_COLUMNS = (
    "id INTEGER PRIMARY KEY AUTOINCREMENT",
    "session_id TEXT NOT NULL REFERENCES sessions(id)", "role TEXT NOT NULL", "content TEXT",
    "tool_call_id TEXT", "tool_calls TEXT", "tool_name TEXT", "effect_disposition TEXT",
    "timestamp REAL NOT NULL", "token_count INTEGER", "finish_reason TEXT", "reasoning TEXT",
    "reasoning_content TEXT", "reasoning_details TEXT", "codex_reasoning_items TEXT",
    "codex_message_items TEXT", "platform_message_id TEXT", "observed INTEGER",
    "active INTEGER DEFAULT 1", "compacted INTEGER DEFAULT 0", "api_content TEXT",
)
DDL = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    f"CREATE TABLE sessions ({', '.join(SESSION_COLUMNS)})",
    f"CREATE TABLE messages ({', '.join(MESSAGE_COLUMNS)})",
    """CREATE TABLE session_model_usage (session_id TEXT NOT NULL, model TEXT NOT NULL,
        billing_provider TEXT NOT NULL DEFAULT '', billing_base_url TEXT NOT NULL DEFAULT '',
        billing_mode TEXT NOT NULL DEFAULT '', task TEXT NOT NULL DEFAULT '',
        api_call_count INTEGER DEFAULT 0, input_tokens INTEGER DEFAULT 0,
        output_tokens INTEGER DEFAULT 0, estimated_cost_usd REAL, first_seen REAL,
        last_seen REAL, PRIMARY KEY (session_id, model, billing_provider, billing_base_url,
        billing_mode, task))""",
    "CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT)",
    """CREATE TABLE gateway_routing (scope TEXT NOT NULL, session_key TEXT NOT NULL,
        entry_json TEXT NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (scope, session_key))""",
    """CREATE TABLE compression_locks (session_id TEXT PRIMARY KEY, holder TEXT NOT NULL,
        acquired_at REAL NOT NULL, expires_at REAL NOT NULL)""",
    """CREATE TABLE async_delegations (id TEXT PRIMARY KEY, session_id TEXT, status TEXT,
        payload_json TEXT, created_at REAL, updated_at REAL)""",
    "CREATE VIRTUAL TABLE messages_fts USING fts5(content)",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id,
            coalesce(new.content, '') || ' ' || coalesce(new.tool_name, '') || ' ' ||
            coalesce(new.tool_calls, ''));
    END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        DELETE FROM messages_fts WHERE rowid = old.id;
    END""",
    "CREATE INDEX idx_messages_session ON messages(session_id, timestamp)",
    "CREATE INDEX idx_messages_session_active ON messages(session_id, active, timestamp)",
    "CREATE INDEX idx_sessions_started ON sessions(started_at DESC)",
    "CREATE INDEX idx_sessions_parent ON sessions(parent_session_id)",
    "CREATE UNIQUE INDEX idx_sessions_title ON sessions(title) WHERE title IS NOT NULL",
)


class HermesDb:
    """Writes a v22 ``state.db`` the way Hermes Agent 0.19.0 writes one."""

    def __init__(self, path: str | Path, *, fts: bool = True) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=wal")
        self.conn.execute("BEGIN")
        for statement in DDL:
            if fts or "fts" not in statement:
                self.conn.execute(statement)
        self.conn.execute("INSERT INTO schema_version VALUES (22)")
        self.conn.execute("COMMIT")
        self._clock = 1_764_000_000.0

    def session(self, sid: str, *, parent: str | None = None, ended: bool = True,
                reason: str | None = "agent_close", source: str = "cli") -> str:
        self._clock += 1
        self.conn.execute(
            "INSERT INTO sessions (id, source, model, system_prompt, parent_session_id, "
            "started_at, ended_at, end_reason) VALUES (?, ?, 'fake-model', 'You are Hermes.', "
            "?, ?, ?, ?)", (sid, source, parent, self._clock,
                            self._clock + 0.5 if ended else None, reason))
        return sid

    def message(self, sid: str, role: str, content: str | None = "", *,
                calls: list[tuple[str, str, dict[str, Any]]] | None = None,
                answers: str | None = None, tool_name: str | None = None,
                active: int = 1, raw_calls: str | None = None) -> int:
        self._clock += 0.01
        stored = raw_calls if raw_calls is not None else (json.dumps([
            {"id": cid, "call_id": cid, "response_item_id": f"fc_{cid}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for cid, name, args in calls]) if calls else None)
        finish = "tool_calls" if calls else ("stop" if role == "assistant" else None)
        cursor = self.conn.execute(
            "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, "
            "tool_name, timestamp, finish_reason, active) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (sid, role, content, answers, stored, tool_name, self._clock, finish, active))
        return int(cursor.lastrowid or 0)

    def close(self) -> None:
        self.conn.close()
