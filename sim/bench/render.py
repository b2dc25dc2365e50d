"""The benchmark report as a table: one line per figure, then the ratios, then what bounds them.

Theory of operation
-------------------
``render(report)`` is a pure function of the JSON document ``sim.bench.measure`` returns,
so ``hermes-ref bench`` and ``hermes-ref bench --json`` always show the same figures. Each
figure is its median and [min - max]; a ratio with a target shows the target and PASS or
MISS (targets are only ever on ratios, see ``sim.bench.ratios``); a figure that was not
measured shows null with the reason from ``notes``. Below the figures come the ratios with
their targets, the per-pair values of every paired share in time order, what bounds the
memory row (its time against the calibration's, and the
profile's own time by layer and by file), the durable turn's store hops and the profile.
Numbers of 100 or more are rounded to whole units, smaller ones keep one or two decimals.
"""

from __future__ import annotations

from typing import Any

from sim.bench import cache_share, compaction, explore, tooling


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if 0 < abs(value) < 0.01:
        return f"{value:.2g}"  # a small share keeps two significant digits
    return f"{value:.2f}"


_ROWS: tuple[tuple[str, str], ...] = (
    ("calibration_turns_per_s", "recorded effects replayed, bare coroutine + minimal loop"),
    ("calibration_effects_per_turn", "effects in the recorded memory turn"),
    ("memory_turns_per_s", "SimDriver + MemoryStore, fresh world per 20-turn schedule"),
    ("memory_share_of_calibration", "memory turns/s / calibration turns/s"),
    ("memory_gc_share", "share of wall time in the cyclic GC"),
    ("memory_turns_per_s_one_world", "diagnostic: one world kept for the whole rep"),
    ("memory_one_world_gc_share", "diagnostic: its share of wall time in the GC"),
    ("memory_turns_per_s_gc_paused", "diagnostic: one world, gc.disable() while timed"),
    ("memory_gc_tracked_objects_per_turn", "kept alive per turn by the world + engine"),
    ("sim_sqlite_turns_per_s", "SimDriver + SqliteStore (FULL, file)"),
    ("sim_sqlite_commits_per_turn", "store.commits delta"),
    ("sim_sqlite_commit_share_of_ceiling", "per pair: commits/s / stdlib ceiling beside it"),
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
    ("durable_commit_share_of_ceiling", "per pair: commits/s / aiosqlite ceiling beside it"),
    ("durable_turns_per_s_commit_bound", "aiosqlite ceiling / commits per turn"),
    ("durable_gc_share", "share of wall time in the cyclic GC"),
    ("durable_sessions_1_turns_per_s", "1 session in flight, AsyncDriver, group commit"),
    ("durable_sessions_4_turns_per_s", "4 sessions in flight, aggregate"),
    ("durable_sessions_16_turns_per_s", "16 sessions in flight, aggregate"),
    ("durable_sessions_16_over_1", "per rep: 16-session turns/s / 1-session turns/s"),
    ("durable_sessions_16_over_1_cpu_bound", "per rep: 1-session wall/turn / 16-session CPU/turn"),
    ("durable_sessions_fsync_us", "per rep: median timed 8 KB fdatasync beside the database"),
    ("durable_sessions_1_cpu_ms_per_turn", "process CPU (loop + store worker) per turn"),
    ("durable_sessions_16_cpu_ms_per_turn", ""),
    ("durable_sessions_1_share_of_calibration", "turns/s / calibration turns/s"),
    ("durable_sessions_16_share_of_calibration", "turns/s / calibration turns/s"),
    ("durable_sessions_1_commits_per_turn", "commits = fsync-bearing transactions"),
    ("durable_sessions_4_commits_per_turn", ""),
    ("durable_sessions_16_commits_per_turn", ""),
    ("durable_sessions_4_writes_per_commit", "store writes per COMMIT (batch size)"),
    ("durable_sessions_16_writes_per_commit", ""),
    ("durable_sessions_16_fsyncs_per_turn", "strace -f -c, counted, 16 in flight"),
    ("durable_sessions_16_fsyncs_per_commit", "strace -f -c, counted, 16 in flight"),
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
    ("sqlite_commit_ceiling_per_s", "stdlib sqlite3, WAL, FULL, 1 KB row/commit; mean slice per rep"),
    ("aiosqlite_commit_ceiling_per_s", "aiosqlite, 1 hop per commit; mean slice per rep"),
)


def _header(report: dict[str, Any]) -> list[str]:
    sizes, machine = report["sizes"], report["machine"]
    return [
        f"hermes-ref bench ({sizes['name']}: {sizes['reps']} reps x {sizes['rep_s']:g} s, "
        f"scaling {sizes['scaling_reps']} x {sizes['scaling_turns']} turns) on "
        f"{machine['cpu_count']} CPUs, Python {machine['python']}, SQLite {machine['sqlite']}, "
        f"aiosqlite {machine['aiosqlite']}",
        f"CPU {machine['cpu']}, platform {machine['platform']}",
    ]


def _target(ratio: dict[str, Any]) -> str:
    return f"{ratio['target']['op']} {ratio['target']['bound']:g}"


def _figures(report: dict[str, Any]) -> list[str]:
    lines = [
        f"{'figure':<38} {'median':>10} {'[min - max]':>23}  {'target':<12} how",
        "-" * 110,
    ]
    ratios = report["ratios"]
    for name, how in _ROWS:
        stat = report.get(name)
        target = ""
        if name in ratios:
            target = f"{_target(ratios[name])} {'PASS' if ratios[name]['pass'] else 'MISS'}"
        if stat is None:
            reason = report["notes"].get(name, "not measured")
            lines.append(f"{name:<38} {'null':>10} {'':>23}  {target:<12} {reason}")
            continue
        span = f"[{_fmt(stat['min'])} - {_fmt(stat['max'])}]"
        lines.append(f"{name:<38} {_fmt(stat['median']):>10} {span:>23}  {target:<12} {how}")
    return lines


