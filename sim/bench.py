"""Throughput and scaling benchmarks of the reference engine (``hermes-ref bench``).

Theory of operation
-------------------
Every row runs the same scripted turn as the peers in ``perf-baselines.md``: the user says
"hi", the model calls one fast tool (``read_file`` of a 2-byte file in ``SimTools``), the
tool result goes back, the model answers "done". That is two model calls, one tool call
and four stored messages per turn. The fake model is in process and looks only at the
last message, so its cost does not grow with the history.

* **Throughput rows** start a fresh session for every turn (as the peers were measured).
  Each repetition builds a fresh rig (world or store, engine, driver), runs
  ``warmup_turns`` untimed turns, then as many turns as fit in ``rep_s`` seconds. The
  figure is the median [min-max] of the repetitions' turns/s. Commits per turn are the
  store's own ``commits`` counter over the timed turns.
* **Scaling rows** run ``scaling_turns`` turns in ONE session, timing each turn, and
  report the median time of the last ``scaling_window`` turns over the median time of the
  first ``scaling_window`` (turns 191-200 over 1-10 at full size), ``scaling_reps`` times.
* **Bytes per turn** come from a separate run on ``SqliteStore`` with a
  ``sqlite3.Connection.set_trace_callback`` on its connection (``store._conn``, a private
  attribute: the store has no public hook and the benchmark must not change it). The
  callback receives each statement with its parameters expanded; the lengths of the
  INSERT/UPDATE/REPLACE texts are summed per turn, exactly as the peers were measured.
* **Commit ceilings** are SQLite's own limit on this machine, measured in the same run:
  WAL, ``synchronous=FULL``, one ~1 KB row per committed transaction (an autocommit
  INSERT), through stdlib ``sqlite3`` and through ``aiosqlite`` (one thread hop per
  commit). Durable rows are also shown as the share of that limit they use.
* **fsyncs** are counted, never assumed: a child ``python -m sim.bench --fsync-probe N``
  runs N durable turns under ``strace -f -c -e trace=fsync,fdatasync``; it runs once with
  0 turns and once with N, and the difference divided by N is fsyncs per turn (opening,
  migrating and closing the database cancel out). Without ``strace`` the figure is null
  and ``notes`` says why.
* **Where the time goes**: the share of wall time spent in the cyclic garbage collector
  (``gc.callbacks``) for every throughput row, the memory row again with the collector
  paused, and the GC-tracked objects a turn leaves alive; hops per turn and a split of the
  durable turn (store ops on aiosqlite's worker, thread-hop overhead, the rest on the loop)
  from an instrumented run; one cProfile run of the memory row (collector paused), top
  functions by cumulative and by own time. A diagnostic row times what
  ``HttpProvider`` would spend encoding the request bodies of the long session, early vs
  late: the simulated turns never serialize anything.

Sizes: ``FULL`` (default), ``QUICK`` (``--quick``) and ``TINY`` (for the smoke test), chosen
by ``main(sizes=...)`` or the environment variable ``HERMES_REF_BENCH_SIZES``
(``full`` / ``quick`` / ``tiny``), which wins over ``--quick``.

The exit code is 0 even when a target is missed: this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import gc
import json
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiosqlite

from hermes_ref.adapters import liveness
from hermes_ref.adapters.http_provider import _encode_body
from hermes_ref.adapters.sqlite_store import AsyncSqliteStore
from hermes_ref.driver import AsyncDriver
from hermes_ref.effects import ProviderRequest
from hermes_ref.engine import Engine
from hermes_ref.models import ProviderReply, Role
from hermes_ref.outcomes import TurnResult
from hermes_ref.prologue import TurnInput
from hermes_ref.tool_specs import REFERENCE_TOOLS
from sim.driver import SimDriver
from sim.provider import FunctionProvider, text, tool_calls
from sim.sqlite_store import SqliteStore
from sim.store import MemoryStore
from sim.tools import SimTools
from sim.world import CrashableStore, World

__all__ = ["FULL", "QUICK", "SIZES_ENV", "TINY", "Sizes", "main"]

SIZES_ENV = "HERMES_REF_BENCH_SIZES"
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    """How much to measure; see the module docstring."""

    name: str = "full"
    reps: int = 5                # repetitions of every throughput row and ceiling
    rep_s: float = 1.0           # seconds per repetition
    warmup_turns: int = 100      # untimed turns on each fresh rig
    scaling_turns: int = 200     # turns in the one-session scaling run
    scaling_window: int = 10     # early = first N turns, late = last N turns
    scaling_reps: int = 3
    fsync_turns: int = 200       # turns of the strace probe (a second probe runs 0)
    profile_turns: int = 2000    # turns of the cProfile run (memory row)
    schedule_turns: int = 20     # turns per fresh world in the memory row (one fault schedule)
    fsync_timeout_s: float = 120.0


FULL = Sizes()
QUICK = Sizes(name="quick", reps=2, rep_s=0.25, warmup_turns=30, scaling_reps=2,
              fsync_turns=50, profile_turns=300)
TINY = Sizes(name="tiny", reps=2, rep_s=0.01, warmup_turns=1, scaling_turns=8, scaling_window=2,
             scaling_reps=1, fsync_turns=2, profile_turns=5, schedule_turns=2)
_BY_NAME = {s.name: s for s in (FULL, QUICK, TINY)}

# Peers on this machine (perf-baselines.md), shown for context.
PEERS = {
    "memory_turns_per_s": 300,     # openai-agents, no session
    "durable_turns_per_s": 106,    # langgraph SqliteSaver (stdlib), file
    "growth_late_over_early": [5, 13],
}

# name -> (comparison, bound, what it means)
TARGETS: dict[str, tuple[str, float, str]] = {
    "memory_turns_per_s": (">=", 5000.0, "simulated turns/s in memory"),
    "durable_turns_per_s": (">=", 500.0, "durable turns/s, asyncio driver, SQLite FULL"),
    "memory_growth_late_over_early": ("<=", 1.3, "turn time growth, memory"),
    "durable_growth_late_over_early": ("<=", 1.3, "turn time growth, durable"),
    "bytes_late_over_early": ("<=", 1.1, "SQL bytes per turn flat (append-only)"),
}

Stat = dict[str, float]


def one(value: float) -> Stat:
    """A single counted value in the same shape as ``summary``."""
    return {"median": value, "min": value, "max": value}


def summary(values: Sequence[float]) -> Stat:
    """Median, min and max of a non-empty sequence."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# -- the scripted turn --------------------------------------------------------------------

