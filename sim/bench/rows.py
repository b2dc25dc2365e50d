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
* **Paired rows.** Given a commit ceiling (``sim.bench.probes``), a SQLite row times each
  repetition in ``pair_chunks`` chunks of ``rep_s / pair_chunks`` seconds and takes a
  ceiling slice of ``ceiling_slice_s`` before the first chunk, between chunks and after
  the last: slice, chunk, slice, chunk, ..., slice. Each chunk with the slices on either
  side is a ``Pair``; its share is the chunk's commits/s over the mean of the two slices.
  The rep's turns/s still count every chunk (the slices are not in the timed time), and
  the rep's ceiling is the mean of its slices.
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

from hermes_ref.outcomes import TurnResult
from hermes_ref.shell.http_provider import encode_body
from hermes_ref.wire import ProviderRequest
from sim.bench.probes import AioCeiling, StdlibCeiling
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


@dataclass(frozen=True)
class Pair:
    """One timed chunk of a durable row and the commit ceiling measured on each side of it."""

    turns: int
    elapsed_s: float
    commits: int
    ceiling_before: float
    ceiling_after: float

    @property
    def ceiling(self) -> float:
        """The ceiling beside this slice: the mean of the one before and the one after."""
        return (self.ceiling_before + self.ceiling_after) / 2

    @property
    def share(self) -> float:
        """The slice's commits/s over the ceiling beside it."""
        return self.commits / self.elapsed_s / self.ceiling

    def figures(self) -> dict[str, float]:
        """The pair as the report lists it."""
        return {"share": self.share, "turns_per_s": self.turns / self.elapsed_s,
                "commits_per_s": self.commits / self.elapsed_s,
                "ceiling_before": self.ceiling_before, "ceiling_after": self.ceiling_after}


@dataclass
class Throughput:
    """Per-repetition turns/s, commits per turn and GC share; the pairs, if paired."""

    rates: list[float] = field(default_factory=list)
    commits_per_turn: list[float] = field(default_factory=list)
    gc_share: list[float] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    ceiling_rates: list[float] = field(default_factory=list)

    def add(self, turns: int, elapsed_s: float, commits: int, gc_s: float) -> None:
        self.rates.append(turns / elapsed_s)
        self.commits_per_turn.append(commits / turns)
        self.gc_share.append(gc_s / elapsed_s)

    def add_paired(self, chunks: Sequence[tuple[int, float, int]], slices: Sequence[float],
                   gc_s: float) -> None:
        """A repetition timed in chunks, ``slices[k]`` and ``slices[k + 1]`` beside chunk k.

        The rep's ceiling (``ceiling_rates``) is the mean of all its slices.
        """
        if slices:
            self.pairs.extend(
                Pair(n, t, c, before, after) for (n, t, c), before, after
                in zip(chunks, slices[:-1], slices[1:], strict=True))
            self.ceiling_rates.append(statistics.mean(slices))
        self.add(sum(n for n, _, _ in chunks), sum(t for _, t, _ in chunks),
                 sum(c for _, _, c in chunks), gc_s)


def _chunk_s(sizes: Sizes, paired: bool) -> tuple[int, float]:
    """How a repetition is cut: ``pair_chunks`` chunks when paired, else one of ``rep_s``."""
    chunks = max(1, sizes.pair_chunks) if paired else 1
    return chunks, sizes.rep_s / chunks


def _timed_turns(turn: Callable[[str], TurnResult], tag: str, seconds: float) -> tuple[int, float]:
    """As many turns as fit in ``seconds`` (at least one): (turns, elapsed seconds)."""
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        check_turn(turn(f"{tag}-{n}"))
        n += 1
        now = time.perf_counter()
        if now >= deadline:
            return n, now - start


