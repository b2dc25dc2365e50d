"""The timed rows of the benchmark: throughput, scaling and bytes per turn.

Theory of operation
-------------------
Every row runs the scripted turn of ``sim.bench.rig`` and returns raw per-repetition
values; ``sim.bench.runner.measure`` turns them into medians [min-max]. The calibration
row, timed the same way, is in ``sim.bench.calibration``.

* **Throughput rows** start a fresh session for every turn.
  Each repetition builds a fresh rig (world or store, engine, driver), runs
  ``warmup_turns`` untimed turns, then as many turns as fit in ``rep_s`` seconds. The
  figure is the median [min-max] of the repetitions' turns/s. Commits per turn are the
  store's own ``commits`` counter over the timed turns. Every throughput row also records
  the share of wall time spent in the cyclic garbage collector (``gc.callbacks``); the
  memory row runs once more with the collector paused, as a diagnostic.
* **Scaling rows** run ``scaling_turns`` turns in ONE session, timing each turn, and
  report the median time of the last ``scaling_window`` turns over the median time of the
  first ``scaling_window`` (turns 191-200 over 1-10 at full size), ``scaling_reps`` times.
  A diagnostic beside the memory row times what ``HttpProvider`` would spend encoding the
  request bodies of the long session, early vs late: the simulated turns never serialize
  anything.
* **Bytes per turn** come from a separate run on ``SqliteStore`` with a
  ``sqlite3.Connection.set_trace_callback`` on its connection (``store._conn``, a private
  attribute: the store has no public hook and the benchmark must not change it). The
  callback receives each statement with its parameters expanded; the lengths of the
  INSERT/UPDATE/REPLACE texts are summed per turn.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hermes_ref.effects import ProviderRequest
from hermes_ref.shell.http_provider import encode_body
from sim.bench.rig import AsyncRig, Sizes, SyncRig, check_turn
from sim.sqlite_store import SqliteStore
from sim.store import MemoryStore
from sim.world import CrashableStore

# -- throughput ---------------------------------------------------------------------------


class GcClock:
    """Wall time spent in the cyclic garbage collector, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._started = 0.0

    def __enter__(self) -> GcClock:
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
class Throughput:
    """Per-repetition turns/s, commits per turn and share of wall time in the GC."""

    rates: list[float] = field(default_factory=list)
    commits_per_turn: list[float] = field(default_factory=list)
    gc_share: list[float] = field(default_factory=list)

    def add(self, turns: int, elapsed_s: float, commits: int, gc_s: float) -> None:
        self.rates.append(turns / elapsed_s)
        self.commits_per_turn.append(commits / turns)
        self.gc_share.append(gc_s / elapsed_s)


def sync_throughput(
    make_store: Callable[[int], CrashableStore], sizes: Sizes, *, gc_off: bool = False
) -> Throughput:
    """Fresh rig per rep; warm-up turns, then as many turns as fit in ``rep_s``.

    Every rep starts from a collected heap (``gc.collect()`` before it), so the garbage of
    the previous rep's rig is not charged to this one. ``gc_off`` pauses the cyclic
    collector during the timed turns: a diagnostic of what the collector costs.
    """
    out = Throughput()
    for rep in range(sizes.reps):
        store = make_store(rep)
        rig = SyncRig(store)
        try:
            for i in range(sizes.warmup_turns):
                check_turn(rig.turn(f"w{rep}-{i}"))
            turn = rig.turn
            commits0 = rig.commits()
            gc.collect()
            was_enabled = gc.isenabled()
            if gc_off:
                gc.disable()
            try:
                with GcClock() as gc_clock:
                    n = 0
                    start = time.perf_counter()
                    deadline = start + sizes.rep_s
                    while True:
                        check_turn(turn(f"r{rep}-{n}"))
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