_CALL = tool_calls(("read_file", {"path": "notes.txt"}))
_DONE = text("done")


def _reply(request: ProviderRequest) -> ProviderReply:
    """The fake model: looks only at the tail (user -> call the tool; else answer)."""
    return _CALL if request.messages[-1].role is Role.USER else _DONE


def _tools() -> SimTools:
    return SimTools({"notes.txt": "ok"})


class _AsyncFake:
    """The same fake behind ``async def complete`` for the asyncio driver."""

    def __init__(self) -> None:
        self._fake = FunctionProvider(_reply)

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        return self._fake.complete(request)


def _check(result: TurnResult) -> None:
    if result.final_response != "done" or result.failed:
        raise RuntimeError(
            f"bench turn did not complete as scripted: exit={result.exit_reason} "
            f"detail={result.exit_detail!r} response={result.final_response!r}"
        )


@dataclass
class _SyncRig:
    """A simulated world ready to run turns; ``turn(session_id)`` runs one."""

    store: CrashableStore
    world: World = field(init=False)
    engine: Engine = field(init=False)
    driver: SimDriver = field(init=False)

    def __post_init__(self) -> None:
        self.world = World(store=self.store, provider=FunctionProvider(_reply), tools=_tools(),
                           trace=False)
        self.engine = Engine(tools=REFERENCE_TOOLS, holder=self.world.holder)
        self.driver = SimDriver(self.world)

    def turn(self, session_id: str) -> TurnResult:
        return self.driver.run(self.engine.run_turn(TurnInput(session_id=session_id, text="hi")))

    def commits(self) -> int:
        return int(getattr(self.store, "commits", 0))


class _AsyncRig:
    """An ``AsyncSqliteStore`` (FULL) + ``AsyncDriver`` + engine on a file."""

    def __init__(self, store: AsyncSqliteStore) -> None:
        self.store = store
        self.driver = AsyncDriver(store=store, provider=_AsyncFake(), tools=_tools(),
                                  tools_in_thread=False)
        self.engine = Engine(tools=REFERENCE_TOOLS, holder=liveness.holder_identity())

    @classmethod
    async def open(cls, path: Path) -> _AsyncRig:
        return cls(await AsyncSqliteStore.open(path, synchronous="FULL"))

    async def turn(self, session_id: str) -> TurnResult:
        return await self.driver.run(self.engine.run_turn(TurnInput(session_id=session_id, text="hi")))

    async def close(self) -> None:
        await self.store.close()


# -- throughput ---------------------------------------------------------------------------


