"""The benchmark report as a table: one line per figure, then targets, peers and profile.

Theory of operation
-------------------
``render(report)`` is a pure function of the JSON document ``sim.bench.measure`` returns,
so ``hermes-ref bench`` and ``hermes-ref bench --json`` always show the same figures. Each
figure is its median and [min - max]; a figure with a target shows PASS or MISS; a figure
that was not measured shows null with the reason from ``notes``. Numbers of 100 or more
are rounded to whole units, smaller ones keep one or two decimals.
"""

from __future__ import annotations

from typing import Any


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
        f"peers (same scripted turn, same machine class): best in-memory {peers['memory_turns_per_s']} "
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
