"""What bounds the durable figures: SQLite's commit ceiling, fsyncs, and the store hops.

Theory of operation
-------------------
These are not timed rows of the engine but probes of the machine and of the turn:

* **Commit ceilings** are SQLite's own limit on this machine, measured in the same run:
  WAL, ``synchronous=FULL``, one ~1 KB row per committed transaction (an autocommit
  INSERT), through stdlib ``sqlite3`` (``StdlibCeiling``) and through ``aiosqlite``
  (``AioCeiling``, one thread hop per commit). Each keeps one warmed-up connection open
  and measures in short slices (``slice(seconds)`` returns commits/s), so the SQLite
  rows can take a slice right before and right after each chunk of their timed turns
  (``sim.bench.rows``) and be shown as the share of the limit *at that moment*.
* **fsyncs** are counted, never assumed: a child ``python -m sim.bench --fsync-probe N``
  runs N durable turns (``fsync_probe``) under ``strace -f -c -e trace=fsync,fdatasync``;
  it runs once with 0 turns and once with N, and the difference divided by N is fsyncs per
  turn (opening, migrating and closing the database cancel out). Without ``strace`` the
  figure is null and ``notes`` says why.
* **Where the durable turn's time goes**: hops per turn and a split of the turn (store ops
  on aiosqlite's worker, thread-hop overhead, the rest on the loop) from an instrumented
  run. Where the memory turn's time goes is ``sim.bench.profiling``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiosqlite

from hermes_ref.shell.group_commit import Outcome, Write
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from sim.bench.rig import AsyncRig, Sizes, check_turn

# The repository root: the fsync child runs ``python -m sim.bench`` from there.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


# -- the SQLite commit ceiling ------------------------------------------------------------

_ROW = "x" * 1000
_CEILING_SETUP = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
)
_CEILING_INSERT = "INSERT INTO t(body) VALUES (?)"
_CEILING_WARMUP = 200


class StdlibCeiling:
    """The stdlib sqlite3 commit ceiling, measured in slices on one open connection.

    WAL, ``synchronous=FULL``, an autocommit INSERT of ~1 KB per committed transaction;
    the connection is opened and warmed up once (``_CEILING_WARMUP`` commits), then each
    ``slice(seconds)`` commits for that long and returns commits/s.
    """

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)
        for statement in _CEILING_SETUP:
            self._conn.execute(statement)
        for _ in range(_CEILING_WARMUP):
            self._conn.execute(_CEILING_INSERT, (_ROW,))

    def slice(self, seconds: float) -> float:
        """Commits/s over ``seconds`` of back-to-back autocommit INSERTs."""
        execute, n = self._conn.execute, 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            execute(_CEILING_INSERT, (_ROW,))
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                return n / (now - start)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> StdlibCeiling:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AioCeiling:
    """The same ceiling through aiosqlite: one worker hop per commit, in slices."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    @classmethod
    async def open(cls, path: Path) -> AioCeiling:
        """Connect, set WAL and FULL, create the table and warm up."""
        db = await aiosqlite.connect(path, isolation_level=None)
        for statement in _CEILING_SETUP:
            await db.execute(statement)
        for _ in range(_CEILING_WARMUP):
            await db.execute(_CEILING_INSERT, (_ROW,))
        return cls(db)

    async def slice(self, seconds: float) -> float:
        """Commits/s over ``seconds`` of back-to-back autocommit INSERTs, one hop each."""
        execute, n = self._db.execute, 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            await execute(_CEILING_INSERT, (_ROW,))
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                return n / (now - start)

    async def close(self) -> None:
        await self._db.close()


# -- fsyncs (strace) ----------------------------------------------------------------------