class _GcClock:
    """Wall time spent in the cyclic garbage collector, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._started = 0.0

    def __enter__(self) -> _GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._started


@dataclass
class _Throughput:
    rates: list[float] = field(default_factory=list)
    commits_per_turn: list[float] = field(default_factory=list)
    gc_share: list[float] = field(default_factory=list)

    def add(self, turns: int, elapsed_s: float, commits: int, gc_s: float) -> None:
        self.rates.append(turns / elapsed_s)
        self.commits_per_turn.append(commits / turns)
        self.gc_share.append(gc_s / elapsed_s)


def _sync_throughput(
    make_store: Callable[[int], CrashableStore], sizes: Sizes, *, gc_off: bool = False
) -> _Throughput:
    """Fresh rig per rep; warm-up turns, then as many turns as fit in ``rep_s``.

    Every rep starts from a collected heap (``gc.collect()`` before it), so the garbage of
    the previous rep's rig is not charged to this one. ``gc_off`` pauses the cyclic
    collector during the timed turns: a diagnostic of what the collector costs.
    """
    out = _Throughput()
    for rep in range(sizes.reps):
        store = make_store(rep)
        rig = _SyncRig(store)
        try:
            for i in range(sizes.warmup_turns):
                _check(rig.turn(f"w{rep}-{i}"))
            turn = rig.turn
            commits0 = rig.commits()
            gc.collect()
            was_enabled = gc.isenabled()
            if gc_off:
                gc.disable()
            try:
                with _GcClock() as gc_clock:
                    n = 0
                    start = time.perf_counter()
                    deadline = start + sizes.rep_s
                    while True:
                        _check(turn(f"r{rep}-{n}"))
                        n += 1
                        now = time.perf_counter()
                        if now >= deadline:
                            break
            finally:
                if was_enabled:
                    gc.enable()
            out.add(n, now - start, rig.commits() - commits0, gc_clock.total_s)
        finally:
            store.close()
        del rig, store
    return out


def _schedule_throughput(sizes: Sizes) -> _Throughput:
    """The memory row as a sweep runs it: a fresh world per schedule of a few turns.

    A fault sweep runs thousands of short schedules, each in its own seeded world, so
    the world (store, ledger, call log) never grows past one schedule. Building the
    world, engine and driver is inside the timed region.
    """
    out = _Throughput()
    for rep in range(sizes.reps):
        for i in range(sizes.warmup_turns):
            _check(_SyncRig(MemoryStore()).turn(f"w{i}"))
        gc.collect()
        with _GcClock() as gc_clock:
            n = 0
            start = time.perf_counter()
            deadline = start + sizes.rep_s
            now = start
            while now < deadline:
                rig = _SyncRig(MemoryStore())
                for k in range(sizes.schedule_turns):
                    _check(rig.turn(f"s{rep}-{n}-{k}"))
                n += sizes.schedule_turns
                now = time.perf_counter()
        out.add(n, now - start, 0, gc_clock.total_s)
    return out


async def _durable_throughput(tmp: Path, sizes: Sizes) -> _Throughput:
    out = _Throughput()
    for rep in range(sizes.reps):
        rig = await _AsyncRig.open(tmp / f"durable-{rep}.db")
        try:
            for i in range(sizes.warmup_turns):
                _check(await rig.turn(f"w{rep}-{i}"))
            turn = rig.turn
            commits0 = rig.store.commits
            gc.collect()
            with _GcClock() as gc_clock:
                n = 0
                start = time.perf_counter()
                deadline = start + sizes.rep_s
                while True:
                    _check(await turn(f"r{rep}-{n}"))
                    n += 1
                    now = time.perf_counter()
                    if now >= deadline:
                        break
            out.add(n, now - start, rig.store.commits - commits0, gc_clock.total_s)
        finally:
            await rig.close()
    return out


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


async def _durable_breakdown(tmp: Path, turns: int) -> dict[str, Any]:
    """Hops per turn and where the durable turn's time goes (fresh session per turn).

    A separate run with a timing wrapper set on the store instance's ``_hop`` (private;
    every store method goes through it), so the timed rows are not slowed. For each hop:
    the wall time the loop waits (``hop``) and the time the op itself runs on aiosqlite's
    worker thread (``op``: SQL, COMMIT and its fsync). ``hop - op`` is the thread-hop
    overhead (queue, wake-ups); the rest of the turn is the engine and driver on the loop.
    """
    rig = await _AsyncRig.open(tmp / "breakdown.db")
    out = _Breakdown(turns=turns)
    try:
        for i in range(10):
            _check(await rig.turn(f"w{i}"))
        real = rig.store._hop

        async def timed_hop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            name = getattr(fn, "__name__", "op")

            def timed_op(*inner_args: Any, **inner_kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return fn(*inner_args, **inner_kwargs)
                finally:
                    out.op_s[name] += time.perf_counter() - started

            started = time.perf_counter()
            try:
                return await real(timed_op, *args, **kwargs)
            finally:
                out.hop_s[name] += time.perf_counter() - started
                out.hops[name] += 1

        setattr(rig.store, "_hop", timed_hop)  # noqa: B010  (an instance override on purpose)
        started = time.perf_counter()
        for i in range(turns):
            _check(await rig.turn(f"b{i}"))
        out.wall_s = time.perf_counter() - started
    finally:
        await rig.close()
    return out.figures()


# -- scaling ------------------------------------------------------------------------------


@dataclass
class _Scaling:
    growth: list[float] = field(default_factory=list)
    early_ms: list[float] = field(default_factory=list)
    late_ms: list[float] = field(default_factory=list)

    def add(self, times: list[float], window: int) -> None:
        early = statistics.median(times[:window])
        late = statistics.median(times[-window:])
        self.growth.append(late / early)
        self.early_ms.append(early * 1e3)
        self.late_ms.append(late * 1e3)


def _encode_us(requests: Sequence[ProviderRequest], repeats: int = 5) -> float:
    """Microseconds to encode these requests as the HTTP adapter does (best of ``repeats``)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for request in requests:
            _encode_body(request)
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def _memory_scaling(sizes: Sizes) -> tuple[_Scaling, _Scaling]:
    """Turn times of one long session, and what encoding its requests for HTTP would cost.

    The second result is a diagnostic: the simulator hands ``ProviderRequest`` values to an
    in-process fake, so nothing is serialized in the timed turns. ``HttpProvider`` encodes
    every request body whole (``_encode_body``, private); its per-turn cost is measured on
    the requests this run recorded (``world.calls``), turns early vs late.
    """
    out, encode = _Scaling(), _Scaling()
    window = sizes.scaling_window
    for _ in range(sizes.scaling_reps):
        rig = _SyncRig(MemoryStore())
        _check(rig.turn("warm"))  # a different session: warms code paths, not the cache
        times: list[float] = []
        requests: list[list[ProviderRequest]] = []
        for _ in range(sizes.scaling_turns):
            first_call = len(rig.world.calls)
            start = time.perf_counter()
            result = rig.turn("conversation")
            times.append(time.perf_counter() - start)
            _check(result)
            requests.append([c.request for c in rig.world.calls[first_call:]])
        out.add(times, window)
        picked = requests[:window] + requests[-window:]
        encode.add([_encode_us(turn) / 1e6 for turn in picked], window)
    return out, encode