def _sync_rep(rig: SyncRig, tag: str, sizes: Sizes,
              ceiling: StdlibCeiling | None) -> tuple[list[tuple[int, float, int]], list[float]]:
    """One timed repetition: its chunks (turns, seconds, commits) and the ceiling slices."""
    count, seconds = _chunk_s(sizes, ceiling is not None)
    slices = [] if ceiling is None else [ceiling.slice(sizes.ceiling_slice_s)]
    chunks: list[tuple[int, float, int]] = []
    for k in range(count):
        commits0 = rig.commits()
        n, elapsed = _timed_turns(rig.turn, f"{tag}-{k}", seconds)
        chunks.append((n, elapsed, rig.commits() - commits0))
        if ceiling is not None:
            slices.append(ceiling.slice(sizes.ceiling_slice_s))
    return chunks, slices


def sync_throughput(
    make_store: Callable[[int], CrashableStore], sizes: Sizes, *, gc_off: bool = False,
    ceiling: StdlibCeiling | None = None,
) -> Throughput:
    """Fresh rig per rep; warm-up turns, then as many turns as fit in ``rep_s``.

    Every rep starts from a collected heap (``gc.collect()`` before it), so the garbage of
    the previous rep's rig is not charged to this one. ``gc_off`` pauses the cyclic
    collector during the timed turns: a diagnostic of what the collector costs. With a
    ``ceiling`` the rep is timed in ``pair_chunks`` chunks with a ceiling slice before,
    between and after them (see ``Throughput.add_paired``).
    """
    out = Throughput()
    for rep in range(sizes.reps):
        store = make_store(rep)
        rig = SyncRig(store)
        try:
            for i in range(sizes.warmup_turns):
                check_turn(rig.turn(f"w{rep}-{i}"))
            gc.collect()
            was_enabled = gc.isenabled()
            if gc_off:
                gc.disable()
            try:
                with GcClock() as gc_clock:
                    chunks, slices = _sync_rep(rig, f"r{rep}", sizes, ceiling)
            finally:
                if was_enabled:
                    gc.enable()
            out.add_paired(chunks, slices, gc_clock.total_s)
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


async def _async_timed_turns(rig: AsyncRig, tag: str, seconds: float) -> tuple[int, float, int]:
    """``_timed_turns`` on the asyncio rig: (turns, elapsed seconds, commits)."""
    n, commits0 = 0, rig.store.commits
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        check_turn(await rig.turn(f"{tag}-{n}"))
        n += 1
        now = time.perf_counter()
        if now >= deadline:
            return n, now - start, rig.store.commits - commits0


async def _durable_rep(rig: AsyncRig, tag: str, sizes: Sizes,
                       ceiling: AioCeiling | None) -> tuple[list[tuple[int, float, int]], list[float]]:
    """``_sync_rep`` on the asyncio rig, with aiosqlite ceiling slices."""
    count, seconds = _chunk_s(sizes, ceiling is not None)
    slices = [] if ceiling is None else [await ceiling.slice(sizes.ceiling_slice_s)]
    chunks: list[tuple[int, float, int]] = []
    for k in range(count):
        chunks.append(await _async_timed_turns(rig, f"{tag}-{k}", seconds))
        if ceiling is not None:
            slices.append(await ceiling.slice(sizes.ceiling_slice_s))
    return chunks, slices


async def durable_throughput(tmp: Path, sizes: Sizes,
                             ceiling: AioCeiling | None = None) -> Throughput:
    """``sync_throughput`` on the asyncio rig: a fresh database file per repetition."""
    out = Throughput()
    for rep in range(sizes.reps):
        rig = await AsyncRig.open(tmp / f"durable-{rep}.db")
        try:
            for i in range(sizes.warmup_turns):
                check_turn(await rig.turn(f"w{rep}-{i}"))
            gc.collect()
            with GcClock() as gc_clock:
                chunks, slices = await _durable_rep(rig, f"r{rep}", sizes, ceiling)
            out.add_paired(chunks, slices, gc_clock.total_s)
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

