"""Run one plan: a faulty phase, then a calm phase that must converge; judge the whole.

Theory of operation
-------------------
A plan runs through the same ``Story`` a scenario uses, with the same checkers, which
judge the whole durable record once, when the calm phase is over (a scenario judges after
every step). The world's logs only grow, and the checkers are written so that a state
that moves on later (an admission past ``started``, a lease taken again) still breaks the
same id at the end. A judgement at the faulty phase's end as well found nothing the last
one missed: a hunt of all 195 sabotages gave the same first failing seed, causal seed and
ids either way, and the one judgement makes a seed about a fifth quicker. The faulty
phase hands every step of the plan to its process at its virtual time (submissions and
drain claims as actors; kills, stalls and clock jumps as timers) with the plan's faults
armed, and runs the world until every actor has ended. The calm phase disarms every
fault and plays the operator: a new process starts, recovers (a started admission whose
owner died becomes ``unknown``), reconciles each unknown admission explicitly, and drains
every session until nothing is queued, within a bounded number of rounds.

The verdict, in order of gravity:

* ``engine_crash``: the run raised something other than a simulated crash (an engine bug);
* ``safety``: a checker found a violation in either phase;
* ``liveness``: after the calm phase some admission is still not terminal;
* ``passed``.

The run's digest hashes the timeline and the durable record, so two runs of one plan can
be compared byte for byte (``determinism``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import traceback
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pydantic_core import PydanticSerializationError

from hermes_ref import effects as fx
from hermes_ref.admission import AdmissionStatus
from hermes_ref.compaction import COMPRESSION_PURPOSE
from hermes_ref.errors import PersistenceError
from hermes_ref.lease import holder_fields
from hermes_ref.limits import ProviderRoute
from hermes_ref.models import Role
from sim import interventions
from sim.explore import edges, lanes, terminal, watch
from sim.explore.model import ExploreModel
from sim.explore.plan import (
    BIG_LOG,
    BIG_LOG_TEXT,
    ClockJump,
    Drain,
    FaultKind,
    Handover,
    Interrupt,
    Kill,
    Redirect,
    Stall,
    Submit,
    WorldPlan,
)
from sim.harness import Story
from sim.interventions import correct_at_a_moment, running_turn
from sim.processes import ProcessHandle
from sim.world import RaisedRun, TurnRun, World

CALM_ROUNDS_MAX = 4  # drain passes of the calm phase before a queue counts as stuck
FALLBACK_MODEL = "fallback-small"  # the model of a plan's fallback route (LOOP-6)


class Verdict(StrEnum):
    PASSED = "passed"
    SAFETY = "safety"
    LIVENESS = "liveness"
    ENGINE_CRASH = "engine_crash"


EXIT_CODES = {Verdict.PASSED: 0, Verdict.SAFETY: 1, Verdict.LIVENESS: 3,
              Verdict.ENGINE_CRASH: 4}
NONDETERMINISM_EXIT = 5


@dataclass
class RunReport:
    """What one run of a plan came to."""

    seed: int
    verdict: Verdict
    violations: list[str] = field(default_factory=list)
    invariants: list[str] = field(default_factory=list)  # ids of the violations, sorted
    stuck: list[str] = field(default_factory=list)  # admissions not terminal after the calm
    error: str | None = None
    fired: set[FaultKind] = field(default_factory=set)
    crash_points: set[str] = field(default_factory=set)
    digest: str = ""
    timeline: str = ""
    entries: list[tuple[float, str, str, int | None]] = field(default_factory=list)
    admissions: int = 0
    turns: int = 0
    steps: int = 0  # effects performed by every process

    def as_json(self) -> dict[str, object]:
        return {"seed": self.seed, "verdict": self.verdict.value, "violations": self.violations,
                "invariants": self.invariants, "stuck": self.stuck, "error": self.error,
                "fired": sorted(k.value for k in self.fired),
                "crash_points": sorted(self.crash_points), "digest": self.digest,
                "admissions": self.admissions, "turns": self.turns, "steps": self.steps}


NO_FOLDER = Path(os.devnull) / "hermes-ref-memory-world"


def run_plan(plan: WorldPlan, *, store_kind: str = "memory", trace: bool = True,
             workdir: Path | None = None, digest: bool = True) -> RunReport:
    """Run ``plan`` on a fresh world of ``store_kind`` and judge it.

    A world on the memory store touches no file, so it gets no folder: its workdir is a
    path under the null device, where any attempt to write fails loudly. With ``digest``
    false the report's digest is left empty (a sweep that compares no runs reads none)."""
    if workdir is not None or store_kind == "memory":
        return _run(plan, store_kind, trace, workdir or NO_FOLDER, digest)
    with tempfile.TemporaryDirectory(prefix="hermes-ref-explore-") as tmp:
        return _run(plan, store_kind, trace, Path(tmp), digest)