async def _durable_scaling(tmp: Path, sizes: Sizes) -> _Scaling:
    out = _Scaling()
    for rep in range(sizes.scaling_reps):
        rig = await _AsyncRig.open(tmp / f"scaling-{rep}.db")
        try:
            _check(await rig.turn("warm"))
            times: list[float] = []
            for _ in range(sizes.scaling_turns):
                start = time.perf_counter()
                result = await rig.turn("conversation")
                times.append(time.perf_counter() - start)
                _check(result)
            out.add(times, sizes.scaling_window)
        finally:
            await rig.close()
    return out


_WRITE_VERBS = ("INSERT", "UPDATE", "REPLACE")


def _bytes_per_turn(tmp: Path, sizes: Sizes) -> tuple[list[int], list[float]]:
    """SQL write bytes and commits of each turn of one session on ``SqliteStore``.

    The trace callback goes on ``store._conn`` (private: the store exposes no hook). Python
    3.11+ passes the statement with its bound parameters expanded, so the text length
    counts the values written (blobs would count twice, hex-encoded; this schema has none).
    """
    store = SqliteStore(tmp / "bytes.db", synchronous="FULL")
    written = [0]

    def trace(statement: str) -> None:
        if statement.lstrip()[:7].upper().startswith(_WRITE_VERBS):
            written[0] += len(statement)

    try:
        rig = _SyncRig(store)
        _check(rig.turn("warm"))
        store._conn.set_trace_callback(trace)
        per_turn: list[int] = []
        commits: list[float] = []
        for _ in range(sizes.scaling_turns):
            before, commits0 = written[0], store.commits
            _check(rig.turn("conversation"))
            per_turn.append(written[0] - before)
            commits.append(store.commits - commits0)
        store._conn.set_trace_callback(None)
    finally:
        store.close()
    return per_turn, commits


# -- the SQLite commit ceiling ------------------------------------------------------------

_ROW = "x" * 1000
_CEILING_SCHEMA = "CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body TEXT NOT NULL)"
_CEILING_INSERT = "INSERT INTO t(body) VALUES (?)"
_CEILING_WARMUP = 200


