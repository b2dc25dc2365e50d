"""Seeds per second: how fast ``hermes-ref explore`` sweeps, per core and across workers.

Theory of operation
-------------------
A sweep's unit of work is one seed: draw the plan, run the faulty phase and the calm
phase on the in-memory store with every checker judging the record at the end. The row times
sweeps of consecutive seeds (the same seeds in every repetition, so every repetition does
the same work) on one worker, then on every core of the machine; the figures:

* ``explore_seeds_per_s_per_core``: one worker, seeds per second;
* ``explore_seeds_per_s_workers``: ``os.cpu_count()`` workers (process start included);
* ``explore_worker_scaling``: the second over the first (at most the number of cores);
* ``explore_seeds_per_calibration_turn``: the first as a share of the calibration turns/s
  measured in the same run, the figure that travels between machines;
* ``explore_effects_per_seed``: how much world one seed is, in effects.

The timing runs with the narrated timeline off, as a sweep does.
"""

from __future__ import annotations

import os
import time
from typing import Any, TextIO

from sim.bench.ratios import one, share_of, summary
from sim.explore.sweep import sweep

SEEDS_FULL, SEEDS_SMALL = 200, 20


def _rate(seeds: int, workers: int) -> tuple[float, int]:
    began = time.perf_counter()
    report = sweep(0, seeds, workers=workers)
    elapsed = time.perf_counter() - began
    return seeds / elapsed, report.steps


def rows(sizes: Any, report: dict[str, Any], progress: TextIO | None = None) -> dict[str, Any]:
    """The explore rows, for ``sim.bench.runner.measure``."""
    seeds = SEEDS_FULL if sizes.name == "full" else SEEDS_SMALL
    reps = max(1, min(3, sizes.reps))
    cores = os.cpu_count() or 1
    if progress is not None:
        progress.write(f"bench: explore, {seeds} seeds on 1 and {cores} worker(s)\n")
        progress.flush()
    single, steps = zip(*(_rate(seeds, 1) for _ in range(reps)), strict=True)
    many = [_rate(seeds, cores)[0] for _ in range(reps)]
    out: dict[str, Any] = {
        "explore_seeds_per_s_per_core": summary(single),
        "explore_seeds_per_s_workers": summary(many),
        "explore_workers": one(cores),
        "explore_effects_per_seed": one(steps[0] / seeds),
    }
    out["explore_worker_scaling"] = share_of(out["explore_seeds_per_s_workers"],
                                             out["explore_seeds_per_s_per_core"])
    calibration = report.get("calibration_turns_per_s")
    if calibration is not None:
        out["explore_seeds_per_calibration_turn"] = share_of(
            out["explore_seeds_per_s_per_core"], calibration)
    return out


LABELS = (
    ("explore_seeds_per_s_per_core", "one worker, default plan, every checker on"),
    ("explore_seeds_per_s_workers", "os.cpu_count() workers"),
    ("explore_worker_scaling", "workers / one worker"),
    ("explore_seeds_per_calibration_turn", "seeds/s / calibration turns/s"),
    ("explore_effects_per_seed", "effects of every process, per seed"),
)


def lines(report: dict[str, Any]) -> list[str]:
    out = ["explore (sim.bench.explore):"]
    for name, how in LABELS:
        stat = report.get(name)
        if stat is not None:  # the ratio to calibration is a few ten-thousandths: six places
            places = 6 if name == "explore_seeds_per_calibration_turn" else 3
            out.append(f"  {name:<38} {stat['median']:>12,.{places}f} [{stat['min']:,.{places}f} - "
                       f"{stat['max']:,.{places}f}]  {how}")
    return out