def schedule_throughput(sizes: Sizes) -> Throughput:
    """The memory row as a sweep runs it: a fresh world per schedule of a few turns.

    A fault sweep runs thousands of short schedules, each in its own seeded world, so
    the world (store, ledger, call log) never grows past one schedule. Building the
    world, engine and driver is inside the timed region.
    """
    out = Throughput()
    for rep in range(sizes.reps):
        for i in range(sizes.warmup_turns):
            check_turn(SyncRig(MemoryStore()).turn(f"w{i}"))
        gc.collect()
        with GcClock() as gc_clock:
            n = 0
            start = time.perf_counter()
            deadline = start + sizes.rep_s
            now = start
            while now < deadline:
                rig = SyncRig(MemoryStore())
                for k in range(sizes.schedule_turns):
                    check_turn(rig.turn(f"s{rep}-{n}-{k}"))
                n += sizes.schedule_turns
                now = time.perf_counter()
        out.add(n, now - start, 0, gc_clock.total_s)
    return out


async def durable_throughput(tmp: Path, sizes: Sizes) -> Throughput:
    """``sync_throughput`` on the asyncio rig: a fresh database file per repetition."""
    out = Throughput()
    for rep in range(sizes.reps):
        rig = await AsyncRig.open(tmp / f"durable-{rep}.db")
        try:
            for i in range(sizes.warmup_turns):
                check_turn(await rig.turn(f"w{rep}-{i}"))
            turn = rig.turn
            commits0 = rig.store.commits
            gc.collect()
            with GcClock() as gc_clock:
                n = 0
                start = time.perf_counter()
                deadline = start + sizes.rep_s
                while True:
                    check_turn(await turn(f"r{rep}-{n}"))
                    n += 1
                    now = time.perf_counter()
                    if now >= deadline:
                        break
            out.add(n, now - start, rig.store.commits - commits0, gc_clock.total_s)
        finally:
            await rig.close()
    return out


# -- scaling ------------------------------------------------------------------------------


@dataclass
class Scaling:
    """Per-repetition growth (late over early turn time) and the two medians, in ms."""

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
            encode_body(request)
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def memory_scaling(sizes: Sizes) -> tuple[Scaling, Scaling]:
    """Turn times of one long session, and what encoding its requests for HTTP would cost.

    The second result is a diagnostic: the simulator hands ``ProviderRequest`` values to an
    in-process fake, so nothing is serialized in the timed turns. ``HttpProvider`` encodes
    every request body whole (``encode_body``); its per-turn cost is measured on
    the requests this run recorded (``world.calls``), turns early vs late.
    """
    out, encode = Scaling(), Scaling()
    window = sizes.scaling_window
    for _ in range(sizes.scaling_reps):
        rig = SyncRig(MemoryStore())
        check_turn(rig.turn("warm"))  # a different session: warms code paths, not the cache
        times: list[float] = []
        requests: list[list[ProviderRequest]] = []
        for _ in range(sizes.scaling_turns):
            first_call = len(rig.world.calls)
            start = time.perf_counter()
            result = rig.turn("conversation")
            times.append(time.perf_counter() - start)
            check_turn(result)
            requests.append([c.request for c in rig.world.calls[first_call:]])
        out.add(times, window)
        picked = requests[:window] + requests[-window:]
        encode.add([_encode_us(turn) / 1e6 for turn in picked], window)
    return out, encode


async def durable_scaling(tmp: Path, sizes: Sizes) -> Scaling:
    """Turn times of one long session on the asyncio rig, one database file per rep."""
    out = Scaling()
    for rep in range(sizes.scaling_reps):
        rig = await AsyncRig.open(tmp / f"scaling-{rep}.db")
        try:
            check_turn(await rig.turn("warm"))
            times: list[float] = []
            for _ in range(sizes.scaling_turns):
                start = time.perf_counter()
                result = await rig.turn("conversation")
                times.append(time.perf_counter() - start)
                check_turn(result)
            out.add(times, sizes.scaling_window)
        finally:
            await rig.close()
    return out


_WRITE_VERBS = ("INSERT", "UPDATE", "REPLACE")


def bytes_per_turn(tmp: Path, sizes: Sizes) -> tuple[list[int], list[float]]:
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
        rig = SyncRig(store)
        check_turn(rig.turn("warm"))
        store._conn.set_trace_callback(trace)
        per_turn: list[int] = []
        commits: list[float] = []
        for _ in range(sizes.scaling_turns):
            before, commits0 = written[0], store.commits
            check_turn(rig.turn("conversation"))
            per_turn.append(written[0] - before)
            commits.append(store.commits - commits0)
        store._conn.set_trace_callback(None)
    finally:
        store.close()
    return per_turn, commits