def _stdlib_ceiling(path: Path, sizes: Sizes) -> list[float]:
    """Committed transactions/s: stdlib sqlite3, WAL, FULL, autocommit INSERT of ~1 KB."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(_CEILING_SCHEMA)
        for _ in range(_CEILING_WARMUP):
            conn.execute(_CEILING_INSERT, (_ROW,))
        rates: list[float] = []
        execute = conn.execute
        for _ in range(sizes.reps):
            n = 0
            start = time.perf_counter()
            deadline = start + sizes.rep_s
            while True:
                execute(_CEILING_INSERT, (_ROW,))
                n += 1
                now = time.perf_counter()
                if now >= deadline:
                    break
            rates.append(n / (now - start))
        return rates
    finally:
        conn.close()


async def _aiosqlite_ceiling(path: Path, sizes: Sizes) -> list[float]:
    """The same through aiosqlite: one worker hop per commit (autocommit INSERT)."""
    async with aiosqlite.connect(path, isolation_level=None) as db:
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=FULL")
        await db.execute(_CEILING_SCHEMA)
        for _ in range(_CEILING_WARMUP):
            await db.execute(_CEILING_INSERT, (_ROW,))
        rates: list[float] = []
        for _ in range(sizes.reps):
            n = 0
            start = time.perf_counter()
            deadline = start + sizes.rep_s
            while True:
                await db.execute(_CEILING_INSERT, (_ROW,))
                n += 1
                now = time.perf_counter()
                if now >= deadline:
                    break
            rates.append(n / (now - start))
        return rates


# -- fsyncs (strace) ----------------------------------------------------------------------


async def _fsync_probe(turns: int, directory: Path) -> dict[str, int]:
    """The child side: open, run ``turns`` durable turns, close; report commits."""
    rig = await _AsyncRig.open(directory / "probe.db")
    try:
        for i in range(turns):
            _check(await rig.turn(f"p{i}"))
        commits = rig.store.commits
    finally:
        await rig.close()
    return {"turns": turns, "commits": commits}


def parse_strace_counts(summary_text: str) -> int:
    """Total fsync + fdatasync calls from an ``strace -c`` summary table."""
    total = 0
    for line in summary_text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync") and parts[3].isdigit():
            total += int(parts[3])
    return total


def _run_probe(strace: str, turns: int, sizes: Sizes) -> tuple[int, int]:
    """(fsyncs, commits) of one child process under strace."""
    with tempfile.TemporaryDirectory(prefix="hermes-bench-probe-") as tmp:
        summary_file = Path(tmp) / "strace.txt"
        cmd = [strace, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(summary_file),
               sys.executable, "-m", "sim.bench", "--fsync-probe", str(turns), "--dir", tmp]
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
        return parse_strace_counts(summary_file.read_text()), int(reported["commits"])


def _count_fsyncs(sizes: Sizes) -> tuple[float | None, float | None, str]:
    """(fsyncs per turn, fsyncs per commit, note)."""
    strace = shutil.which("strace")
    if strace is None:
        return None, None, "not measured: strace is not on PATH"
    turns = max(1, sizes.fsync_turns)
    try:
        base_fsyncs, base_commits = _run_probe(strace, 0, sizes)
        fsyncs, commits = _run_probe(strace, turns, sizes)
    except (OSError, RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        return None, None, f"not measured: {exc}"
    extra_fsyncs, extra_commits = fsyncs - base_fsyncs, commits - base_commits
    per_commit = extra_fsyncs / extra_commits if extra_commits else None
    note = (f"strace -f -c: {fsyncs} fsync+fdatasync over {turns} turns minus {base_fsyncs} "
            f"for open+close alone; {extra_commits} commits")
    return extra_fsyncs / turns, per_commit, note


def _retained_objects(turns: int) -> float:
    """GC-tracked objects the memory row keeps alive per turn (what each full collection scans).

    ``len(gc.get_objects())`` after a full collection, before and after ``turns`` turns of
    fresh sessions on one simulated world: the world's record (store rows, events, call
    records, ledger) and the engine's session caches.
    """
    rig = _SyncRig(MemoryStore())
    _check(rig.turn("warm"))
    gc.collect()
    before = len(gc.get_objects())
    for i in range(turns):
        rig.turn(f"k{i}")
    gc.collect()
    return (len(gc.get_objects()) - before) / turns


# -- profile ------------------------------------------------------------------------------


def _where(key: tuple[str, int, str]) -> str:
    filename, line, func = key
    if filename == "~":
        return func  # a builtin, e.g. "<method 'append' of 'list' objects>"
    path = Path(filename)
    try:
        shown = str(path.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        shown = "/".join(path.parts[-2:])
    return f"{shown}:{line} {func}"


def _profile(sizes: Sizes, top: int = 8) -> dict[str, Any]:
    """cProfile of the memory row: top functions by cumulative and by own time.

    The cyclic collector is paused while profiling: its pauses would otherwise be charged
    to whichever function happened to allocate (the gc share is its own row).
    """
    rig = _SyncRig(MemoryStore())
    for i in range(sizes.warmup_turns):
        _check(rig.turn(f"w{i}"))
    turn = rig.turn
    effects0 = rig.driver.effects_performed
    profiler = cProfile.Profile()
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        profiler.enable()
        for i in range(sizes.profile_turns):
            turn(f"p{i}")
        profiler.disable()
    finally:
        if was_enabled:
            gc.enable()
    effects = (rig.driver.effects_performed - effects0) / max(1, sizes.profile_turns)
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = (
        pstats.Stats(profiler).stats)  # type: ignore[attr-defined]
    here = str(Path(__file__).resolve())
    rows = [(key, tt, ct) for key, (_cc, _nc, tt, ct, _callers) in stats.items()
            if str(Path(key[0]).resolve()) != here and "_lsprof" not in key[2]]
    total = sum(tt for _, tt, _ in rows) or 1.0
    cumulative = sorted(rows, key=lambda r: r[2], reverse=True)[:top]
    own = sorted(rows, key=lambda r: r[1], reverse=True)[:top]
    return {
        "turns": sizes.profile_turns,
        "total_s": total,
        "us_per_turn_profiled": total / max(1, sizes.profile_turns) * 1e6,
        "effects_per_turn": effects,
        "gc": "paused while profiling",
        "cumulative": [{"function": _where(k), "share": ct / total} for k, _, ct in cumulative],
        "self": [{"function": _where(k), "share": tt / total} for k, tt, _ in own],
    }


# -- the report ---------------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "aiosqlite": getattr(aiosqlite, "__version__", "?"),
        "platform": platform.platform(),
    }


def _share(rate: Stat, commits_per_turn: float, ceiling: Stat) -> Stat:
    """Commits/s used by a row as a fraction of the ceiling's median."""
    limit = ceiling["median"]
    return {k: rate[k] * commits_per_turn / limit for k in ("median", "min", "max")}


def _progress(stream: TextIO | None, message: str) -> None:
    if stream is not None:
        stream.write(f"bench: {message}\n")
        stream.flush()