def _pairs(name: str, report: dict[str, Any]) -> list[str]:
    """A paired figure's per-pair values in time order, one line per repetition."""
    pairs = (report.get(name) or {}).get("pairs")
    if not pairs:
        return []
    chunks = max(1, int(report["sizes"].get("pair_chunks", len(pairs))))
    lines = [f"pairs of {name}, in time order ({len(pairs)}: a timed chunk / the ceiling "
             "slices either side):"]
    for start in range(0, len(pairs), chunks):
        values = " ".join(_fmt(share) for share in pairs[start:start + chunks])
        lines.append(f"  rep {start // chunks + 1}: {values}")
    return lines


def _ratios(report: dict[str, Any]) -> list[str]:
    lines = ["ratios (every target is on a ratio of two figures of this run):"]
    for name, r in report["ratios"].items():
        verdict = "PASS" if r["pass"] else "MISS"
        lines.append(f"  {verdict}  {name} = {_fmt(r['value'])} [{_fmt(r['min'])} - "
                     f"{_fmt(r['max'])}] (target {_target(r)}: {r['what']})")
    for name, _how in _ROWS:
        lines.extend(_pairs(name, report))
    fsync_note = report["notes"].get("durable_fsyncs_per_turn")
    if fsync_note:
        lines.append(f"fsyncs: {fsync_note}")
    lines.extend(_sessions(report))
    return lines


def _sessions(report: dict[str, Any]) -> list[str]:
    """The many-sessions row: its per-rep ratios and each chunk, in time order."""
    figure = report.get("durable_sessions_16_over_1")
    if not figure:
        return []
    lines = ["durable_sessions_16_over_1 per rep: "
             + " ".join(_fmt(value) for value in figure["reps"])]
    fsync = report.get("durable_sessions_fsync_us")
    if fsync:
        lines.append("fdatasync µs beside each rep: " + " ".join(_fmt(v) for v in fsync["reps"]))
    note = report["notes"].get("durable_sessions_16_fsyncs_per_turn")
    if note:
        lines.append(f"fsyncs, 16 sessions: {note}")
    lines.append("sessions chunks (in flight: turns/s, commits/turn, writes/commit), in time order:")
    chunks = report.get("sessions_chunks", [])
    per_rep = max(1, len(chunks) // max(1, int(report["sizes"]["reps"])))
    for start in range(0, len(chunks), per_rep):
        cells = "  ".join(f"{c['sessions']}: {_fmt(c['turns_per_s'])} {c['commits_per_turn']:.2f} "
                          f"{c['writes_per_commit']:.1f}" for c in chunks[start:start + per_rep])
        lines.append(f"  rep {start // per_rep + 1}: {cells}")
    return lines


def _memory_bound(report: dict[str, Any]) -> list[str]:
    bound = report["memory_bound"]
    effects = report["calibration_effects_per_turn"]["median"]
    layers = ", ".join(f"{layer['name']} {layer['share'] * 100:.0f}%"
                       for layer in bound["by_layer"])
    return [
        f"what bounds memory_share_of_calibration: a memory turn takes "
        f"{bound['memory_us_per_turn']:.0f} us, its {effects:g} effects alone "
        f"{bound['calibration_us_per_turn']:.1f} us (calibration); the other "
        f"{bound['us_beyond_calibration']:.0f} us are the engine and the simulated world.",
        f"  own time by layer (profile below): {layers}",
        "  own time by file: " + ", ".join(
            f"{f['name']} {f['share'] * 100:.1f}%" for f in report["profile"]["by_file"]),
    ]


def _breakdown(report: dict[str, Any]) -> list[str]:
    breakdown = report["durable_breakdown"]
    lines = [f"durable turn, instrumented ({breakdown['us_per_turn']:.0f} us/turn): "
             "store hops per turn, wall per hop, of which the op on the worker"]
    for name, op in breakdown["ops"].items():
        lines.append(f"  {name:<18} {op['per_turn']:4.1f}/turn  hop {op['hop_us']:5.0f} us  "
                     f"op {op['op_us']:5.0f} us")
    return lines


def _profile(report: dict[str, Any]) -> list[str]:
    profile = report["profile"]
    lines = [
        f"where the time goes: cProfile of the memory row, {profile['turns']} turns, "
        f"{profile['effects_per_turn']:g} effects/turn, {profile['us_per_turn_profiled']:.0f} "
        f"us/turn under the profiler, GC paused (shares of total)",
        f"  {'cumulative':<53} | own time, calls per turn",
    ]
    for cum, own in zip(profile["cumulative"], profile["self"], strict=False):
        left = f"{cum['share'] * 100:5.1f}%  {cum['function']}"[:53]
        right = f"{own['share'] * 100:5.1f}% {own['calls_per_turn']:4.0f}x {own['function']}"[:60]
        lines.append(f"  {left:<53} | {right}")
    return lines


def render(report: dict[str, Any]) -> str:
    """The whole table: header, figures, ratios, what bounds them, durable split, profile."""
    sections = (_header(report), _figures(report), _ratios(report), _memory_bound(report),
                _breakdown(report), _profile(report), tooling.lines(report),
                explore.lines(report), cache_share.lines(report), compaction.lines(report))
    return "\n\n".join("\n".join(section) for section in sections) + "\n"
