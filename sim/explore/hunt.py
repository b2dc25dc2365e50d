"""Hunting sabotages: can a blind sweep find each broken engine that ``invariants verify`` knows?

For each registered sabotage the hunt applies it and runs seeds 0, 1, 2, ... of the
default plan (nothing tells a seed where the sabotage is; ``seed_start`` moves the first)
until one fails, at most ``seeds_max``. A seed counts only if it passes on the intact
engine: a seed that fails anyway proves nothing about the sabotage. The hunt reports, per
sabotage, the number of seeds to the first failure, the ids that failure broke, and
whether one of them is an id the sabotage is registered for (the causal credit
``invariants verify`` demands too).
When the first failure breaks only other ids, the hunt goes on to the first seed that
breaks one of the sabotage's own (within the same ``seeds_max``) and reports both, with
the first violation of its own id, to read: the first failure says how soon a sweep
notices, the first causal one that the sabotage broke one of its own ids on a seed the
intact engine passes (the seed fails because of the sabotage; that the id is the one it
broke, and not one a path it opened happened to reach, is what the violation's text
shows).

A sabotage of a path the explored world never takes (session lanes, path resolution, the
caller's history list) is not found; the report says so, which is how the workload
learns what it still leaves out.

With ``workers`` above one the sabotages are hunted in that many processes, each taking
the next sabotage as it finishes one and keeping its own verdicts of the intact engine;
a sabotage's hunt is the same in any process, so the report is too.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from sim.explore.plan import FaultMix, generate
from sim.explore.run import RunReport, Verdict, run_plan
from sim.explore.sweep import collecting_for_seeds, worker_start


@dataclass
class Hunt:
    sabotage: str
    invariants: tuple[str, ...]
    seeds_tried: int = 0
    found_at: int | None = None  # the first seed that failed, if one did
    broke: list[str] = field(default_factory=list)
    causal: bool = False  # the first failure broke one of the sabotage's own ids
    seeds_to_first: int | None = None
    causal_at: int | None = None  # the first seed that broke one of its own ids
    seeds_to_causal: int | None = None
    causal_violation: str | None = None  # the first violation of one of its own ids there

    def as_json(self) -> dict[str, object]:
        return {"sabotage": self.sabotage, "invariants": list(self.invariants),
                "seeds_to_first_failure": self.seeds_to_first,
                "seed": self.found_at, "broke": self.broke, "causal": self.causal,
                "causal_seed": self.causal_at, "seeds_to_causal_failure": self.seeds_to_causal,
                "causal_violation": self.causal_violation}


class Baseline:
    """Verdicts of the intact engine, computed once per seed and kept."""

    def __init__(self, mix: FaultMix) -> None:
        self.mix = mix
        self._passed: dict[int, bool] = {}

    def passes(self, seed: int) -> bool:
        if seed not in self._passed:
            report = run_plan(generate(seed, self.mix), trace=False)
            self._passed[seed] = report.verdict is Verdict.PASSED
        return self._passed[seed]


def hunt(name: str, *, seeds_max: int, baseline: Baseline, seed_start: int = 0) -> Hunt:
    from sim.sabotage import SABOTAGES

    sab = SABOTAGES[name]
    found = Hunt(name, sab.invariants)
    for seed in range(seed_start, seed_start + seeds_max):
        if not baseline.passes(seed):
            continue
        found.seeds_tried += 1
        with sab.applied():
            report: RunReport = run_plan(generate(seed, baseline.mix), trace=False)
        if report.verdict is Verdict.PASSED:
            continue
        own = bool(set(report.invariants) & set(sab.invariants))
        if found.found_at is None:
            found.found_at, found.seeds_to_first = seed, found.seeds_tried
            found.broke = report.invariants or [report.verdict.value]
            found.causal = own
        if own:
            found.causal_at, found.seeds_to_causal = seed, found.seeds_tried
            found.causal_violation = next((v for v in report.violations
                                           if v.split(" ", 1)[0] in sab.invariants), None)
            break
    return found


def hunt_all(names: list[str] | None = None, *, seeds_max: int = 1000,
             mix: FaultMix | None = None, seed_start: int = 0, workers: int = 1) -> list[Hunt]:
    """The hunts of ``names`` (every registered sabotage by default), in their order."""
    from sim.sabotage import SABOTAGES

    mix, names = mix or FaultMix(), names or sorted(SABOTAGES)
    workers = max(1, min(workers, os.cpu_count() or 1, len(names)))
    if workers == 1:
        baseline = Baseline(mix)
        with collecting_for_seeds():
            return [hunt(name, seeds_max=seeds_max, baseline=baseline, seed_start=seed_start)
                    for name in names]
    tasks = [(name, seed_start, seeds_max) for name in names]
    with ProcessPoolExecutor(max_workers=workers, initializer=_hunter_start,
                             initargs=(mix,)) as pool:
        return list(pool.map(_hunt_one, tasks, chunksize=1))


_BASELINE: Baseline | None = None  # a hunting process's verdicts of the intact engine


def _hunter_start(mix: FaultMix) -> None:
    global _BASELINE
    worker_start()
    _BASELINE = Baseline(mix)


def _hunt_one(task: tuple[str, int, int]) -> Hunt:
    name, seed_start, seeds_max = task
    assert _BASELINE is not None, "a hunting process starts with _hunter_start"
    return hunt(name, seeds_max=seeds_max, baseline=_BASELINE, seed_start=seed_start)