def measure(sizes: Sizes, progress: TextIO | None = None) -> dict[str, Any]:
    """Run every measurement and return the report (the JSON document)."""
    report: dict[str, Any] = {}
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp_name:
        tmp = Path(tmp_name)

        _progress(progress, "sqlite commit ceilings")
        stdlib_ceiling = summary(_stdlib_ceiling(tmp / "ceiling-stdlib.db", sizes))
        aio_ceiling = summary(asyncio.run(_aiosqlite_ceiling(tmp / "ceiling-aio.db", sizes)))

        _progress(progress, "memory_turns_per_s")
        memory = _schedule_throughput(sizes)
        _progress(progress, "memory_turns_per_s_one_world (diagnostic)")
        memory_one_world = _sync_throughput(lambda rep: MemoryStore(), sizes)
        _progress(progress, "memory_turns_per_s_gc_paused (diagnostic)")
        memory_gc_off = _sync_throughput(lambda rep: MemoryStore(), sizes, gc_off=True)
        _progress(progress, "sim_sqlite_turns_per_s")
        sim_sqlite = _sync_throughput(
            lambda rep: SqliteStore(tmp / f"sim-{rep}.db", synchronous="FULL"), sizes)
        _progress(progress, "durable_turns_per_s")
        durable = asyncio.run(_durable_throughput(tmp, sizes))
        breakdown = asyncio.run(_durable_breakdown(tmp, max(1, sizes.fsync_turns)))

        _progress(progress, "scaling (one session)")
        memory_scaling, encode_scaling = _memory_scaling(sizes)
        durable_scaling = asyncio.run(_durable_scaling(tmp, sizes))
        _progress(progress, "bytes per turn")
        bytes_turns, bytes_commits = _bytes_per_turn(tmp, sizes)

    _progress(progress, "fsyncs (strace)")
    fsyncs_per_turn, fsyncs_per_commit, fsync_note = _count_fsyncs(sizes)
    _progress(progress, "profile")
    profile = _profile(sizes)
    retained = _retained_objects(max(1, min(1000, sizes.profile_turns)))

    w = sizes.scaling_window
    early_bytes, late_bytes = bytes_turns[:w], bytes_turns[-w:]
    durable_cpt = statistics.median(durable.commits_per_turn)
    sim_cpt = statistics.median(sim_sqlite.commits_per_turn)
    report["memory_turns_per_s"] = summary(memory.rates)
    report["memory_gc_share"] = summary(memory.gc_share)
    report["memory_turns_per_s_one_world"] = summary(memory_one_world.rates)
    report["memory_one_world_gc_share"] = summary(memory_one_world.gc_share)
    report["memory_turns_per_s_gc_paused"] = summary(memory_gc_off.rates)
    report["memory_gc_tracked_objects_per_turn"] = one(retained)
    report["sim_sqlite_turns_per_s"] = summary(sim_sqlite.rates)
    report["sim_sqlite_commits_per_turn"] = summary(sim_sqlite.commits_per_turn)
    report["sim_sqlite_gc_share"] = summary(sim_sqlite.gc_share)
    report["durable_turns_per_s"] = summary(durable.rates)
    report["durable_commits_per_turn"] = summary(durable.commits_per_turn)
    report["durable_store_hops_per_turn"] = one(breakdown["hops_per_turn"])
    report["durable_us_in_store_ops"] = one(breakdown["us_in_store_ops"])
    report["durable_us_hop_overhead"] = one(breakdown["us_hop_overhead"])
    report["durable_us_outside_store"] = one(breakdown["us_outside_store"])
    report["durable_gc_share"] = summary(durable.gc_share)
    report["durable_fsyncs_per_turn"] = None if fsyncs_per_turn is None else one(fsyncs_per_turn)
    report["durable_fsyncs_per_commit"] = (
        None if fsyncs_per_commit is None else one(fsyncs_per_commit))
    report["memory_growth_late_over_early"] = summary(memory_scaling.growth)
    report["memory_turn_ms_early"] = summary(memory_scaling.early_ms)
    report["memory_turn_ms_late"] = summary(memory_scaling.late_ms)
    report["http_encode_growth_late_over_early"] = summary(encode_scaling.growth)
    report["http_encode_ms_per_turn_early"] = summary(encode_scaling.early_ms)
    report["http_encode_ms_per_turn_late"] = summary(encode_scaling.late_ms)
    report["durable_growth_late_over_early"] = summary(durable_scaling.growth)
    report["durable_turn_ms_early"] = summary(durable_scaling.early_ms)
    report["durable_turn_ms_late"] = summary(durable_scaling.late_ms)
    report["bytes_per_turn_early"] = summary(early_bytes)
    report["bytes_per_turn_late"] = summary(late_bytes)
    report["bytes_late_over_early"] = one(
        statistics.median(late_bytes) / max(1.0, statistics.median(early_bytes)))
    report["commits_per_turn_early"] = summary(bytes_commits[:w])
    report["commits_per_turn_late"] = summary(bytes_commits[-w:])
    report["sqlite_commit_ceiling_per_s"] = stdlib_ceiling
    report["aiosqlite_commit_ceiling_per_s"] = aio_ceiling
    report["durable_commit_share_of_ceiling"] = _share(report["durable_turns_per_s"], durable_cpt,
                                                        aio_ceiling)
    report["sim_sqlite_commit_share_of_ceiling"] = _share(report["sim_sqlite_turns_per_s"], sim_cpt,
                                                           stdlib_ceiling)
    report["durable_turns_per_s_commit_bound"] = {
        k: aio_ceiling[k] / durable_cpt for k in ("median", "min", "max")}
    report["sim_sqlite_turns_per_s_commit_bound"] = {
        k: stdlib_ceiling[k] / sim_cpt for k in ("median", "min", "max")}

    notes["durable_fsyncs_per_turn"] = fsync_note
    notes["bytes_per_turn"] = (
        f"expanded INSERT/UPDATE SQL text per turn (trace callback on SqliteStore._conn), "
        f"turns 1-{w} vs {sizes.scaling_turns - w + 1}-{sizes.scaling_turns} of one session")
    notes["growth"] = (
        f"median turn time of turns {sizes.scaling_turns - w + 1}-{sizes.scaling_turns} over "
        f"turns 1-{w} of one session, {sizes.scaling_reps} reps")
    notes["gc_share"] = "time inside the cyclic garbage collector (gc.callbacks) / wall time"
    notes["memory_turns_per_s_gc_paused"] = (
        "diagnostic, not a target: the memory row with gc.disable() during the timed turns")
    notes["durable_breakdown"] = (
        "separate instrumented run: a timing wrapper on AsyncSqliteStore._hop (private)")
    notes["http_encode"] = (
        "diagnostic: hermes_ref.adapters.http_provider._encode_body (private) on the requests "
        "the memory scaling run recorded, 2 per turn, best of 5; not part of any timed row")
    notes["commit_share"] = "turns/s x commits/turn / the ceiling's median (aiosqlite for durable)"
    notes["commit_bound"] = "ceiling / commits per turn: turns/s if commits were the only cost"
    report["targets"] = _targets(report)
    report["peers"] = PEERS
    report["profile"] = profile
    report["durable_breakdown"] = breakdown
    report["machine"] = _machine()
    report["sizes"] = asdict(sizes)
    report["notes"] = notes
    return report


