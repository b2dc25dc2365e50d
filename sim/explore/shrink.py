"""Shrinking: the smallest plan that still fails the same way.

A failing plan is reduced greedily, one candidate edit at a time, keeping an edit when the
smaller plan still fails with the same verdict and still breaks one of the same invariant
ids (so a shrink never wanders off to a different bug). The edits, biggest first:

1. drop a process (its steps move to the first one);
2. drop a session with its principal and steps; drop a second member with its requests;
   lift a tight iteration budget;
3. drop one step (a submission, a drain claim, a kill, a stall, a clock jump, an
   interrupt, a correction, a terminal's turn, a redaction, a recovery round);
4. drop one reply fault, the crash point, the crash at an effect, a write failure, a slow
   tool or only its process's freeze while it waits to begin, the empty reply after a
   correction, a lane message's hold until its lane rotates, the small context window,
   the fallback route, the verification gate;
5. drop the terminal session, a chat client, the short lease wait, the slow build log;
6. round the times of steps down to whole seconds;
7. drop the lanes part, else runs of its events.

Passes repeat until none of them changes the plan, or the budget of runs is spent. The
result is ordered by ``WorldPlan.size``: fewest processes, then sessions, turns, faults and
steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sim.explore import edges
from sim.explore.lanes import LaneMessage, fewer_events
from sim.explore.plan import Step, WorldPlan
from sim.explore.run import RunReport, Verdict, run_plan

RUNS_MAX = 400


@dataclass
class Shrunk:
    plan: WorldPlan
    report: RunReport
    runs: int


def same_failure(first: RunReport) -> Callable[[RunReport], bool]:
    """The same bug: the same verdict and one of the same invariant ids; for an engine crash
    the same exception and message, for a liveness failure the same stuck statuses."""
    wanted = set(first.invariants)
    error = _first_line(first.error)
    statuses = {line.rsplit(" ", 1)[-1] for line in first.stuck}

    def still(report: RunReport) -> bool:
        if report.verdict is not first.verdict:
            return False
        if first.verdict is Verdict.ENGINE_CRASH:
            return _first_line(report.error) == error
        if first.verdict is Verdict.LIVENESS:
            return {line.rsplit(" ", 1)[-1] for line in report.stuck} == statuses
        return not wanted or bool(wanted & set(report.invariants))
    return still


def _first_line(text: str | None) -> str:
    return (text or "").splitlines()[0] if text else ""


def shrink(plan: WorldPlan, *, runs_max: int = RUNS_MAX,
           still_fails: Callable[[RunReport], bool] | None = None) -> Shrunk:
    """Reduce ``plan`` while it keeps failing; ``plan`` itself must fail."""
    report = run_plan(plan, trace=False)
    if report.verdict is Verdict.PASSED:
        raise ValueError(f"seed {plan.seed}: the plan passes, there is nothing to shrink")
    state = _State(plan, report, still_fails or same_failure(report), runs_max)
    changed = True
    while changed and state.runs < runs_max:
        before = state.plan
        for edit in (_fewer_processes, _fewer_sessions):
            for candidate in edit(state.plan):
                state.attempt(candidate)
        state.drop_chunks("steps")
        state.drop_chunks("replies")
        if state.plan.crash is not None:
            state.attempt(state.plan.model_copy(update={"crash": None}))
        if state.plan.crash_at_effect is not None:
            state.attempt(state.plan.model_copy(update={"crash_at_effect": None}))
        if state.plan.max_iterations is not None:
            state.attempt(state.plan.model_copy(update={"max_iterations": None}))
        state.drop_chunks("tool_timings")
        _calmer_tools(state)
        _unaimed(state)
        for option in ("context_window", "fallback_window"):
            if getattr(state.plan, option) is not None:
                state.attempt(state.plan.model_copy(update={option: None}))
        if state.plan.verify_before_answer:
            state.attempt(state.plan.model_copy(update={"verify_before_answer": False}))
        for member in list(state.plan.members):
            state.attempt(state.plan.model_copy(update={
                "members": {m: s for m, s in state.plan.members.items() if m != member},
                "steps": tuple(s for s in state.plan.steps
                               if getattr(s, "principal", None) != member)}))
        for site in list(state.plan.write_failures):
            state.attempt(state.plan.model_copy(update={"write_failures": {
                s: n for s, n in state.plan.write_failures.items() if s != site}}))
        _fewer_bystanders(state)
        for candidate in edges.simpler(state.plan):
            state.attempt(candidate)
        for candidate in _simpler_times(state.plan):
            state.attempt(candidate)
        state.fewer_lanes()
        changed = state.plan != before
    final = run_plan(state.plan, trace=True)
    if not state.keep(final):  # a plan is one run: the narrated rerun fails the same way
        raise AssertionError(f"seed {plan.seed}: the shrunk plan no longer fails when rerun")
    return Shrunk(state.plan, final, state.runs)


@dataclass
class _State:
    plan: WorldPlan
    report: RunReport
    keep: Callable[[RunReport], bool]
    runs_max: int
    runs: int = 1

    def attempt(self, candidate: WorldPlan) -> bool:
        """Run ``candidate``; keep it when it still fails the same way."""
        if self.runs >= self.runs_max or candidate == self.plan or candidate.size > self.plan.size:
            return False
        self.runs += 1
        tried = run_plan(candidate, trace=False)
        if self.keep(tried):
            self.plan, self.report = candidate, tried
            return True
        return False

    def drop_chunks(self, name: str) -> None:
        """Remove runs of ``name`` items, halves first, then quarters, down to single items
        (the core of delta debugging, without its complement step)."""
        items: tuple[object, ...] = getattr(self.plan, name)
        size = max(1, len(items) // 2)
        while items and self.runs < self.runs_max:
            start = 0
            while start < len(items) and self.runs < self.runs_max:
                kept = items[:start] + items[start + size:]
                if not self.attempt(self.plan.model_copy(update={name: kept})):
                    start += size
                items = getattr(self.plan, name)
            if size == 1:
                break
            size = max(1, size // 2)

    def fewer_lanes(self) -> None:
        """No lanes part, or else fewer of its events (halves first, down to single ones)."""
        lanes = self.plan.lanes
        if lanes is None or self.attempt(self.plan.model_copy(update={"lanes": None})):
            return
        size = max(1, len(lanes.events) // 2)
        while self.runs < self.runs_max:
            start = 0
            while lanes is not None and start < len(lanes.events) and self.runs < self.runs_max:
                if not self.attempt(self.plan.model_copy(update={
                        "lanes": fewer_events(lanes, start, size)})):
                    start += size
                lanes = self.plan.lanes
            if size == 1 or lanes is None:
                break
            size = max(1, size // 2)


def _fewer_processes(plan: WorldPlan) -> Iterator[WorldPlan]:
    if plan.processes <= 1:
        return
    last = plan.processes - 1
    moved: list[Step] = []
    for step in plan.steps:
        on_last = getattr(step, "process", None) == last
        if on_last and step.op in {"kill", "stall"}:
            continue  # the process is gone, and its faults with it
        moved.append(step.model_copy(update={"process": 0}) if on_last else step)
    yield plan.model_copy(update={"processes": last, "steps": tuple(moved), "lanes":
                                  plan.lanes.on_processes(last) if plan.lanes else None})


def _fewer_sessions(plan: WorldPlan) -> Iterator[WorldPlan]:
    if len(plan.sessions) <= 1:
        return
    for session in plan.sessions:
        yield plan.model_copy(update={
            "sessions": {k: v for k, v in plan.sessions.items() if k != session},
            "steps": tuple(s for s in plan.steps if getattr(s, "session", None) != session)})


def _simpler_times(plan: WorldPlan) -> Iterator[WorldPlan]:
    """Every time rounded down to a whole second, in one candidate (readability only)."""
    rounded = tuple(s.model_copy(update={"at_s": float(int(s.at_s))}) for s in plan.steps)
    if rounded != plan.steps:
        yield plan.model_copy(update={"steps": rounded})


def _calmer_tools(state: _State) -> None:
    """Each kept tool timing without its process's freeze (``frozen_late_start``)."""
    for index, timing in enumerate(state.plan.tool_timings):
        if timing.stall_s > 0:
            timings = list(state.plan.tool_timings)
            timings[index] = timing.model_copy(update={"stall_s": 0.0})
            state.attempt(state.plan.model_copy(update={"tool_timings": tuple(timings)}))


