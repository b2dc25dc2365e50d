"""Throughput and scaling benchmarks of the reference engine (``hermes-ref bench``).

Theory of operation
-------------------
``measure(sizes)`` runs every figure in one process and returns the report, a JSON
document; ``main`` prints it as JSON or as the table of ``sim.bench.render``. Each piece
says in its own docstring exactly how it measures:

* ``sim.bench.rig``: the scripted turn (two model calls, one tool call, four stored
  messages) and the rigs that run it, in memory, on ``SqliteStore`` and on
  ``AsyncSqliteStore`` with the asyncio driver;
* ``sim.bench.rows``: the timed rows: throughput (fresh session per turn, with the share
  of time in the cyclic GC), scaling (one long session, late over early turn time) and
  SQL bytes per turn;
* ``sim.bench.probes``: what bounds them: SQLite's commit ceiling, fsyncs counted under
  strace (a child ``python -m sim.bench --fsync-probe N``), and where the time goes
  (instrumented store hops, retained objects, cProfile).

This module owns the sizes, the targets and peers, and the report: every figure is the
median [min-max] of its repetitions (``summary``), or one counted value (``one``).

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

from sim.bench import probes, rows
from sim.bench.render import render
from sim.bench.rig import Sizes
from sim.sqlite_store import SqliteStore
from sim.store import MemoryStore

__all__ = ["FULL", "QUICK", "SIZES_ENV", "TINY", "Sizes", "main"]

SIZES_ENV = "HERMES_REF_BENCH_SIZES"

FULL = Sizes()
QUICK = Sizes(name="quick", reps=2, rep_s=0.25, warmup_turns=30, scaling_reps=2,
              fsync_turns=50, profile_turns=300)
TINY = Sizes(name="tiny", reps=2, rep_s=0.01, warmup_turns=1, scaling_turns=8, scaling_window=2,
             scaling_reps=1, fsync_turns=2, profile_turns=5, schedule_turns=2)
_BY_NAME = {s.name: s for s in (FULL, QUICK, TINY)}

# Peers measured on this machine class with the same scripted turn, shown for context.
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
        stdlib_ceiling = summary(probes.stdlib_ceiling(tmp / "ceiling-stdlib.db", sizes))
        aio_ceiling = summary(asyncio.run(probes.aiosqlite_ceiling(tmp / "ceiling-aio.db", sizes)))

        _progress(progress, "memory_turns_per_s")
        memory = rows.schedule_throughput(sizes)
        _progress(progress, "memory_turns_per_s_one_world (diagnostic)")
        memory_one_world = rows.sync_throughput(lambda rep: MemoryStore(), sizes)
        _progress(progress, "memory_turns_per_s_gc_paused (diagnostic)")
        memory_gc_off = rows.sync_throughput(lambda rep: MemoryStore(), sizes, gc_off=True)
        _progress(progress, "sim_sqlite_turns_per_s")
        sim_sqlite = rows.sync_throughput(
            lambda rep: SqliteStore(tmp / f"sim-{rep}.db", synchronous="FULL"), sizes)
        _progress(progress, "durable_turns_per_s")
        durable = asyncio.run(rows.durable_throughput(tmp, sizes))
        breakdown = asyncio.run(probes.durable_breakdown(tmp, max(1, sizes.fsync_turns)))

        _progress(progress, "scaling (one session)")
        memory_scaling, encode_scaling = rows.memory_scaling(sizes)
        durable_scaling = asyncio.run(rows.durable_scaling(tmp, sizes))
        _progress(progress, "bytes per turn")
        bytes_turns, bytes_commits = rows.bytes_per_turn(tmp, sizes)

    _progress(progress, "fsyncs (strace)")
    fsyncs_per_turn, fsyncs_per_commit, fsync_note = probes.count_fsyncs(sizes)
    _progress(progress, "profile")
    profile = probes.profile(sizes)
    retained = probes.retained_objects(max(1, min(1000, sizes.profile_turns)))

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
        "diagnostic: hermes_ref.shell.http_provider.encode_body on the requests "
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
    args = parser.parse_args(argv)
    if args.fsync_probe is not None:
        directory: Path = args.dir or Path(tempfile.mkdtemp(prefix="hermes-bench-probe-"))
        result = asyncio.run(probes.fsync_probe(args.fsync_probe, directory))
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    return main(quick=args.quick, as_json=args.json, out=sys.stdout)