def _targets(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (op, bound, what) in TARGETS.items():
        value = report[name]["median"]
        ok = value >= bound if op == ">=" else value <= bound
        out[name] = {"target": f"{op} {bound:g}", "median": value, "pass": ok, "what": what}
    return out


# -- rendering ----------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


_ROWS: tuple[tuple[str, str], ...] = (
    ("memory_turns_per_s", "SimDriver + MemoryStore, fresh world per 20-turn schedule"),
    ("memory_gc_share", "share of wall time in the cyclic GC"),
    ("memory_turns_per_s_one_world", "diagnostic: one world kept for the whole rep"),
    ("memory_one_world_gc_share", "diagnostic: its share of wall time in the GC"),
    ("memory_turns_per_s_gc_paused", "diagnostic: one world, gc.disable() while timed"),
    ("memory_gc_tracked_objects_per_turn", "kept alive per turn by the world + engine"),
    ("sim_sqlite_turns_per_s", "SimDriver + SqliteStore (FULL, file)"),
    ("sim_sqlite_commits_per_turn", "store.commits delta"),
    ("sim_sqlite_commit_share_of_ceiling", "x commits / stdlib ceiling"),
    ("sim_sqlite_turns_per_s_commit_bound", "stdlib ceiling / commits per turn"),
    ("sim_sqlite_gc_share", "share of wall time in the cyclic GC"),
    ("durable_turns_per_s", "AsyncDriver + AsyncSqliteStore (FULL, file)"),
    ("durable_commits_per_turn", "store.commits delta"),
    ("durable_store_hops_per_turn", "aiosqlite worker round trips, counted"),
    ("durable_us_in_store_ops", "us/turn running store ops on the worker (SQL+fsync)"),
    ("durable_us_hop_overhead", "us/turn of thread-hop overhead (queue, wake-ups)"),
    ("durable_us_outside_store", "us/turn on the loop: engine + driver + fake"),
    ("durable_fsyncs_per_turn", "strace -f -c, counted"),
    ("durable_fsyncs_per_commit", "strace -f -c, counted"),
    ("durable_commit_share_of_ceiling", "x commits / aiosqlite ceiling"),
    ("durable_turns_per_s_commit_bound", "aiosqlite ceiling / commits per turn"),
    ("durable_gc_share", "share of wall time in the cyclic GC"),
    ("memory_growth_late_over_early", "one session, late/early turn time"),
    ("memory_turn_ms_early", ""),
    ("memory_turn_ms_late", ""),
    ("http_encode_growth_late_over_early", "diagnostic: HttpProvider body encoding/turn"),
    ("http_encode_ms_per_turn_early", "(not in the timed turns: the fake is in process)"),
    ("http_encode_ms_per_turn_late", ""),
    ("durable_growth_late_over_early", "one session, late/early turn time"),
    ("durable_turn_ms_early", ""),
    ("durable_turn_ms_late", ""),
    ("bytes_per_turn_early", "SQL INSERT/UPDATE text, SqliteStore"),
    ("bytes_per_turn_late", ""),
    ("bytes_late_over_early", ""),
    ("commits_per_turn_early", "SqliteStore, same session"),
    ("commits_per_turn_late", ""),
    ("sqlite_commit_ceiling_per_s", "stdlib sqlite3, WAL, FULL, 1 KB row/commit"),
    ("aiosqlite_commit_ceiling_per_s", "aiosqlite, 1 hop per commit"),
)


def render(report: dict[str, Any]) -> str:
    sizes, machine = report["sizes"], report["machine"]
    lines = [
        f"hermes-ref bench ({sizes['name']}: {sizes['reps']} reps x {sizes['rep_s']:g} s, "
        f"scaling {sizes['scaling_reps']} x {sizes['scaling_turns']} turns) on "
        f"{machine['cpu_count']} CPUs, Python {machine['python']}, SQLite {machine['sqlite']}, "
        f"aiosqlite {machine['aiosqlite']}",
        "",
        f"{'figure':<38} {'median':>10} {'[min - max]':>23}  {'target':<12} how",
        "-" * 110,
    ]
    targets = report["targets"]
    for name, how in _ROWS:
        stat = report.get(name)
        target = ""
        if name in targets:
            t = targets[name]
            target = f"{t['target']} {'PASS' if t['pass'] else 'MISS'}"
        if stat is None:
            reason = report["notes"].get(name, "not measured")
            lines.append(f"{name:<38} {'null':>10} {'':>23}  {target:<12} {reason}")
            continue
        span = f"[{_fmt(stat['min'])} - {_fmt(stat['max'])}]"
        lines.append(f"{name:<38} {_fmt(stat['median']):>10} {span:>23}  {target:<12} {how}")
    lines.append("")
    lines.append("targets:")
    for name, t in targets.items():
        verdict = "PASS" if t["pass"] else "MISS"
        lines.append(f"  {verdict}  {name} = {_fmt(t['median'])} (target {t['target']}: {t['what']})")
    peers = report["peers"]
    lines.append(
        f"peers (perf-baselines.md, same machine): best in-memory {peers['memory_turns_per_s']} "
        f"turns/s, best durable {peers['durable_turns_per_s']} turns/s, growth late/early "
        f"{peers['growth_late_over_early'][0]}-{peers['growth_late_over_early'][1]}x")
    fsync_note = report["notes"].get("durable_fsyncs_per_turn")
    if fsync_note:
        lines.append(f"fsyncs: {fsync_note}")
    breakdown = report["durable_breakdown"]
    lines.append("")
    lines.append(f"durable turn, instrumented ({breakdown['us_per_turn']:.0f} us/turn): "
                 "store hops per turn, wall per hop, of which the op on the worker")
    for name, op in breakdown["ops"].items():
        lines.append(f"  {name:<18} {op['per_turn']:4.1f}/turn  hop {op['hop_us']:5.0f} us  "
                     f"op {op['op_us']:5.0f} us")
    profile = report["profile"]
    lines.append("")
    lines.append(
        f"where the time goes: cProfile of the memory row, {profile['turns']} turns, "
        f"{profile['effects_per_turn']:g} effects/turn, {profile['us_per_turn_profiled']:.0f} us/turn "
        f"under the profiler, GC paused (shares of total)")
    lines.append(f"  {'cumulative':<53} | own time")
    for cum, own in zip(profile["cumulative"], profile["self"], strict=False):
        left = f"{cum['share'] * 100:5.1f}%  {cum['function']}"[:53]
        right = f"{own['share'] * 100:5.1f}%  {own['function']}"[:54]
        lines.append(f"  {left:<53} | {right}")
    return "\n".join(lines) + "\n"


# -- entry points -------------------------------------------------------------------------


def _choose_sizes(quick: bool, sizes: Sizes | None) -> Sizes:
    named = os.environ.get(SIZES_ENV, "").strip().lower()
    if named:
        if named not in _BY_NAME:
            raise ValueError(f"{SIZES_ENV}={named!r}: expected one of {sorted(_BY_NAME)}")
        return _BY_NAME[named]
    if sizes is not None:
        return sizes
    return QUICK if quick else FULL


def main(quick: bool = False, as_json: bool = False, out: TextIO = sys.stdout, *,
         sizes: Sizes | None = None) -> int:
    """Run the benchmarks and print a table (or JSON); 0 even when a target is missed."""
    chosen = _choose_sizes(quick, sizes)
    progress = sys.stderr if sys.stderr.isatty() else None
    report = measure(chosen, progress)
    if as_json:
        out.write(json.dumps(report, indent=2) + "\n")
    else:
        out.write(render(report))
    return 0


def _cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quick", action="store_true", help="2 short repetitions")
    parser.add_argument("--fsync-probe", type=int, metavar="N",
                        help="(internal) run N durable turns for the strace fsync count")
    parser.add_argument("--dir", type=Path, help="(internal) directory for the probe database")
    args = parser.parse_args(argv)
    if args.fsync_probe is not None:
        directory: Path = args.dir or Path(tempfile.mkdtemp(prefix="hermes-bench-probe-"))
        result = asyncio.run(_fsync_probe(args.fsync_probe, directory))
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    return main(quick=args.quick, as_json=args.json, out=sys.stdout)


if __name__ == "__main__":
    raise SystemExit(_cli())

