"""Durable throughput with many sessions in flight: group commit through the asyncio driver.

Theory of operation
-------------------
One process, one ``AsyncRig`` (``AsyncSqliteStore`` with ``synchronous=FULL`` on a file,
``AsyncDriver``, the engine, the bench's fake model and tools), and N sessions in flight:
N *lanes*, each running the scripted turn of ``sim.bench.rig`` on its own session, back to
back, each turn on a fresh session as in the throughput rows. Every boundary stays durable
before the effect that depends on it; the store's group commit (``hermes_ref.shell.
group_commit``) lets the boundaries of concurrent turns share one COMMIT and one fsync.

A *chunk* runs N lanes for ``sessions_chunk_s`` seconds: when the time is up, no lane
starts another turn, and the chunk ends when the last turn in flight has ended. Its figures
are turns/s (aggregate over the lanes), commits per turn (the store's ``commits``: in WAL
with ``synchronous=FULL`` every COMMIT of a write transaction is one fsync-bearing
transaction, which ``sim.bench.probes.count_fsyncs`` counts for 16 sessions), and writes
per commit (store writes over batches, from the group commit's counters).

Each repetition opens a fresh database, warms it up, then runs the levels in the order
``1, 4, 16, 16, 4, 1``: a drift of the machine's speed through the rep, linear in time,
weighs on every level alike, so it cancels in the ratio of two levels. A level's rep
figure is its two chunks pooled (turns over seconds). The target is on
``durable_sessions_16_over_1``, one ratio per rep of the 16-session rate over the
1-session rate of that same rep; the report also gives every level's turns/s as a share of
the calibration, like the memory row.

Each chunk also measures the process's CPU time (the loop and the store's worker
together), as ``durable_sessions_N_cpu_ms_per_turn``. ``durable_sessions_16_over_1_cpu_bound``
is, per rep, the 1-session wall time per turn over the 16-session CPU time per turn: the
ratio 16 sessions would reach if they waited on nothing and only spent CPU. When the
measured ratio is close to it, the commits are shared and what is left is CPU per turn.

The ratio is a verdict on the disk as much as on the engine: one session waits for each of
its commits' fsyncs, sixteen share them. So every rep also times the disk it runs on,
before and after its chunks: ``FSYNC_PROBE_COUNT`` writes of one 8 KB page to a file beside
the database, each followed by ``fdatasync`` (``fsync`` where there is none), and
``durable_sessions_fsync_us`` is the median of a rep's samples, per rep, to be read beside
the ratio of that rep (docs/performance.md says how the two relate).
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.bench.ratios import share_of, summary
from sim.bench.rig import AsyncRig, Sizes, check_turn

__all__ = ["LEVELS", "ORDER", "Chunk", "SessionsRow", "report_rows", "run_lanes",
           "sessions_throughput"]

LEVELS = (1, 4, 16)
ORDER = (1, 4, 16, 16, 4, 1)
FSYNC_PROBE_COUNT = 40  # timed page writes per probe; two probes per rep
PAGE = b"\x5a" * 8192


@dataclass(frozen=True)
class Chunk:
    """N lanes for a while: turns, seconds, and what the store did meanwhile."""

    sessions: int
    turns: int
    elapsed_s: float
    commits: int
    writes: int
    batches: int
    cpu_s: float = 0.0  # the process's CPU time meanwhile (the loop and the store's worker)


@dataclass
class SessionsRow:
    """Per level, one pooled figure per rep; the 16/1 ratio per rep."""

    rates: dict[int, list[float]] = field(default_factory=lambda: {n: [] for n in LEVELS})
    commits_per_turn: dict[int, list[float]] = field(
        default_factory=lambda: {n: [] for n in LEVELS})
    writes_per_commit: dict[int, list[float]] = field(
        default_factory=lambda: {n: [] for n in LEVELS})
    over_1: list[float] = field(default_factory=list)
    cpu_ms_per_turn: dict[int, list[float]] = field(
        default_factory=lambda: {n: [] for n in LEVELS})
    cpu_bound: list[float] = field(default_factory=list)  # 1-session wall/turn over 16's CPU/turn
    fsync_us: list[float] = field(default_factory=list)  # per rep, the median timed fdatasync
    chunks: list[Chunk] = field(default_factory=list)

    def add_rep(self, chunks: list[Chunk]) -> None:
        self.chunks.extend(chunks)
        rate: dict[int, float] = {}
        for n in LEVELS:
            mine = [c for c in chunks if c.sessions == n]
            turns = sum(c.turns for c in mine)
            commits = sum(c.commits for c in mine)
            rate[n] = turns / sum(c.elapsed_s for c in mine)
            self.rates[n].append(rate[n])
            self.commits_per_turn[n].append(commits / turns)
            self.writes_per_commit[n].append(sum(c.writes for c in mine) / max(1, commits))
            self.cpu_ms_per_turn[n].append(1000 * sum(c.cpu_s for c in mine) / turns)
        self.over_1.append(rate[LEVELS[-1]] / rate[1])
        self.cpu_bound.append(1000 / rate[1] / self.cpu_ms_per_turn[LEVELS[-1]][-1])


def fsync_samples_us(path: Path, count: int = FSYNC_PROBE_COUNT) -> list[float]:
    """``count`` timed durable writes of one page to ``path`` (made and removed here), in µs:
    what one commit of a lone session waits for on this disk, at least."""
    sync = getattr(os, "fdatasync", os.fsync)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    out = []
    try:
        for i in range(count):
            os.pwrite(fd, PAGE, (i % 8) * len(PAGE))
            began = time.perf_counter()
            sync(fd)
            out.append(1e6 * (time.perf_counter() - began))
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return out


async def run_lanes(rig: AsyncRig, sessions: int, seconds: float, tag: str) -> Chunk:
    """``sessions`` lanes of back-to-back turns until ``seconds`` have passed."""
    store, group = rig.store, rig.store.group_commit
    commits0, writes0, batches0 = store.commits, group.writes, group.batches
    turns = 0
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds

    async def lane(k: int) -> None:
        nonlocal turns
        i = 0
        while True:
            check_turn(await rig.turn(f"{tag}-{k}-{i}"))
            i += 1
            turns += 1
            if time.perf_counter() >= deadline:
                return

    await asyncio.gather(*(lane(k) for k in range(sessions)))
    elapsed = time.perf_counter() - start
    return Chunk(sessions, turns, elapsed, store.commits - commits0, group.writes - writes0,
                 group.batches - batches0, time.process_time() - cpu0)


async def _warm_up(rig: AsyncRig, sizes: Sizes, tag: str) -> None:
    """``warmup_turns`` untimed turns, spread over 16 lanes, then a few alone."""
    lanes = LEVELS[-1]
    per_lane = max(1, sizes.warmup_turns // lanes)

    async def lane(k: int) -> None:
        for i in range(per_lane):
            check_turn(await rig.turn(f"{tag}-w{k}-{i}"))

    await asyncio.gather(*(lane(k) for k in range(lanes)))
    for i in range(max(1, sizes.warmup_turns // 10)):
        check_turn(await rig.turn(f"{tag}-w1-{i}"))


async def sessions_throughput(tmp: Path, sizes: Sizes) -> SessionsRow:
    """``reps`` fresh databases, each timed in the chunks of ``ORDER``."""
    out = SessionsRow()
    for rep in range(sizes.reps):
        rig = await AsyncRig.open(tmp / f"sessions-{rep}.db")
        probe = tmp / f"sessions-{rep}.fsync-probe"
        try:
            await _warm_up(rig, sizes, f"r{rep}")
            gc.collect()
            samples = fsync_samples_us(probe)
            chunks = [await run_lanes(rig, n, sizes.sessions_chunk_s, f"r{rep}-c{k}")
                      for k, n in enumerate(ORDER)]
            samples += fsync_samples_us(probe)
        finally:
            await rig.close()
        out.add_rep(chunks)
        out.fsync_us.append(statistics.median(samples))
    return out


def report_rows(row: SessionsRow, calibration: dict[str, float]) -> dict[str, Any]:
    """The row's figures: per level turns/s, its share of the calibration, commits, batches."""
    out: dict[str, Any] = {}
    for n in LEVELS:
        rate = summary(row.rates[n])
        out[f"durable_sessions_{n}_turns_per_s"] = rate
        out[f"durable_sessions_{n}_share_of_calibration"] = share_of(rate, calibration)
        out[f"durable_sessions_{n}_commits_per_turn"] = summary(row.commits_per_turn[n])
        out[f"durable_sessions_{n}_writes_per_commit"] = summary(row.writes_per_commit[n])
        out[f"durable_sessions_{n}_cpu_ms_per_turn"] = summary(row.cpu_ms_per_turn[n])
    out[f"durable_sessions_{LEVELS[-1]}_over_1"] = {
        **summary(row.over_1), "reps": list(row.over_1)}
    out[f"durable_sessions_{LEVELS[-1]}_over_1_cpu_bound"] = {
        **summary(row.cpu_bound), "reps": list(row.cpu_bound)}
    out["durable_sessions_fsync_us"] = {**summary(row.fsync_us), "reps": list(row.fsync_us)}
    out["sessions_chunks"] = [
        {"sessions": c.sessions, "turns": c.turns, "turns_per_s": c.turns / c.elapsed_s,
         "commits_per_turn": c.commits / c.turns, "writes_per_commit": c.writes / max(1, c.commits)}
        for c in row.chunks]
    return out
