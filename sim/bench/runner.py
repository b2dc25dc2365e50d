"""Throughput and scaling benchmarks of the reference engine (``hermes-ref bench``).

Theory of operation
-------------------
``measure(sizes)`` runs every figure in one process and returns the report, a JSON
document; ``main`` prints it as JSON or as the table of ``sim.bench.render``. Each piece
says in its own docstring exactly how it measures:

* ``sim.bench.rig``: the scripted turn (two model calls, one tool call, four stored
  messages) and the rigs that run it, in memory, on ``SqliteStore`` and on
  ``AsyncSqliteStore`` with the asyncio driver;
* ``sim.bench.calibration``: the floor of the effect machinery: one memory turn's effects
  recorded, then replayed by a bare coroutine through a minimal driver loop;
* ``sim.bench.rows``: the timed rows: throughput (fresh session per turn, with the share
  of time in the cyclic GC; the SQLite rows paired with their commit ceiling), scaling
  (one long session, late over early turn time) and SQL bytes per turn;
* ``sim.bench.probes``: what bounds the durable rows: SQLite's commit ceilings (measured
  in short slices), fsyncs counted under strace (a child
  ``python -m sim.bench --fsync-probe N``) and the store hops of an instrumented turn;
* ``sim.bench.profiling``: what bounds the memory row: cProfile (by function, file and
  layer) and the objects a turn keeps alive;
* ``sim.bench.ratios``: the shape of a figure, and the targets, all on ratios.

This module owns the sizes and the report. ``measure`` calls one function per family of
rows (memory, SQLite, scaling, probes); each returns its figures, and the ratios are
judged last, on the assembled report. Two measurements that are divided by one another
are taken side by side, so the machine is in the same state for both:

* the calibration runs just before the memory row;
* each SQLite row is **paired** with its commit ceiling (``_sqlite_rows``): a ceiling
  connection stays open beside the row, and every repetition is cut into
  ``pair_chunks`` timed chunks with a ceiling slice of ``ceiling_slice_s`` before, between
  and after them (``rows.Throughput.add_paired``). Each chunk's commits/s is divided by
  the mean of the two slices beside it, and the commit share is the median [min-max] of
  these per-pair shares, listed in the figure (``pairs``) and in ``report["pairs"]`` with
  their ceilings. The virtual disk's speed drifts within seconds on a shared machine;
  a ceiling measured a tenth of a second away follows it, one measured before the row
  does not. The ceiling figures (``*_commit_ceiling_per_s``) are the per-rep means of the
  same slices, so there is no separate ceiling run.

Sizes: ``FULL`` (default), ``QUICK`` (``--quick``) and ``TINY`` (for the smoke test), chosen
by ``main(sizes=...)`` or the environment variable ``HERMES_REF_BENCH_SIZES``
(``full`` / ``quick`` / ``tiny``), which wins over ``--quick``.

The exit code is 0 even when a target is missed: this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import aiosqlite

from sim.bench import (
    cache_share,
    calibration,
    compaction,  # CMP: the cost of planning a compaction
    explore,
    probes,
    profiling,
    rows,
    sessions,
    tooling,
)
from sim.bench.ratios import TARGETS, judge, one, paired, share_of, summary
from sim.bench.render import render
from sim.bench.rig import Sizes
from sim.sqlite_store import SqliteStore
from sim.store import MemoryStore

__all__ = ["FULL", "QUICK", "SIZES_ENV", "TARGETS", "TINY", "Sizes", "cli", "main", "measure"]

SIZES_ENV = "HERMES_REF_BENCH_SIZES"

FULL = Sizes()
QUICK = Sizes(name="quick", reps=2, rep_s=0.25, warmup_turns=30, scaling_reps=2,
              fsync_turns=50, profile_turns=300, pair_chunks=5, sessions_chunk_s=0.1)
TINY = Sizes(name="tiny", reps=2, rep_s=0.01, warmup_turns=1, scaling_turns=8, scaling_window=2,
             scaling_reps=1, fsync_turns=2, profile_turns=5, schedule_turns=2,
             pair_chunks=2, ceiling_slice_s=0.002, sessions_chunk_s=0.002)
_BY_NAME = {s.name: s for s in (FULL, QUICK, TINY)}

# -- the row groups: each runs one family of measurements and returns its figures --------


def _cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _machine() -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "aiosqlite": getattr(aiosqlite, "__version__", "?"),
        "platform": platform.platform(),
    }


def _progress(stream: TextIO | None, message: str) -> None:
    if stream is not None:
        stream.write(f"bench: {message}\n")
        stream.flush()


def _memory_rows(sizes: Sizes, progress: TextIO | None) -> dict[str, Any]:
    """The calibration, the memory row as a share of it, and the memory diagnostics."""
    _progress(progress, "calibration (recorded effects, bare replay)")
    tape = calibration.record()
    calibrated = calibration.calibration_throughput(tape, sizes)
    _progress(progress, "memory_turns_per_s")
    memory = rows.schedule_throughput(sizes)
    _progress(progress, "memory_turns_per_s_one_world (diagnostic)")
    one_world = rows.sync_throughput(lambda rep: MemoryStore(), sizes)
    _progress(progress, "memory_turns_per_s_gc_paused (diagnostic)")
    gc_off = rows.sync_throughput(lambda rep: MemoryStore(), sizes, gc_off=True)
    out: dict[str, Any] = {
        "calibration_turns_per_s": summary(calibrated.rates),
        "calibration_effects_per_turn": one(len(tape.steps)),
        "calibration": {"effects": list(tape.kinds())},
        "memory_turns_per_s": summary(memory.rates),
        "memory_gc_share": summary(memory.gc_share),
        "memory_turns_per_s_one_world": summary(one_world.rates),
        "memory_one_world_gc_share": summary(one_world.gc_share),
        "memory_turns_per_s_gc_paused": summary(gc_off.rates),
    }
    out["memory_share_of_calibration"] = share_of(out["memory_turns_per_s"],
                                                  out["calibration_turns_per_s"])
    return out


def _commit_rows(prefix: str, row: rows.Throughput, ceiling_name: str) -> dict[str, Any]:
    """A paired row's figures: turns/s, commits, its share of the ceiling beside it.

    The share is per pair (``rows.Pair``); the ceiling figure is per rep, the mean of the
    rep's slices.
    """
    ceiling = summary(row.ceiling_rates)
    commits_per_turn = statistics.median(row.commits_per_turn)
    return {
        f"{prefix}_turns_per_s": summary(row.rates),
        f"{prefix}_commits_per_turn": summary(row.commits_per_turn),
        f"{prefix}_gc_share": summary(row.gc_share),
        f"{prefix}_commit_share_of_ceiling": paired([p.share for p in row.pairs]),
        f"{prefix}_turns_per_s_commit_bound": {
            k: ceiling[k] / commits_per_turn for k in ("median", "min", "max")},
        ceiling_name: ceiling,
    }


async def _durable_paired(tmp: Path, sizes: Sizes) -> rows.Throughput:
    """The durable row with an aiosqlite ceiling slice beside every chunk of it."""
    ceiling = await probes.AioCeiling.open(tmp / "ceiling-aio.db")
    try:
        return await rows.durable_throughput(tmp, sizes, ceiling)
    finally:
        await ceiling.close()


def _sqlite_rows(tmp: Path, sizes: Sizes, progress: TextIO | None) -> dict[str, Any]:
    """The rows on SQLite files, each paired with its commit ceiling, and the hop split."""
    _progress(progress, "sim_sqlite_turns_per_s, paired with the stdlib commit ceiling")
    with probes.StdlibCeiling(tmp / "ceiling-stdlib.db") as ceiling:
        sim_sqlite = rows.sync_throughput(
            lambda rep: SqliteStore(tmp / f"sim-{rep}.db", synchronous="FULL"), sizes,
            ceiling=ceiling)
    _progress(progress, "durable_turns_per_s, paired with the aiosqlite commit ceiling")
    durable = asyncio.run(_durable_paired(tmp, sizes))
    breakdown = asyncio.run(probes.durable_breakdown(tmp, max(1, sizes.fsync_turns)))
    out = _commit_rows("sim_sqlite", sim_sqlite, "sqlite_commit_ceiling_per_s")
    out.update(_commit_rows("durable", durable, "aiosqlite_commit_ceiling_per_s"))
    out["pairs"] = {"sim_sqlite": [p.figures() for p in sim_sqlite.pairs],
                    "durable": [p.figures() for p in durable.pairs]}
    out["durable_store_hops_per_turn"] = one(breakdown["hops_per_turn"])
    for part in ("us_in_store_ops", "us_hop_overhead", "us_outside_store"):
        out[f"durable_{part}"] = one(breakdown[part])
    out["durable_breakdown"] = breakdown
    return out


def _sessions_rows(tmp: Path, sizes: Sizes, progress: TextIO | None,
                   calibration_rate: dict[str, float]) -> dict[str, Any]:
    """Aggregate durable turns/s with 1, 4 and 16 sessions in flight (group commit)."""
    _progress(progress, "durable_sessions_{1,4,16}_turns_per_s (group commit)")
    row = asyncio.run(sessions.sessions_throughput(tmp, sizes))
    return sessions.report_rows(row, calibration_rate)


def _scaling_rows(tmp: Path, sizes: Sizes, progress: TextIO | None) -> dict[str, Any]:
    """One long session: late over early turn time, HTTP encoding, SQL bytes per turn."""
    _progress(progress, "scaling (one session)")
    memory, encode = rows.memory_scaling(sizes)
    durable = asyncio.run(rows.durable_scaling(tmp, sizes))
    _progress(progress, "bytes per turn")
    bytes_turns, bytes_commits = rows.bytes_per_turn(tmp, sizes)
    out: dict[str, Any] = {}
    for prefix, scaling, unit in (("memory", memory, "turn_ms"),
                                  ("http_encode", encode, "ms_per_turn"),
                                  ("durable", durable, "turn_ms")):
        out[f"{prefix}_growth_late_over_early"] = summary(scaling.growth)
        out[f"{prefix}_{unit}_early"] = summary(scaling.early_ms)
        out[f"{prefix}_{unit}_late"] = summary(scaling.late_ms)
    w = sizes.scaling_window
    early, late = bytes_turns[:w], bytes_turns[-w:]
    out["bytes_per_turn_early"] = summary(early)
    out["bytes_per_turn_late"] = summary(late)
    out["bytes_late_over_early"] = one(
        statistics.median(late) / max(1.0, statistics.median(early)))
    out["commits_per_turn_early"] = summary(bytes_commits[:w])
    out["commits_per_turn_late"] = summary(bytes_commits[-w:])
    return out


def _probe_rows(sizes: Sizes, progress: TextIO | None) -> dict[str, Any]:
    """Counted fsyncs (strace), the memory profile and the objects a turn keeps alive."""
    _progress(progress, "fsyncs (strace)")
    per_turn, per_commit, fsync_note = probes.count_fsyncs(sizes)
    many = sessions.LEVELS[-1]
    many_turn, many_commit, many_note = probes.count_fsyncs(sizes, sessions=many)
    _progress(progress, "profile")
    return {
        "durable_fsyncs_per_turn": None if per_turn is None else one(per_turn),
        "durable_fsyncs_per_commit": None if per_commit is None else one(per_commit),
        "fsync_note": fsync_note,
        f"durable_sessions_{many}_fsyncs_per_turn": None if many_turn is None else one(many_turn),
        f"durable_sessions_{many}_fsyncs_per_commit":
            None if many_commit is None else one(many_commit),
        "sessions_fsync_note": many_note,
        "profile": profiling.profile(sizes),
        "memory_gc_tracked_objects_per_turn": one(
            profiling.retained_objects(max(1, min(1000, sizes.profile_turns)))),
    }


def _memory_bound(report: dict[str, Any]) -> dict[str, Any]:
    """A memory turn's time against the calibration's, and the profile's layers."""
    turn_us = 1e6 / report["memory_turns_per_s"]["median"]
    floor_us = 1e6 / report["calibration_turns_per_s"]["median"]
    return {
        "memory_us_per_turn": turn_us,
        "calibration_us_per_turn": floor_us,
        "us_beyond_calibration": turn_us - floor_us,
        "by_layer": report["profile"]["by_layer"],
        "top_own_time": report["profile"]["self"][:5],
    }