async def fsync_probe(turns: int, directory: Path, sessions: int = 1) -> dict[str, int]:
    """The child side: open, run ``turns`` durable turns over ``sessions`` lanes, close.

    Reports the turns run and the commits made (with ``sessions`` > 1 the lanes run
    concurrently, so their writes are group-committed).
    """
    rig = await AsyncRig.open(directory / "probe.db")
    per_lane = -(-turns // max(1, sessions)) if turns else 0

    async def lane(k: int) -> int:
        for i in range(per_lane):
            check_turn(await rig.turn(f"p{k}-{i}"))
        return per_lane

    try:
        ran = sum(await asyncio.gather(*(lane(k) for k in range(max(1, sessions)))))
        commits = rig.store.commits
    finally:
        await rig.close()
    return {"turns": ran, "commits": commits}


def parse_strace_counts(summary_text: str) -> int:
    """Total fsync + fdatasync calls from an ``strace -c`` summary table."""
    total = 0
    for line in summary_text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync") and parts[3].isdigit():
            total += int(parts[3])
    return total


def _run_probe(strace: str, turns: int, sizes: Sizes, sessions: int = 1) -> tuple[int, int, int]:
    """(fsyncs, commits, turns) of one child process under strace."""
    with tempfile.TemporaryDirectory(prefix="hermes-bench-probe-") as tmp:
        summary_file = Path(tmp) / "strace.txt"
        cmd = [strace, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(summary_file),
               sys.executable, "-m", "sim.bench", "--fsync-probe", str(turns), "--dir", tmp,
               "--sessions", str(sessions)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env,
                              timeout=sizes.fsync_timeout_s, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"strace probe exited {proc.returncode}: {tail}")
        if not summary_file.exists():
            raise RuntimeError("strace wrote no summary")
        reported = json.loads(proc.stdout.strip().splitlines()[-1])
        return (parse_strace_counts(summary_file.read_text()), int(reported["commits"]),
                int(reported["turns"]))


def count_fsyncs(sizes: Sizes, sessions: int = 1) -> tuple[float | None, float | None, str]:
    """(fsyncs per turn, fsyncs per commit, note), with ``sessions`` lanes in flight."""
    strace = shutil.which("strace")
    if strace is None:
        return None, None, "not measured: strace is not on PATH"
    turns = max(sessions, sizes.fsync_turns)
    try:
        base_fsyncs, base_commits, _ = _run_probe(strace, 0, sizes)
        fsyncs, commits, ran = _run_probe(strace, turns, sizes, sessions)
    except (OSError, RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        return None, None, f"not measured: {exc}"
    extra_fsyncs, extra_commits = fsyncs - base_fsyncs, commits - base_commits
    per_commit = extra_fsyncs / extra_commits if extra_commits else None
    lanes = f", {sessions} sessions in flight" if sessions > 1 else ""
    note = (f"strace -f -c: {fsyncs} fsync+fdatasync over {ran} turns{lanes} minus "
            f"{base_fsyncs} for open+close alone; {extra_commits} commits")
    return extra_fsyncs / ran, per_commit, note


# -- where the durable turn's time goes: store hops ---------------------------------------


@dataclass
class _Breakdown:
    """Where a durable turn's wall time goes, from one instrumented run."""

    turns: int = 0
    wall_s: float = 0.0
    hops: collections.Counter[str] = field(default_factory=collections.Counter)
    hop_s: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))
    op_s: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))

    def per_turn_us(self, seconds: float) -> float:
        return seconds / self.turns * 1e6

    def figures(self) -> dict[str, Any]:
        hop_total, op_total = sum(self.hop_s.values()), sum(self.op_s.values())
        return {
            "hops_per_turn": sum(self.hops.values()) / self.turns,
            "us_per_turn": self.per_turn_us(self.wall_s),
            "us_in_store_ops": self.per_turn_us(op_total),
            "us_hop_overhead": self.per_turn_us(hop_total - op_total),
            "us_outside_store": self.per_turn_us(self.wall_s - hop_total),
            "ops": {
                name: {"per_turn": count / self.turns,
                       "hop_us": self.hop_s[name] / count * 1e6,
                       "op_us": self.op_s[name] / count * 1e6}
                for name, count in self.hops.items()
            },
        }


def _timed(out: _Breakdown, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` timed where it runs (the worker thread), under ``name``."""
    def timed_op(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            out.op_s[name] += time.perf_counter() - started
    return timed_op


def _instrument(store: AsyncSqliteStore, out: _Breakdown) -> None:
    """Time every hop: reads through ``_hop``, write batches through the group commit's start."""
    real_hop, real_start = store._hop, store.group_commit.start

    async def timed_hop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        name = getattr(fn, "__name__", "op")
        started = time.perf_counter()
        try:
            return await real_hop(_timed(out, name, fn), *args, **kwargs)
        finally:
            out.hop_s[name] += time.perf_counter() - started
            out.hops[name] += 1

    def timed_start(writes: Sequence[Write]) -> asyncio.Future[Sequence[Outcome]]:
        name = writes[0].op.__name__ if len(writes) == 1 else "batch"
        started = time.perf_counter()
        timed = [replace(w, op=_timed(out, name, w.op)) for w in writes]
        pending = real_start(timed)

        def done(_: object) -> None:
            out.hop_s[name] += time.perf_counter() - started
            out.hops[name] += 1
        pending.add_done_callback(done)
        return pending

    setattr(store, "_hop", timed_hop)  # noqa: B010  (an instance override on purpose)
    store.group_commit.start = timed_start


async def durable_breakdown(tmp: Path, turns: int) -> dict[str, Any]:
    """Hops per turn and where the durable turn's time goes (fresh session per turn).

    A separate run with timing wrappers on the store instance (private: reads go through
    ``_hop``, writes through the group commit's ``start``, one hop per batch; one session
    makes every batch a single write), so the timed rows are not slowed. For each hop:
    the wall time the loop waits (``hop``) and the time the op itself runs on aiosqlite's
    worker thread (``op``: SQL, COMMIT and its fsync). ``hop - op`` is the thread-hop
    overhead (queue, wake-ups); the rest of the turn is the engine and driver on the loop.
    """
    rig = await AsyncRig.open(tmp / "breakdown.db")
    out = _Breakdown(turns=turns)
    try:
        for i in range(10):
            check_turn(await rig.turn(f"w{i}"))
        _instrument(rig.store, out)
        started = time.perf_counter()
        for i in range(turns):
            check_turn(await rig.turn(f"b{i}"))
        out.wall_s = time.perf_counter() - started
    finally:
        await rig.close()
    return out.figures()
