"""Sweeps: many seeds, across the machine's cores and across machines, in one report.

A sweep runs ``generate(seed, mix)`` then ``run_plan`` for every seed of its range that
falls in its shard (``--shard K/M`` takes the seeds whose index in the range is K-1
modulo M, so M runners given the same range and K = 1..M cover it exactly once). Workers
are processes; each seed's run depends only on its seed, so the report is the same with
one worker or eight. Reports of several shards merge into one (``merge``).

The report says how many seeds passed, lists every failure with its seed, and counts the
fault kinds and crash points that fired. A sweep whose plan declared a fault kind that
never fired is not a pass: it did not test what it claims to.
"""

from __future__ import annotations

import gc
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hermes_ref.errors import BadInput
from sim.explore.plan import FaultKind, FaultMix, generate
from sim.explore.run import EXIT_CODES, NONDETERMINISM_EXIT, RunReport, Verdict, run_plan

UNFIRED_EXIT = 6  # the sweep declared a fault kind that never fired


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, text: str | None) -> Shard:
        if text is None:
            return cls(1, 1)
        head, _, tail = text.partition("/")
        try:
            index, count = int(head), int(tail)
        except ValueError:
            raise BadInput(f"--shard {text!r} is not of the form K/M (as in 2/4)") from None
        if count < 1 or not 1 <= index <= count:
            raise BadInput(f"--shard {text!r}: K must be between 1 and M, and M at least 1")
        return cls(index, count)

    def seeds(self, start: int, count: int) -> list[int]:
        return [start + i for i in range(count) if i % self.count == self.index - 1]


@dataclass
class SweepReport:
    seeds: list[int] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    fired: Counter[str] = field(default_factory=Counter)
    crash_points: Counter[str] = field(default_factory=Counter)
    declared: list[str] = field(default_factory=list)
    nondeterministic: list[dict[str, object]] = field(default_factory=list)
    elapsed_s: float = 0.0
    workers: int = 1
    steps: int = 0

    @property
    def unfired(self) -> list[str]:
        return sorted(k for k in self.declared if not self.fired.get(k))

    @property
    def exit_code(self) -> int:
        """The gravest outcome: engine crash, safety, liveness, nondeterminism, unfired."""
        verdicts = {str(f["verdict"]) for f in self.failures}
        for verdict in (Verdict.ENGINE_CRASH, Verdict.SAFETY, Verdict.LIVENESS):
            if verdict.value in verdicts:
                return EXIT_CODES[verdict]
        if self.nondeterministic:
            return NONDETERMINISM_EXIT
        return UNFIRED_EXIT if self.unfired else 0

    def as_json(self) -> dict[str, object]:
        per_s = len(self.seeds) / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {"seeds": len(self.seeds), "first_seed": min(self.seeds, default=None),
                "last_seed": max(self.seeds, default=None),
                "passed": len(self.seeds) - len(self.failures), "failures": self.failures,
                "fired": dict(sorted(self.fired.items())),
                "crash_points": dict(sorted(self.crash_points.items())),
                "declared": self.declared, "unfired": self.unfired,
                "nondeterministic": self.nondeterministic, "workers": self.workers,
                "elapsed_s": round(self.elapsed_s, 3), "seeds_per_s": round(per_s, 2),
                "steps": self.steps, "exit_code": self.exit_code}

    def add(self, report: RunReport) -> None:
        self.seeds.append(report.seed)
        self.steps += report.steps
        self.fired.update(k.value for k in report.fired)
        self.crash_points.update(report.crash_points)
        if report.verdict is not Verdict.PASSED:
            self.failures.append({"seed": report.seed, "verdict": report.verdict.value,
                                  "invariants": report.invariants,
                                  "violations": report.violations[:3], "stuck": report.stuck[:3],
                                  "error": (report.error or "").splitlines()[0:1]})


class _Failure(BaseModel):
    model_config = ConfigDict(extra="allow")
    seed: int
    verdict: str


class _Report(BaseModel):
    """What ``merge`` needs of a shard's JSON report, checked before anything is added up."""

    model_config = ConfigDict(extra="ignore")
    seeds: int = Field(ge=0)
    passed: int = Field(ge=0)
    steps: int = Field(ge=0)
    workers: int = Field(ge=1)
    elapsed_s: float = Field(ge=0)
    failures: list[_Failure]
    nondeterministic: list[dict[str, Any]]
    fired: dict[str, int]
    crash_points: dict[str, int]
    declared: list[str]
    first_seed: int | None
    last_seed: int | None