def _notes(sizes: Sizes, fsync_note: str, sessions_fsync_note: str) -> dict[str, str]:
    w, n = sizes.scaling_window, sizes.scaling_turns
    many = sessions.LEVELS[-1]
    return {
        "durable_fsyncs_per_turn": fsync_note,
        f"durable_sessions_{many}_fsyncs_per_turn": sessions_fsync_note,
        "sessions": (
            f"one AsyncRig per rep, 1/4/16 lanes of back-to-back turns in chunks of "
            f"{sizes.sessions_chunk_s:g} s in the order {'/'.join(map(str, sessions.ORDER))}; "
            f"{many}_over_1 is per rep (pooled chunks), median [min-max] of {sizes.reps} reps"),
        "bytes_per_turn": (
            f"expanded INSERT/UPDATE SQL text per turn (trace callback on SqliteStore._conn), "
            f"turns 1-{w} vs {n - w + 1}-{n} of one session"),
        "growth": (f"median turn time of turns {n - w + 1}-{n} over turns 1-{w} of one "
                   f"session, {sizes.scaling_reps} reps"),
        "gc_share": "time inside the cyclic garbage collector (gc.callbacks) / wall time",
        "memory_turns_per_s_gc_paused": (
            "diagnostic, not a target: the memory row with gc.disable() during the timed turns"),
        "calibration": (
            "one memory turn recorded through a wrapper of SimDriver, replayed by a bare "
            "coroutine awaiting the same effect objects, answered from the recording"),
        "durable_breakdown": (
            "separate instrumented run: a timing wrapper on AsyncSqliteStore._hop (private)"),
        "http_encode": (
            "diagnostic: hermes_ref.shell.http_provider.encode_body on the requests "
            "the memory scaling run recorded, 2 per turn, best of 5; not part of any timed row"),
        "commit_share": (
            f"per pair: a {sizes.rep_s / max(1, sizes.pair_chunks):g} s chunk's commits/s / "
            f"the mean of the {sizes.ceiling_slice_s:g} s ceiling slices before and after it "
            "(stdlib ceiling for sim_sqlite, aiosqlite for durable); median [min-max] of "
            f"{sizes.reps} reps x {sizes.pair_chunks} pairs"),
        "commit_ceiling": "per rep: the mean of its ceiling slices (commits/s)",
        "commit_bound": "ceiling / commits per turn: turns/s if commits were the only cost",
        "share_of_calibration": "memory turns/s (median, min, max) / calibration median",
    }