def _unaimed(state: _State) -> None:
    """The aimed parts' moments off: no empty reply after a correction
    (``sim/explore/corrected.py``), no check refused (``sim/explore/gated.py``), no
    summary failing after a late one
    (``sim/explore/cooldown.py``), each held lane message arriving at its time instead
    (``sim/explore/lineage.py``, ``cooldown.py``, ``waiter.py``)."""
    for option in ("empty_after_correction", "refuse_the_check", "summary_stumbles"):
        if getattr(state.plan, option):
            state.attempt(state.plan.model_copy(update={option: False}))
    lanes = state.plan.lanes
    for index, event in enumerate(lanes.events if lanes is not None else ()):
        if lanes is not None and isinstance(event, LaneMessage) \
                and (event.at_rotation or event.after_failure_s is not None
                     or event.after_rotation_s is not None or event.at_pass_elsewhere):
            events = list(lanes.events)
            events[index] = event.model_copy(update={
                "at_rotation": False, "after_failure_s": None, "after_rotation_s": None,
                "at_pass_elsewhere": False})
            state.attempt(state.plan.model_copy(update={
                "lanes": lanes.model_copy(update={"events": tuple(events)})}))
            lanes = state.plan.lanes


def _fewer_bystanders(state: _State) -> None:
    """No terminal session (its turns and clients with it), fewer clients, the default
    lease wait, a build log read at once."""
    for session in state.plan.terminals:
        state.attempt(state.plan.model_copy(update={
            "terminals": tuple(t for t in state.plan.terminals if t != session),
            "steps": tuple(s for s in state.plan.steps if getattr(s, "session", None) != session),
            "clients": tuple(c for c in state.plan.clients if c.session != session)}))
    state.drop_chunks("clients")
    for option in ("lease_wait_s", "build_log_s"):
        if getattr(state.plan, option) is not None:
            state.attempt(state.plan.model_copy(update={option: None}))