def _run(plan: WorldPlan, store_kind: str, trace: bool, workdir: Path,
         digest: bool = True) -> RunReport:
    story = Story(store_kind=store_kind, workdir=workdir, seed=plan.seed, trace=trace,
                  check_every_step=False)  # judged once, at the calm phase's end
    story.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(plan.replies, ids=story.world.chooser, grace_outages=plan.grace_outages,
                         huge_reads_share_id=plan.huge_reads_share_id,
                         empty_after_correction=plan.empty_after_correction,
                         refuse_the_check=plan.refuse_the_check)
    fired: set[FaultKind] = set()
    points: set[str] = set()
    error: str | None = None
    try:
        _faulty_phase(story, plan, model, fired, points)
        calm_phase(story)
        story.check(always=True)
    except Exception as exc:  # an engine bug, not a simulated crash: report it
        error = _engine_error(story, exc)
    if error is not None:
        error = _judge_the_wreck(story, error)
    world = story.world
    fired |= {r.kind for r in model.fired}
    if world.write_failures:
        fired.add(FaultKind.WRITE_FAILURE)
    rows = world.store.admission_rows()
    left = stuck(story)
    violations = [str(v) for v in story.violations]
    verdict = (Verdict.ENGINE_CRASH if error is not None else Verdict.SAFETY if violations
               else Verdict.LIVENESS if left else Verdict.PASSED)
    timeline = world.timeline.render()
    hashed = hashlib.sha256(f"{timeline}\n{_record_text(world)}".encode()).hexdigest() \
        if digest else ""
    report = RunReport(
        seed=plan.seed, verdict=verdict, violations=violations,
        invariants=sorted({v.invariant for v in story.violations}), stuck=left, error=error,
        fired=fired, crash_points=points, digest=hashed, timeline=timeline,
        entries=list(world.timeline.entries),
        admissions=len(rows), turns=len(world.runs), steps=world.effects_performed)
    for actor in world.scheduler.live():
        actor.coro.close()  # the run is over: actors it left waiting never resume
    world.store.close()
    return report


def _engine_error(story: Story, exc: Exception) -> str:
    """What the run raised, for the report, and its line in the timeline."""
    story.world.timeline.add("ENGINE", f"{type(exc).__name__}: {exc}")
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc(limit=8))


def _judge_the_wreck(story: Story, error: str) -> str:
    """The engine raised, and the run stops there: judge the record it left.

    Nothing in flight will ever finish, so every live process is taken as dead at this
    instant and its open turns are judged as a crash leaves them (excused their endings);
    what the record shows besides (a result stored twice, a counter gone wrong) is found
    as at any check. Returns ``error``, or the checkers' own if they raised.
    """
    world = story.world
    for process in world.processes.values():
        if process.alive:
            process.alive, process.died_at = False, world.clock.now()
            process.died_seq = world.effects_performed
    world.runs.extend(_cut_short(world))
    try:
        story.check(always=True)
    except Exception as exc:
        return f"{error}\nthen the checkers raised: {_engine_error(story, exc)}"
    return error


