"""Where a memory turn's time goes: one cProfile run, and the objects a turn keeps alive.

Theory of operation
-------------------
The calibration row says how far the memory row is from the floor of the effect
machinery; this module says what fills the gap.

* ``profile(sizes)`` runs ``profile_turns`` turns of the memory rig (one world, fresh
  session per turn, after ``warmup_turns``) under cProfile with the cyclic collector
  paused: its pauses would otherwise be charged to whichever function happened to
  allocate (the GC share is its own row). The benchmark's own frames (the rig's turn and
  fake model, this module) are left out: they are the harness, not the turn. It reports
  the top functions by cumulative and by own time (with their calls per turn, as cProfile
  counts them), and own time summed per source file
  (``by_file``) and per layer (``by_layer``): the engine (``hermes_ref/``), the simulated
  world (``sim/``), pydantic (validation and copies inside pydantic and pydantic_core),
  and the rest of the standard library and builtins. cProfile counts every coroutine
  resumption as a call, so cumulative shares exceed 100%; own-time shares sum to 100%.
* ``retained_objects(turns)`` counts the GC-tracked objects a turn leaves alive: what
  every full collection has to scan again.
"""

from __future__ import annotations

import collections
import cProfile
import gc
import pstats
from pathlib import Path
from typing import Any

from sim.bench import rig as bench_rig
from sim.bench.rig import Sizes, SyncRig, check_turn
from sim.store import MemoryStore

__all__ = ["PROJECT_ROOT", "profile", "retained_objects"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
_OWN_FILES = frozenset(str(Path(f).resolve()) for f in (__file__, bench_rig.__file__))
_LAYERS = (("hermes_ref", "engine (hermes_ref/)"), ("sim", "simulated world (sim/)"))
_PYDANTIC = "pydantic (validation, copies)"
_OTHER = "stdlib and builtins"

_Key = tuple[str, int, str]  # (file, line, function), as pstats names a function


def retained_objects(turns: int) -> float:
    """GC-tracked objects the memory row keeps alive per turn (what each full collection scans).

    ``len(gc.get_objects())`` after a full collection, before and after ``turns`` turns of
    fresh sessions on one simulated world: the world's record (store rows, events, call
    records, ledger) and the engine's session caches.
    """
    rig = SyncRig(MemoryStore())
    check_turn(rig.turn("warm"))
    gc.collect()
    before = len(gc.get_objects())
    for i in range(turns):
        rig.turn(f"k{i}")
    gc.collect()
    return (len(gc.get_objects()) - before) / turns


# -- naming what the profiler saw ---------------------------------------------------------


def _short_path(filename: str) -> str:
    """An installed file from its package down, a project file from the root, else stdlib/."""
    parts = Path(filename).parts
    if "site-packages" in parts:  # checked first: the virtualenv may live inside the project
        return "/".join(parts[parts.index("site-packages") + 1:])
    try:
        return str(Path(filename).resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return "stdlib/" + parts[-1]


def _where(key: _Key) -> str:
    filename, line, func = key
    if filename == "~":
        return func  # a builtin, e.g. "<method 'append' of 'list' objects>"
    return f"{_short_path(filename)}:{line} {func}"


def _file_of(key: _Key) -> str:
    """The source file a function's own time is charged to; builtins by their library."""
    filename, _line, func = key
    if filename == "~":
        return "pydantic_core" if "pydantic_core" in func else "builtins"
    return _short_path(filename)


def _layer_of(file: str) -> str:
    if file.startswith("pydantic"):
        return _PYDANTIC
    for prefix, layer in _LAYERS:
        if file.startswith(prefix + "/"):
            return layer
    return _OTHER


def _shares(totals: dict[str, float], total: float, top: int) -> list[dict[str, Any]]:
    ranked = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return [{"name": name, "share": seconds / total} for name, seconds in ranked]


# -- the profile --------------------------------------------------------------------------


def _profiled_run(sizes: Sizes) -> tuple[cProfile.Profile, float]:
    """Profile ``profile_turns`` memory turns, GC paused; also return effects per turn."""
    rig = SyncRig(MemoryStore())
    for i in range(sizes.warmup_turns):
        check_turn(rig.turn(f"w{i}"))
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
    return profiler, effects


def profile(sizes: Sizes, top: int = 8) -> dict[str, Any]:
    """cProfile of the memory row: top functions by cumulative and own time, own time by file and layer."""
    profiler, effects = _profiled_run(sizes)
    stats: dict[_Key, tuple[int, int, float, float, Any]] = (
        pstats.Stats(profiler).stats)  # type: ignore[attr-defined]
    rows = [(key, tt, ct, nc) for key, (_cc, nc, tt, ct, _callers) in stats.items()
            if str(Path(key[0]).resolve()) not in _OWN_FILES and "_lsprof" not in key[2]]
    total = sum(row[1] for row in rows) or 1.0
    turns = max(1, sizes.profile_turns)
    by_file: dict[str, float] = collections.defaultdict(float)
    for key, tt, _ct, _nc in rows:
        by_file[_file_of(key)] += tt
    by_layer: dict[str, float] = collections.defaultdict(float)
    for file, tt in by_file.items():
        by_layer[_layer_of(file)] += tt
    cumulative = sorted(rows, key=lambda r: r[2], reverse=True)[:top]
    own = sorted(rows, key=lambda r: r[1], reverse=True)[:top]
    return {
        "turns": sizes.profile_turns,
        "total_s": total,
        "us_per_turn_profiled": total / turns * 1e6,
        "effects_per_turn": effects,
        "gc": "paused while profiling",
        "cumulative": [{"function": _where(k), "share": ct / total, "calls_per_turn": nc / turns}
                       for k, _, ct, nc in cumulative],
        "self": [{"function": _where(k), "share": tt / total, "calls_per_turn": nc / turns}
                 for k, tt, _, nc in own],
        "by_file": _shares(by_file, total, top),
        "by_layer": _shares(by_layer, total, len(_LAYERS) + 2),
    }
