"""The figures' shape, and the ratios the benchmark is judged on, each with its target.

Theory of operation
-------------------
Every figure of the report is a ``Stat``: the median [min-max] of its repetitions
(``summary``), or one counted value in the same shape (``one``).

Absolute turns/s move 2-3x between machines of one class, and on a shared machine from
one minute to the next, so no target is on an absolute figure. Every target is on a ratio
of two figures measured in the same process, where the machine's speed cancels out:

* ``memory_share_of_calibration``: memory turns/s over the calibration's turns/s (the same
  effect sequence with nothing but the effect machinery, ``sim.bench.calibration``);
* ``durable_commit_share_of_ceiling``: the durable row's commits/s (turns/s x commits per
  turn) over the aiosqlite commit ceiling, one ~1 KB autocommit INSERT per hop, measured
  in pairs (below);
* ``memory_growth_late_over_early`` / ``durable_growth_late_over_early``: late over early
  turn time of one long session;
* ``bytes_late_over_early``: late over early SQL bytes written per turn;
* ``durable_sessions_16_over_1``: aggregate durable turns/s with 16 sessions in flight over
  1 session, both in the same repetition on the same rig, interleaved
  (``sim.bench.sessions``): the group commit's gain.

A share takes the numerator's median, min and max over the denominator's *median*
(``share_of``), so its spread is the numerator's own. The commit shares are **paired**
instead: the disk's speed drifts within seconds, so a ceiling measured apart from the
row does not cancel it. Each short chunk of the row is divided by the ceiling measured
right beside it (``sim.bench.rows.Pair``), and ``paired(shares)`` gives the median
[min-max] of those per-pair shares, keeping the values under ``pairs``; the verdict is
on their median, and ``judge`` carries the pairs along. ``judge(report)`` gives the
``ratios`` section of the report: for each target its value (the median), min, max, the
target as ``{"op", "bound"}``, ``pass`` and what it means. A missed target is reported,
never raised: the benchmark is a measurement, not a test.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TARGETS", "Stat", "Target", "judge", "one", "paired", "share_of", "summary"]

Stat = dict[str, float]


def one(value: float) -> Stat:
    """A single counted value in the same shape as ``summary``."""
    return {"median": value, "min": value, "max": value}


def summary(values: Sequence[float]) -> Stat:
    """Median, min and max of a non-empty sequence."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired(shares: Sequence[float]) -> dict[str, Any]:
    """Per-pair shares as a figure: their median, min and max, and the values themselves."""
    return {**summary(shares), "pairs": list(shares)}


def share_of(numerator: Stat, denominator: Stat, scale: float = 1.0) -> Stat:
    """``numerator x scale / denominator``'s median, for the median, min and max."""
    limit = denominator["median"]
    return {k: numerator[k] * scale / limit for k in ("median", "min", "max")}


@dataclass(frozen=True)
class Target:
    """A bound on one ratio of the report: ``value op bound`` must hold."""

    op: str          # ">=" or "<="
    bound: float
    what: str

    def met(self, value: float) -> bool:
        return value >= self.bound if self.op == ">=" else value <= self.bound


TARGETS: dict[str, Target] = {
    "memory_share_of_calibration": Target(
        ">=", 0.25, "memory turns/s / calibration turns/s (same effects, no engine, no world)"),
    "durable_commit_share_of_ceiling": Target(
        ">=", 0.55,
        "durable commits/s / aiosqlite commit ceiling beside it, median of the pairs"),
    "memory_growth_late_over_early": Target("<=", 1.3, "turn time, late / early, one session"),
    "durable_growth_late_over_early": Target("<=", 1.3, "turn time, late / early, one session"),
    "bytes_late_over_early": Target("<=", 1.1, "SQL bytes written per turn, late / early"),
    "explore_seeds_per_calibration_turn": Target(
        ">=", 0.00025,
        "explore seeds/s on one core / calibration turns/s (50 seeds/s at 200k turns/s)"),
    "durable_sessions_16_over_1": Target(
        ">=", 5.0,
        "aggregate durable turns/s, 16 sessions in flight / 1 session, same rig and rep"),
}


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """The ``ratios`` section: every targeted ratio with its value, target and verdict."""
    out: dict[str, Any] = {}
    for name, target in TARGETS.items():
        stat: dict[str, Any] = report[name]
        out[name] = {
            "value": stat["median"],
            "min": stat["min"],
            "max": stat["max"],
            "target": {"op": target.op, "bound": target.bound},
            "pass": target.met(stat["median"]),
            "what": target.what,
        }
        if "pairs" in stat:
            out[name]["pairs"] = stat["pairs"]
    return out