def _cut_short(world: World) -> list[TurnRun]:
    """The turns in flight when the engine raised (the one that raised among them), as
    runs their process died in; a turn the record never mentions is left out."""
    ran = {r.turn_id for r in world.runs}
    record = world.store.snapshot()
    users = {m.message.turn_id: m for m in reversed(record.messages)
             if m.message.role is Role.USER}  # a turn's first user row wins
    granted = {holder_fields(g.holder).get("turn"): g.session_id for g in record.lease_grants}
    out = []
    for actor in world.scheduler.actors:
        turn_id = actor.turn_id
        if turn_id is None or turn_id in ran or (actor.done and actor.raised is None):
            continue
        ran.add(turn_id)
        user = users.get(turn_id)
        session = user.session_id if user is not None else granted.get(turn_id)
        if session is not None:
            text = (user.message.content or "") if user is not None else ""
            failed = world.write_failures_by_turn.get(turn_id, 0)
            error = actor.raised
            out.append(TurnRun(session, text, turn_id, True, failed) if error is None else RaisedRun(
                session, text, turn_id, True, failed, raised=f"{type(error).__name__}: {error}",
                store_error=isinstance(error, PersistenceError)))
    return out


def _record_text(world: World) -> str:
    """The durable record as text for the digest. A streamed delta keeps the text the
    provider sent, a lone surrogate included, which JSON cannot encode: then its repr."""
    snapshot = world.store.snapshot()
    try:
        return snapshot.model_dump_json()
    except PydanticSerializationError:
        return repr(snapshot.model_dump())


def _faulty_phase(story: Story, plan: WorldPlan, model: ExploreModel,
                  fired: set[FaultKind], points: set[str]) -> None:
    world = story.world
    story.use_provider(model)

    def on_crash(point: str) -> None:
        if point.startswith("effect#"):
            fired.add(FaultKind.CRASH_AT_EFFECT)
            return
        fired.add(FaultKind.CRASH_POINT)
        points.add(point)
    world.on_crash = on_crash
    stage(story, plan)
    story.run_all()
    world.on_crash = None
    world.stream_cuts.clear()  # a cut the faulty phase did not reach is no fault of the calm
    world.moments.clear()  # nor a correction held for a moment it did not reach
    fired |= _fired_in_the_world(world, plan)
    if any(point == "SIGKILL" for _, point in world.death_points):
        fired.add(FaultKind.KILL)  # a scheduled kill landed on a live process
    jumped = sum(len(entries) for entries in _jump_stalls(world))
    jumped += FaultKind.LOCK_STALL in fired  # a freeze holding a lock is a fault of its own
    if world.tools.late_stalls:  # a freeze while a late call waits is a fault of its own
        fired.add(FaultKind.FROZEN_LATE_START)
        jumped += len(world.tools.late_stalls)
    if len(world.stalls) > jumped:
        fired.add(FaultKind.STALL)  # a stall began (a clock jump's pauses are not stalls)
    if world.clock_jumps:
        fired.add(FaultKind.CLOCK_JUMP)
    if watch.reconnected(story):
        fired.add(FaultKind.DISCONNECT)  # a client dropped and came back
    if plan.lanes is not None and lanes.restarted(story):
        fired.add(FaultKind.LANE_RESTART)  # a start pass ran after a stop or a death
    if world.rotation_arrivals:
        fired.add(FaultKind.LANE_AT_ROTATION)  # a held message arrived as its lane rotated
    if world.failure_arrivals:
        fired.add(FaultKind.COOLDOWN_EDGE)  # a held message came back after its lane's failure
    if world.rotation_waits:
        fired.add(FaultKind.WAIT_PAST_ROTATION)  # a turn with a lineage waited out a rotation


def _fired_in_the_world(world: World, plan: WorldPlan) -> set[FaultKind]:
    """The kinds the world carries out, not the model: an intervention that found a turn
    running, a timed tool that was called, a request sent to the fallback route."""
    fired = {FaultKind(i.what) for i in world.interventions
             if i.what in ("interrupt", "redirect") and i.turn_id is not None}
    called = {(c.name, c.arguments) for record in world.calls if record.reply is not None
              for c in record.reply.tool_calls}
    if any(name == t.tool and f'"{t.path}"' in args for t in plan.tool_timings
           for name, args in called):
        fired.add(FaultKind.SLOW_TOOL)
    if any(record.request.model == FALLBACK_MODEL for record in world.calls):
        fired.add(FaultKind.FALLBACK)
    if plan.verify_before_answer and any(
            "check that the file changes" in (m.content or "")
            for record in world.calls for m in record.request.messages[-1:]):
        fired.add(FaultKind.VERIFY_GATE)  # an answer was held back and the model asked to check
    if plan.context_window is not None and world.summary_calls:
        fired.add(FaultKind.SMALL_WINDOW)  # the window filled: a compaction asked for a summary
    return fired | edges.fired(world, plan)