def merge(reports: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One report from the JSON reports of the shards of one sweep (``explore --merge``)."""
    checked: list[_Report] = []
    for number, raw in enumerate(reports, 1):
        try:
            checked.append(_Report.model_validate(raw))
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top)"
            raise BadInput(f"report {number} is not a sweep report: {where}: "
                           f"{first['msg']}") from error
    seen: dict[int, int] = {}
    for number, report in enumerate(checked, 1):
        for failure in report.failures:
            if failure.seed in seen:
                raise BadInput(f"reports {seen[failure.seed]} and {number} both ran seed "
                               f"{failure.seed}: the same shard twice?")
            seen[failure.seed] = number
    fired: Counter[str] = Counter()
    points: Counter[str] = Counter()
    for report in checked:
        fired.update(report.fired)
        points.update(report.crash_points)
    failures = sorted((f.model_dump() for r in checked for f in r.failures),
                      key=lambda f: int(f["seed"]))
    merged = SweepReport(
        failures=failures, fired=fired, crash_points=points,
        declared=sorted({k for r in checked for k in r.declared}),
        nondeterministic=[n for r in checked for n in r.nondeterministic],
        elapsed_s=max((r.elapsed_s for r in checked), default=0.0),
        workers=sum(r.workers for r in checked) or 1, steps=sum(r.steps for r in checked))
    seeds = sum(r.seeds for r in checked)
    firsts = [r.first_seed for r in checked if r.first_seed is not None]
    lasts = [r.last_seed for r in checked if r.last_seed is not None]
    per_s = seeds / merged.elapsed_s if merged.elapsed_s > 0 else 0.0
    return merged.as_json() | {
        "seeds": seeds, "passed": sum(r.passed for r in checked),
        "first_seed": min(firsts, default=None), "last_seed": max(lasts, default=None),
        "seeds_per_s": round(per_s, 2)}


def _one(task: tuple[int, FaultMix, bool]) -> tuple[RunReport, str | None]:
    seed, mix, twice = task
    report = run_plan(generate(seed, mix), trace=twice, digest=twice)  # digests: only to compare
    difference = None
    if twice:
        again = run_plan(generate(seed, mix), trace=True)
        if again.digest != report.digest:
            difference = first_difference(report.timeline, again.timeline) or "the records differ"
    report.timeline, report.entries = "", []  # verdicts only: replay gives timelines back
    gc.collect()  # the seed's world is all garbage now: free its cycles in one walk
    return report, difference


def first_difference(one: str, two: str) -> str | None:
    """The first line where two timelines part, as ``line N: A | B``."""
    for number, (a, b) in enumerate(zip(one.splitlines(), two.splitlines(), strict=False), 1):
        if a != b:
            return f"line {number}: {a.strip()} | {b.strip()}"
    if len(one.splitlines()) != len(two.splitlines()):
        return f"one timeline has {len(one.splitlines())} lines, the other {len(two.splitlines())}"
    return None


# The cyclic collector's thresholds while seeds run back to back: a seed allocates a few
# hundred thousand short-lived objects (effects, events, checker readings), and with the
# default first threshold of 700 the collector walks the young ones several hundred times
# a seed. Everything alive before the first seed (modules, schemas, the catalog) is frozen
# out of the walks. A seed's own cycles (its world: coroutines, actors, drivers) are freed
# by one collection as the seed ends (``_one``): a walk then finds them all dead, where a
# walk that a threshold set off in mid-seed finds the world alive, moves it to an older
# generation and walks it again later. The thresholds stay as a bound within one seed,
# so memory stays flat over a long sweep.
SWEEP_GC_THRESHOLDS = (20_000, 20, 100)


def worker_start() -> None:
    """A sweep worker process: its collector as ``collecting_for_seeds`` sets it, for good."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SWEEP_GC_THRESHOLDS)


@contextmanager
def collecting_for_seeds() -> Iterator[None]:
    """The collector tuned for many seeds in this process (``SWEEP_GC_THRESHOLDS``), and
    put back as it was afterwards. It changes when cycles are freed, never what a seed
    does: the records and verdicts are the same either way."""
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    worker_start()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if not frozen:
            gc.unfreeze()


def _results(tasks: list[tuple[int, FaultMix, bool]], workers: int
             ) -> Iterator[tuple[RunReport, str | None]]:
    if workers <= 1:
        with collecting_for_seeds():
            yield from map(_one, tasks)
        return
    chunk = max(1, len(tasks) // (workers * 8))
    with ProcessPoolExecutor(max_workers=workers, initializer=worker_start) as pool:
        yield from pool.map(_one, tasks, chunksize=chunk)


def sweep(start: int, count: int, *, mix: FaultMix | None = None, workers: int = 1,
          shard: Shard | None = None, check_determinism: bool = False) -> SweepReport:
    """Run the shard's seeds of ``[start, start + count)`` and report."""
    mix = mix or FaultMix()
    shard = shard or Shard(1, 1)
    workers = max(1, min(workers, os.cpu_count() or 1))
    seeds = shard.seeds(start, count)
    report = SweepReport(declared=sorted(k.value for k in mix.kinds), workers=workers)
    began = time.perf_counter()
    for run, difference in _results([(s, mix, check_determinism) for s in seeds], workers):
        report.add(run)
        if difference is not None:
            report.nondeterministic.append({"seed": run.seed, "first_difference": difference})
    report.elapsed_s = time.perf_counter() - began
    return report


def fired_kinds(report: SweepReport) -> set[FaultKind]:
    return {FaultKind(k) for k in report.fired}
