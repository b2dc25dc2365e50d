"""What the minimum commits per tool-round turn would give: 4 instead of 5, measured.

Theory of operation
-------------------
One session's tool-round turn makes 5 commits: the lease grant with the user row
(``open_turn`` with an ``Opening``), the tool-call row, the tool-result row, the final
row and the release. The invariants need only 4, one between each two external effects,
because each carries data that exists only after the effect before it and must be durable
before the effect after it: the user row before the first model call (CTX-8), the call
row before the tool runs (TOOL-1), the results before they are sent back (TOOL-8), the
final row before the answer is delivered (FIN-3, FIN-6). The grant already shares the user
row's commit. The release could share the final row's (LEASE-6: the release comes after
the final persist; nothing external happens between them, and the answer is delivered
only after both). Doing so is a change of the engine's finalizer (docs/performance.md says
which); this module only measures what it would save, without touching the engine.

``FourCommitStore`` is an ``AsyncSqliteStore`` whose write hop (``_start_batch``) leaves
the transaction open after a final answer (an assistant row with no tool calls), so the
next write, the release, runs inside it and commits both: the same SQL statements as the
store, 4 COMMITs and fsyncs per turn instead of 5. It is a measuring device for one
session at a time, not a store: a write held open is not durable until the next one,
which is right only for the turn shape of this bench.

``min_commit_throughput`` times it against the ordinary store, one session, in chunks of
``sessions_chunk_s`` alternating ``5, 4, 4, 5`` per rep on two fresh rigs; the gain is per
rep, the 4-commit rate over the 5-commit rate.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hermes_ref.models import Message, Role
from hermes_ref.shell.group_commit import Outcome, Write
from hermes_ref.shell.sqlite_connect import StoreConnection
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from sim.bench.ratios import summary
from sim.bench.rig import AsyncRig, Sizes, check_turn
from sim.bench.sessions import Chunk, run_lanes

__all__ = ["FourCommitStore", "MinCommits", "min_commit_throughput", "report_rows"]


def _holds(write: Write) -> bool:
    """Leave the transaction open after this write: a final answer (the release follows)."""
    if getattr(write.op, "__name__", "") != "append_messages":
        return False
    rows = next((a for a in write.args if isinstance(a, tuple) and a
                 and isinstance(a[0], Message)), ())
    return bool(rows) and rows[-1].role is Role.ASSISTANT and not rows[-1].tool_calls


def held_batch(conn: StoreConnection, writes: Sequence[Write]) -> list[Outcome]:
    """Each write in the open transaction (or a new one); COMMIT unless it is held."""
    outcomes: list[Outcome] = []
    for write in writes:
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")
        outcome = write.run(conn)
        if outcome.error is not None:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        elif not _holds(write):
            conn.execute("COMMIT")
            conn.commits += 1
        outcomes.append(outcome)
    return outcomes


class FourCommitStore(AsyncSqliteStore):
    """The final row commits with the release (see above)."""

    def _start_batch(self, writes: Sequence[Write]) -> asyncio.Future[Sequence[Outcome]]:
        execute = cast(Any, self._db._execute)
        hop = execute(held_batch, self._raw, writes)
        try:
            pending = hop.send(None)
        finally:
            hop.close()
        return cast(asyncio.Future[Sequence[Outcome]], pending)

    async def close(self) -> None:
        if not self._closed:
            await self._on_worker(_roll_back_held)
        await super().close()


def _roll_back_held(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


@dataclass
class MinCommits:
    """Per rep: both rigs' pooled turns/s and commits per turn, and the gain."""

    rates: dict[int, list[float]] = field(default_factory=lambda: {5: [], 4: []})
    commits_per_turn: dict[int, list[float]] = field(default_factory=lambda: {5: [], 4: []})
    gain: list[float] = field(default_factory=list)

    def add_rep(self, chunks: dict[int, list[Chunk]]) -> None:
        rate = {}
        for kind, mine in chunks.items():
            turns = sum(c.turns for c in mine)
            rate[kind] = turns / sum(c.elapsed_s for c in mine)
            self.rates[kind].append(rate[kind])
            self.commits_per_turn[kind].append(sum(c.commits for c in mine) / turns)
        self.gain.append(rate[4] / rate[5])


async def _warm(rig: AsyncRig, sizes: Sizes, tag: str) -> None:
    for i in range(max(1, sizes.warmup_turns // 4)):
        check_turn(await rig.turn(f"{tag}-w{i}"))


async def min_commit_throughput(tmp: Path, sizes: Sizes) -> MinCommits:
    """One session on each rig, chunks alternating 5, 4, 4, 5 commits per turn, per rep."""
    out = MinCommits()
    for rep in range(sizes.reps):
        rigs = {5: await AsyncRig.open(tmp / f"five-{rep}.db"),
                4: AsyncRig(await FourCommitStore.open(tmp / f"four-{rep}.db"))}
        try:
            for kind, rig in rigs.items():
                await _warm(rig, sizes, f"m{rep}-{kind}")
            gc.collect()
            chunks: dict[int, list[Chunk]] = {5: [], 4: []}
            for k, kind in enumerate((5, 4, 4, 5)):
                chunks[kind].append(
                    await run_lanes(rigs[kind], 1, sizes.sessions_chunk_s, f"m{rep}-{k}"))
        finally:
            for rig in rigs.values():
                await rig.close()
        out.add_rep(chunks)
    return out


def report_rows(row: MinCommits) -> dict[str, Any]:
    return {
        "durable_min_commits_per_turn": summary(row.commits_per_turn[4]),
        "durable_min_commits_turns_per_s": summary(row.rates[4]),
        "durable_store_commits_turns_per_s": summary(row.rates[5]),
        "durable_min_commits_gain": {**summary(row.gain), "reps": list(row.gain)},
    }