def stage(story: Story, plan: WorldPlan) -> list[ProcessHandle]:
    """Set the world of ``plan`` up and hand every step out; ``run_all`` then runs it.

    A rendered scenario (``sim.explore.render``) makes exactly these calls, in this order.
    """
    story.files(dict(plan.files))
    if plan.max_iterations is not None:
        story.limits(max_iterations=plan.max_iterations)
    _stage_options(story, plan)  # limits before the processes: each starts with them
    for session, principal in plan.sessions.items():
        story.bind(principal, session=session)
        story.bind(f"op-{session}", session=session, role="operator", kind="operator")
    for member, session in plan.members.items():
        story.bind(member, session=session)
    handles: list[ProcessHandle] = [story.main_process()]
    handles += [story.process() for _ in range(plan.processes - 1)]
    for fault in plan.replies:
        if fault.kind is FaultKind.SLOW_REPLY:
            story.delay_reply(fault.call, fault.seconds)
        elif fault.kind is FaultKind.STREAM_CUT:
            story.world.stream_cuts[fault.call] = fault.deltas
    if plan.crash is not None or plan.crash_at_effect is not None or plan.write_failures:
        story.faults(crash=plan.crash.name if plan.crash else None,
                     crash_at_effect=plan.crash_at_effect,
                     fail_writes={site.value: n for site, n in plan.write_failures.items()})
    watch.stage_clients(story, plan.clients)
    for step in plan.steps:
        if isinstance(step, Submit):
            story.start_submit(handles[step.process], step.principal, step.request_id,
                               {"text": step.text, **step.claims}, session=step.session,
                               after_s=step.at_s, intent=step.intent, kind=step.kind)
        elif isinstance(step, Drain):
            story.start_drain(handles[step.process], step.session, after_s=step.at_s)
        elif isinstance(step, Kill):
            story.kill(handles[step.process], after_s=step.at_s)
        elif isinstance(step, Stall):
            story.stall(handles[step.process], step.seconds, after_s=step.at_s)
        elif isinstance(step, ClockJump):
            jump_clock(story, step.seconds, after_s=step.at_s)
        elif isinstance(step, Interrupt):
            story.interrupt(after_s=step.at_s, session=step.session)
        elif isinstance(step, Redirect) and step.during is not None:
            correct_at_a_moment(story, step.text, after_s=step.at_s, session=step.session,
                                during=step.during, slow_s=step.slow_s, calls=step.calls)
        elif isinstance(step, Redirect):
            redirect_a_running_turn(story, step.text, after_s=step.at_s, session=step.session)
        elif isinstance(step, Handover):
            story.start_turn(step.text, session=step.into, process=handles[step.process],
                             after_s=step.at_s, history=edges.handed_history(step.history))
        elif not terminal.stage_step(story, step, handles):
            watch.stage_step(story, step, handles)
    if plan.lanes is not None:
        lanes.stage(story, plan.lanes, handles)
    return handles


def redirect_a_running_turn(story: Story, text: str, *, after_s: float, session: str) -> None:
    """``after_s`` from now, the user corrects the session's turn if it is waiting on a
    model call (the correction cuts the call and the turn takes it in at once). To a turn
    doing anything else, or to an idle session, the user would send a new message
    instead, so then nothing is sent: a correction must not outlive its turn.

    The correction arrives an instant after the user saw the turn waiting (a timer at the
    same time, as ``Story.redirect`` sets), and other actors of that instant run between:
    the reply may have come, or the turn's process died. So it is delivered only if the
    turn still waits on its call when it arrives; queued for no running turn, it would be
    taken in by the session's next turn as that turn's own."""
    world = story.world

    def arrives() -> bool:
        if _waits_on_a_call(world, session):
            return True
        world.timeline.add("redirect", f"nothing sent: the model call of {session} ended first")
        return False

    def fire() -> None:
        if _waits_on_a_call(world, session):
            interventions.redirect(story, text, 0.0, session, arrives=arrives)
        else:
            world.timeline.add("redirect", f"nothing sent: no model call of {session} is under way")
    world.scheduler.at(world.clock.now() + after_s, fire)