def measure(sizes: Sizes, progress: TextIO | None = None) -> dict[str, Any]:
    """Run every measurement and return the report (the JSON document)."""
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp_name:
        tmp = Path(tmp_name)
        report = _memory_rows(sizes, progress)
        report.update(_sqlite_rows(tmp, sizes, progress))
        report.update(_sessions_rows(tmp, sizes, progress, report["calibration_turns_per_s"]))
        report.update(_scaling_rows(tmp, sizes, progress))
    report.update(_probe_rows(sizes, progress))
    report.update(tooling.rows(sizes, report, progress))
    report.update(explore.rows(sizes, report, progress))
    report.update(cache_share.rows(sizes, report, progress))
    report.update(compaction.rows(sizes, report, progress))
    report["memory_bound"] = _memory_bound(report)
    report["ratios"] = judge(report)
    report["machine"] = _machine()
    report["sizes"] = asdict(sizes)
    report["notes"] = _notes(sizes, report.pop("fsync_note"), report.pop("sessions_fsync_note"))
    return report


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


def cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quick", action="store_true", help="2 short repetitions")
    parser.add_argument("--fsync-probe", type=int, metavar="N",
                        help="(internal) run N durable turns for the strace fsync count")
    parser.add_argument("--dir", type=Path, help="(internal) directory for the probe database")
    parser.add_argument("--sessions", type=int, default=1,
                        help="(internal) sessions in flight in the fsync probe")
    args = parser.parse_args(argv)
    if args.fsync_probe is not None:
        directory: Path = args.dir or Path(tempfile.mkdtemp(prefix="hermes-bench-probe-"))
        result = asyncio.run(probes.fsync_probe(args.fsync_probe, directory, args.sessions))
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    return main(quick=args.quick, as_json=args.json, out=sys.stdout)


