"""The auditor: judge any transcript database from its durable record alone.

Theory of operation
-------------------
``hermes-ref audit PATH`` reads a SQLite transcript database, this project's or a Hermes
Agent ``state.db`` (schema version 22), and reports every breach of the invariants that
the record alone can decide. The pieces:

* ``source``: opens the file strictly read-only (a file left in WAL mode by a killed
  process is read through a private copy of the file and its ``-wal``, so nothing beside
  it is checkpointed, created or touched) and says which schema it holds;
* ``record``: the neutral value every judge reads (sessions, and message rows as
  ``(session, id, role, call ids, answered id, scaffolding?)``);
* ``read_ref`` and ``read_hermes``: one reader per schema, each turning its tables into
  the neutral value;
* ``judges``: one judge per invariant over the neutral value;
* ``report`` and ``cli``: findings as lines or JSON, a summary, the exit code;
* ``hermes_v22``: the v22 schema, written from its documented columns, for fixtures.
"""

from __future__ import annotations