def _waits_on_a_call(world: World, session: str) -> bool:
    """Whether a live turn of ``session`` is parked on its model call (LOOP-4's moment).
    A compaction's summary call is not one: the user sees no reply stream then, only a
    turn compacting, and would send a new message instead (a slow summarizer, the
    ``stops`` part, parks turns on it)."""
    actor = running_turn(world, session)
    return actor is not None and actor.wait is not None \
        and isinstance(actor.pending, fx.CallProvider) \
        and actor.pending.request.purpose != COMPRESSION_PURPOSE


def _stage_options(story: Story, plan: WorldPlan) -> None:
    """The plan's huge log, slow tools, limits and fallback route (``stage``'s calls)."""
    if any(r.kind is FaultKind.HUGE_READ for r in plan.replies):
        story.files({BIG_LOG: BIG_LOG_TEXT})
    if plan.verify_before_answer:
        story.limits(verify_before_answer=True)
    for timing in plan.tool_timings:
        if timing.stuck:
            story.world.tools.stuck(timing.tool, path=timing.path,
                                    start_delay_s=timing.start_delay_s, stall_s=timing.stall_s)
        else:
            story.world.tools.slow(timing.tool, timing.seconds, path=timing.path,
                                   start_delay_s=timing.start_delay_s, stall_s=timing.stall_s)
    if plan.context_window is not None:
        story.limits(context_window_tokens=plan.context_window)
    if plan.fallback_window is not None:
        story.limits(fallback_providers=(ProviderRoute(
            model=FALLBACK_MODEL, context_window_tokens=plan.fallback_window, token_ratio=1.25),))
        model = story.world.provider
        if isinstance(model, ExploreModel):
            story.use_provider_for(FALLBACK_MODEL, model.for_fallback())
    terminal.stage_terminal(story, plan.terminals, plan.lease_wait_s, plan.build_log_s)
    if plan.lanes is not None:
        story.limits(**plan.lanes.settings())
    edges.stage(story, plan)


def jump_clock(story: Story, seconds: float, *, after_s: float) -> None:
    """``after_s`` from now the virtual clock leaps ``seconds`` ahead: to every live
    process that is a pause of the whole world (recorded as a stall of each)."""
    world = story.world

    def jump() -> None:
        now = world.clock.now()
        paused = [(p.pid, now, now + seconds) for p in world.processes.values() if p.alive]
        world.stalls.extend(paused)
        _jump_stalls(world).append(paused)
        world.clock_jumps.append((now, seconds))
        world.clock.advance(seconds)
        world.timeline.add("FAULT", f"the clock jumps {seconds:g} s")
    world.scheduler.at(world.clock.now() + after_s, jump)


def _jump_stalls(world: World) -> list[list[tuple[int, float, float]]]:
    """The pauses each clock jump entered in ``world.stalls`` (kept beside the world)."""
    kept: list[list[tuple[int, float, float]]] = world.__dict__.setdefault("_jump_stalls", [])
    return kept


def calm_phase(story: Story) -> list[str]:
    """Faults off; a new process recovers, reconciles the unknown and drains until done.

    Returns the admissions still not terminal afterwards (liveness: there must be none).
    """
    world = story.world
    if isinstance(world.provider, ExploreModel):
        world.provider.calm = True
    world.provider_delays_s.clear()
    world.tools.disarm_late_stalls()  # a late call's process no longer freezes
    story.faults()
    world.timeline.add("calm", "faults off: a new process recovers and drains")
    story.restart()
    story.recover()
    for _ in range(CALM_ROUNDS_MAX):
        for row in story.world.store.admission_rows():
            if row.status is AdmissionStatus.UNKNOWN:
                story.reconcile(f"op-{row.session_id}", row.admission_id, session=row.session_id)
        waiting = sorted({r.session_id for r in story.world.store.admission_rows()
                          if r.status is AdmissionStatus.QUEUED})
        if not waiting:
            break
        for session in waiting:
            story.drain(session)
    return stuck(story)


def stuck(story: Story) -> list[str]:
    """Admissions that are not terminal, as ``session/admission status``."""
    return [f"{r.session_id}/{r.admission_id} {r.status.value}"
            for r in story.world.store.admission_rows()
            if r.status is not AdmissionStatus.TERMINAL]
