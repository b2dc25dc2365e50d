"""The scenario DSL and runner: small stories that drive the engine through a world.

Theory of operation
-------------------
A scenario is a function decorated with ``@scenario(title, invariants=...)`` that tells
a story through a ``Story``::

    @scenario("A tool call is durable before the tool runs", invariants=("TOOL-1",))
    def tool_call_is_durable_first(s: Story) -> None:
        s.script(tool_calls(("read_file", {"path": "notes.txt"})), text("It says hi."))
        s.files({"notes.txt": "hi"})
        result = s.turn("What do my notes say?")
        s.expect(result is not None and result.final_response == "It says hi.", "answered")

The story sets up the world (script, files, limits, faults), then runs turns, crashes
and restarts. After every step the runner reads the durable record and runs every
checker; a violation, a failed ``expect`` or an unexpected exception fails the scenario.

The same story runs on the in-memory store and on the SQLite store; the rendered
timeline and transcript must be the same text on both.
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hermes_ref import router  # SES
from hermes_ref.admission import Ack, AdmissionRow, EpochStart, Move, PrincipalKind, Refusal
from hermes_ref.door import DrainStep, Submission, internal_submission
from hermes_ref.engine import Engine
from hermes_ref.errors import BadInput
from hermes_ref.lane_restart import LaneEntry  # SES
from hermes_ref.limits import Limits
from hermes_ref.models import Message, SessionRecord, ToolSpec
from hermes_ref.outcomes import TurnResult
from hermes_ref.ports import Provider
from hermes_ref.prologue import TurnInput
from hermes_ref.session import Route, SessionSource  # SES
from hermes_ref.tool_specs import REFERENCE_TOOLS, TOOLS_BY_NAME
from sim import door_story, interventions, processes
from sim.checkers import Violation, run_all
from sim.checkers.admission import DoorObservation
from sim.checkers.base import Memo
from sim.checkers.context import CallerHistoryRun
from sim.clock import VirtualClock
from sim.door_story import DoorState
from sim.driver import FULL_TEXT, SimDriver
from sim.faults import Crashed, CrashPoint, FaultPlan
from sim.processes import Processes, ProcessHandle, TurnHandle
from sim.provider import ScriptedProvider
from sim.store import MemoryStore
from sim.tools import SimTools
from sim.world import CrashableStore, TurnRun, World

StoreKind = str  # "memory" | "sqlite"
STORE_KINDS: tuple[StoreKind, ...] = ("memory", "sqlite")


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    title: str
    invariants: tuple[str, ...]
    stage: str
    story: Callable[[Story], None]
    module: str


REGISTRY: dict[str, ScenarioSpec] = {}


def scenario(
    title: str, *, invariants: tuple[str, ...], stage: str = "turn"
) -> Callable[[Callable[[Story], None]], Callable[[Story], None]]:
    """Register a story. ``title`` reads as a sentence; ``invariants`` are catalog ids."""

    def register(fn: Callable[[Story], None]) -> Callable[[Story], None]:
        name = fn.__name__
        if name in REGISTRY and REGISTRY[name].module != fn.__module__:
            raise ValueError(f"two scenarios are named {name!r}")
        REGISTRY[name] = ScenarioSpec(name, title, invariants, stage, fn, fn.__module__)
        return fn

    return register


class ExpectationFailed(AssertionError):
    pass


def make_store(kind: StoreKind, workdir: Path, holder_alive: Callable[[str], bool],
               clock: Callable[[], float] | None = None) -> CrashableStore:
    if kind == "memory":
        return MemoryStore(holder_alive=holder_alive, clock=clock)
    if kind == "sqlite":
        from sim.sqlite_store import SqliteStore

        return SqliteStore(workdir / "hermes-ref.db", holder_alive=holder_alive, clock=clock)
    raise ValueError(f"unknown store kind {kind!r} (known: {', '.join(STORE_KINDS)})")


@dataclass
class Story:
    """The handle a scenario uses to build its world and drive turns."""

    store_kind: StoreKind
    workdir: Path
    seed: int = 0
    trace: bool = True
    # True: every step that changed the record is judged (a scenario, the state machine);
    # False: only ``check(always=True)`` judges (explore judges once, at the end)
    check_every_step: bool = True
    violations: list[Violation] = field(default_factory=list)
    _limits: Limits = field(default_factory=Limits)
    _provider: Provider | None = None
    _files: dict[str, str] = field(default_factory=dict)
    _faults: FaultPlan = field(default_factory=FaultPlan)
    _world: World | None = None
    _engine: Engine | None = None
    _last: TurnResult | None = None
    _tools: tuple[ToolSpec, ...] = REFERENCE_TOOLS
    _memo: Memo = field(default_factory=Memo)  # the checkers' readings kept between checks
    _judged: tuple[DoorObservation, list[Violation]] | None = None  # the last check, if comparable

    # -- setting the stage ------------------------------------------------------------
    def script(self, *steps: Any) -> ScriptedProvider:
        provider = ScriptedProvider(list(steps))
        self._provider = provider
        if self._world is not None:
            self._world.provider = provider
        return provider

    def use_provider(self, provider: Provider) -> None:
        self._provider = provider
        if self._world is not None:
            self._world.provider = provider

    def files(self, files: dict[str, str]) -> None:
        """Files in the simulated workspace; may be called before or between turns."""
        self._files.update(files)
        if self._world is not None:
            self._world.tools.add_files(files)

    def symlinks(self, links: dict[str, str]) -> None:
        """Symlinks in the simulated workspace: link -> target, as ``ln -s target link``."""
        self.world.tools.add_links(links)

    def limits(self, **overrides: Any) -> None:
        self._limits = self._limits.model_copy(update=overrides)
        if self._engine is not None:
            self._engine.limits = self._limits

    def tools(self, *names: str) -> None:
        """The tools the engine offers from now on, this process and later ones (the
        reference tools by default); a list that changes between turns, as a tool server
        that connects late makes it change."""
        unknown = [name for name in names if name not in TOOLS_BY_NAME]
        if unknown:
            raise BadInput(f"unknown tool(s) {', '.join(unknown)}; the reference tools are "
                           f"{', '.join(sorted(TOOLS_BY_NAME))}")
        self._tools = tuple(TOOLS_BY_NAME[name] for name in names)
        if self._engine is not None:
            self._engine.tools = self._tools
        self.world.timeline.add("tools", ", ".join(names) or "none")

    def faults(self, *, crash: str | None = None, crash_at_effect: int | None = None,
               fail_writes: dict[str, int] | None = None) -> None:
        """Plan faults for what follows (a crash point like ``after:tool_calls``)."""
        try:
            plan = FaultPlan(crash=CrashPoint.parse(crash) if crash else None,
                             crash_at_effect=crash_at_effect, fail_writes=fail_writes or {})
        except ValidationError as error:
            raise BadInput(f"bad fault plan: {error.errors()[0]['msg']}") from error
        self._faults = plan
        if self._world is not None:
            from sim.faults import FaultState

            self._world.faults = plan
            self._world.fault_state = FaultState(plan)

    # -- the world --------------------------------------------------------------------
    @property
    def world(self) -> World:
        if self._world is None:
            self._world = self._build_world()
        return self._world

    def _build_world(self) -> World:
        provider = self._provider or ScriptedProvider([])
        alive: dict[str, Callable[[str], bool]] = {}
        clock = VirtualClock()
        store = make_store(self.store_kind, self.workdir, lambda h: alive["fn"](h), clock.now)
        world = World(store=store, provider=provider, tools=SimTools(dict(self._files)),
                      seed=self.seed, faults=self._faults, trace=self.trace, clock=clock)
        alive["fn"] = world.holder_alive
        return world

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            world = self.world
            self._engine = Engine(limits=self._limits, tools=self._tools,
                                  holder=world.holder, phase_observer=world.timeline.phase)
        return self._engine

    # -- steps --------------------------------------------------------------------------
    def turn(self, text: str, *, session: str = "s-1", injected: str | None = None,
             platform: str | None = None, history: list[Message] | None = None,
             ) -> TurnResult | None:
        """Run one turn; None when the process crashed during it.

        ``history`` is handed to the turn as the caller's own list. The harness keeps the
        list and a copy of what it held, and a checker compares the two after every later
        step too, so a story must not change a list it has handed over (give the next turn
        a new one). ``platform`` overrides ``TurnInput.platform``.
        """
        world, engine = self.world, self.engine
        extra = (f" platform={platform}" if platform else "") + (
            f" history={len(history)}" if history is not None else "")
        world.timeline.add("turn", f"{session} {text!r}{extra}")
        minted, failures = len(world.minted_turns), world.write_failures
        held = tuple(history) if history is not None else ()
        before = len(self.transcript(session)) if history is not None else 0
        inp = TurnInput(session_id=session, text=text, injected_context=injected, history=history,
                        **({"platform": platform} if platform else {}))
        try:
            result = SimDriver(world).run(engine.run_turn(inp))
        except Crashed:
            self._engine = None  # the process is gone with everything it held
            result = None
        ids = world.minted_turns[minted:]
        args = (session, text, ids[0] if ids else None, result is None,
                world.write_failures - failures)
        retry = result.retryable if result is not None else None
        answer = result.final_response if result is not None else None
        world.runs.append(
            TurnRun(*args, retryable=retry, returned=result is not None, answer=answer)
            if history is None else
            CallerHistoryRun(*args, retryable=retry, caller=history, held=held,
                             rows_before=before, returned=result is not None, answer=answer))
        self._last = result
        if result is not None:
            world.timeline.add("result", f"{result.exit_reason.value} final={_brief(result.final_response)}")
        self.check()
        return result

    def request_compaction(self, session: str = "s-1") -> None:
        """CMP-4: the user asks for a manual compaction, run before the next turn's first
        call; the world keeps a note of it (a checker excuses it from the cooldown)."""
        self.engine.request_compaction(session)
        self.world.manual_compactions.append((session, self.world.effects_performed))
        self.world.timeline.add("compact", f"{session} manual compaction asked for")

    def restart(self) -> None:
        """Start a new process on the same world (the old one is dead)."""
        self.world.restart()
        self._engine = None
        self.check()

    def expect(self, condition: bool, message: str) -> None:
        if not condition:
            self.world.timeline.add("EXPECT", f"failed: {message}")
            raise ExpectationFailed(message)

    def session_record(self, session: str) -> SessionRecord:
        """The row the engine would create for ``session`` (for stories that set up a lane)."""
        from hermes_ref.prologue import session_record

        return session_record(TurnInput(session_id=session, text=""), self.engine.tools,
                              self.world.clock.now())

    def transcript(self, session: str = "s-1") -> list[Message]:
        return self.world.store.snapshot().transcript(session)

    def check(self, *, always: bool = False) -> list[Violation]:
        """Judge the world's record with every checker; the violations not seen before.

        With ``check_every_step`` off, a step's own check is skipped and only ``always``
        judges. A later check sees every log a skipped one would have (they only grow), but
        not every state: an admission moves on from ``started``, a lease row is taken
        again. The checkers are written so that a state that moves on still breaks the same
        id at the end, though the finding may read differently (see docs/explore.md).

        The checkers are pure functions of the observation. When nothing in it changed
        since the last check, their findings are the last check's, so those are taken
        again instead of judging the same values twice.
        """
        if not (self.check_every_step or always):
            return []
        obs = self._observe()
        last = self._judged
        found = last[1] if last is not None and last[0] == obs else run_all(obs)
        self._judged = (obs, found) if _comparable(obs) else None
        known = {str(v) for v in self.violations}
        fresh = [v for v in found if str(v) not in known]
        for violation in fresh:
            self.world.timeline.add("VIOLATE", str(violation))
        self.violations.extend(fresh)
        return fresh

    def _observe(self) -> DoorObservation:
        world = self.world
        return DoorObservation(batches=tuple(world.batches),  # ADM: with the world's ack log
                               record=world.store.snapshot(), ledger=tuple(world.tools.ledger),
                               calls=tuple(world.calls), crash_seqs=tuple(world.crash_seqs),
                               limits=self._limits, runs=tuple(world.runs),
                               acks=tuple(world.acks), lease_log=tuple(world.lease_log),
                               deaths=world.deaths(), stalls=tuple(world.stalls),
                               failed_writes=tuple(world.failed_writes),
                               death_seqs=world.death_seqs(),
                               interventions=tuple(world.interventions),  # LOOP-4/5, FIN-4
                               lane_effects=tuple(world.lane_effects),  # SES-7
                               clients=tuple(world.clients),  # DEL-2
                               summary_calls=tuple(world.summary_calls),  # CMP
                               manual_compactions=tuple(world.manual_compactions),
                               memo=self._memo)

    # -- several processes (the steps live in sim/processes.py) ------------------------
    _processes: Processes = field(default_factory=Processes)

    def process(self) -> ProcessHandle:
        """Start one more agent process in this world: its own engine, caches and holder."""
        return processes.start(self)

    def start_turn(self, text: str, *, session: str = "s-1", process: ProcessHandle | None = None,
                   after_s: float = 0.0, platform: str | None = None,
                   injected: str | None = None,
                   history: list[Message] | None = None) -> TurnHandle:
        """Hand a turn to ``process`` (the story's own by default), to begin ``after_s``
        from now; it runs when the story calls ``run_all``. ``injected`` is per-turn
        context for the API copy of the user row only (WIRE-1), as in ``turn``; ``history``
        is the caller's own list, kept and judged as ``turn`` keeps it."""
        return processes.start_turn(self, text, session=session, process=process,
                                    after_s=after_s, platform=platform, injected=injected,
                                    history=history)

    def run_all(self) -> None:
        """Run the world until every turn handed out has ended; then check the record."""
        processes.run_all(self)

    def stall(self, process: ProcessHandle, seconds: float, *, after_s: float = 0.0) -> None:
        """``after_s`` from now, freeze every actor of ``process`` for ``seconds`` (it lives on)."""
        processes.freeze(self, process, seconds, after_s)

    def kill(self, process: ProcessHandle, *, after_s: float = 0.0) -> None:
        """``after_s`` from now, the process dies wherever its actors are."""
        processes.kill(self, process, after_s)

    def main_process(self) -> ProcessHandle:
        """The story's own process (the one ``turn`` runs on), as a handle."""
        return processes.default(self)

    def delay_reply(self, call: int, seconds: float) -> None:
        """The provider's answer to the world's ``call``-th request arrives ``seconds`` late."""
        self.world.provider_delays_s[call] = seconds

    # -- the user's hand on a running turn, and per-route fakes (sim/interventions.py) -----
    def interrupt(self, *, after_s: float, session: str = "s-1") -> None:
        """``after_s`` from now, the user stops the session's running turn (FIN-4)."""
        interventions.interrupt(self, after_s, session)

    def redirect(self, text: str, *, after_s: float, session: str = "s-1") -> None:
        """``after_s`` from now, the user sends a correction to the running turn (LOOP-4)."""
        interventions.redirect(self, text, after_s, session)

    def script_for(self, model: str, *steps: Any) -> ScriptedProvider:
        """A scripted fake of its own for requests to ``model`` (a fallback route, LOOP-6)."""
        return interventions.script_for(self, model, steps)

    def use_provider_for(self, model: str, provider: Provider) -> None:
        """Any fake of its own for requests to ``model`` (LOOP-6)."""
        self.world.providers[model] = provider

    # -- admission door (the steps live in sim/door_story.py) ----------------------------
    _door: DoorState = field(default_factory=DoorState)

    def bind(self, principal: str, *, session: str = "s-1", role: str = "member",
             kind: str = "user") -> None:
        """Bind ``principal`` to ``session`` with ``role`` (the session row is made first)."""
        door_story.bind(self, principal, session, role, kind)

    def submit(self, principal: Any, request_id: Any, payload: Any, *, session: Any = "s-1",
               intent: Any = "queue") -> Ack | Refusal | None:
        """Hand an input to the door; None when the process died before it answered."""
        return door_story.submit(self, Submission(principal, session, request_id, payload,
                                                  intent))

    def internal(self, kind: str, principal: str, event_id: str, text: str, *,
                 session: str = "s-1") -> Ack | Refusal | None:
        """A background completion, cron tick or subagent report, through the same door."""
        sub = internal_submission(PrincipalKind(kind), principal, session, event_id, text)
        return door_story.submit(self, sub)

    def drain(self, session: str = "s-1", *, steps: int | None = None) -> list[DrainStep]:
        """Claim and run the session's admissions in order until none is claimable."""
        return door_story.drain(self, session, steps)

    def recover(self, process: ProcessHandle | None = None) -> EpochStart | None:
        """Recovery on ``process`` (the story's own by default): it begins its own runtime
        epoch (done by its first door step anyway), or recovers under the one it has."""
        return door_story.recover(self, process)

    def start_submit(self, process: ProcessHandle, principal: Any, request_id: Any,
                     payload: Any, *, session: Any = "s-1", after_s: float = 0.0,
                     intent: Any = "queue", kind: str | None = None,
                     ) -> door_story.DoorActor | None:
        """Hand an input to the door on ``process``, ``after_s`` from now (see ``run_all``);
        ``kind`` makes it an internal event claiming that kind (``background``, ``cron``,
        ``subagent``), which the binding must match."""
        claimed = PrincipalKind(kind) if kind is not None else None
        return door_story.start_submit(self, process, Submission(
            principal, session, request_id, payload, intent, claimed), after_s)

    def start_drain(self, process: ProcessHandle, session: str = "s-1", *,
                    after_s: float = 0.0, poll_s: float = 1.0,
                    tries: int = 120) -> door_story.DoorActor | None:
        """One drain claim of ``session`` on ``process``, ``after_s`` from now; while another
        admission is in flight it asks again every ``poll_s`` (see ``run_all``)."""
        return door_story.start_drain(self, process, session, after_s, poll_s, tries)

    def reconcile(self, principal: str, admission_id: str, *,
                  session: str = "s-1") -> AdmissionRow | Refusal | None:
        """An operator's explicit verdict on an unknown admission."""
        return door_story.resolve(self, principal, session, admission_id, Move.RECONCILE)

    def cancel(self, principal: str, admission_id: str, *,
               session: str = "s-1") -> AdmissionRow | Refusal | None:
        """Withdraw a queued admission."""
        return door_story.resolve(self, principal, session, admission_id, Move.CANCEL)

    def admissions(self, session: str = "s-1") -> list[AdmissionRow]:
        """The session's admission rows as the store holds them, in seq order."""
        return [r for r in self.world.store.admission_rows() if r.session_id == session]

    # -- session lanes (SES): route a source, run its turn, move the clock, restart --------
    def lane_run(self, coro: Any) -> Any:
        """Run a router coroutine (``hermes_ref.router``) on the current process."""
        return SimDriver(self.world).run(coro)

    def message(self, source: SessionSource, text: str) -> TurnResult | None:
        """Route a message from ``source`` to its live incarnation and run its turn there."""
        routed = self.route_message(source)
        return None if routed is None else self.run_routed(routed, text)

    def route_message(self, source: SessionSource) -> router.Routed | None:
        """Route a message from ``source`` without running its turn yet (None: the process
        died routing it); ``run_routed`` runs the turn, so a story can put a step between."""
        try:
            routed: router.Routed = self.lane_run(router.route(source, self._limits, self._tools))
        except Crashed:
            self._engine = None
            self.check()
            return None
        notice = " +notice" if routed.notice else ""
        self.world.timeline.add("routed", f"{routed.rule} -> {routed.route.session_id}{notice}")
        return routed

    def run_routed(self, routed: router.Routed, text: str) -> TurnResult | None:
        """Run the turn of a message ``route_message`` routed, on the incarnation it named."""
        result = self._lane_turn(router.turn_input(routed, text))
        if result is not None:
            self.lane_run(router.after_turn(routed, result))
            self.check()
        return result

    def _lane_turn(self, inp: TurnInput) -> TurnResult | None:
        world, engine = self.world, self.engine
        world.timeline.add("turn", f"{inp.session_id} {inp.text!r}")
        minted, failures = len(world.minted_turns), world.write_failures
        try:
            result = SimDriver(world).run(engine.run_turn(inp))
        except Crashed:
            self._engine = None
            result = None
        ids = world.minted_turns[minted:]
        world.runs.append(TurnRun(inp.session_id, inp.text, ids[0] if ids else None,
                                  result is None, world.write_failures - failures,
                                  result.retryable if result is not None else None))
        self._last = result
        if result is not None:
            world.timeline.add("result", f"{result.exit_reason.value} "
                               f"final={_brief(result.final_response)}")
        self.check()
        return result

    def reset_lane(self, source: SessionSource) -> Route:
        """The user asks for a new conversation on ``source``'s lane."""
        routed = self.lane_run(router.reset(source, self._limits, self._tools))
        self.check()
        return routed.route  # type: ignore[no-any-return]

    def route_of(self, source: SessionSource) -> Route | None:
        """The lane's current route, as the store has it."""
        return self.world.store.get_route(router.session_key(source, self._limits))

    def advance(self, seconds: float) -> None:
        """Move the virtual clock (idle and daily policies, restart windows)."""
        self.world.clock.advance(seconds)
        self.world.timeline.add("clock", f"+{seconds:g} s")

    def background(self, source: SessionSource, *, live: bool) -> None:
        """The world starts (or ends) a background process for ``source``'s lane; it records
        that in the store's lane log, as a process registry would."""
        key = router.session_key(source, self._limits)
        kind = "background_started" if live else "background_ended"
        self.world.store.write_lane((), (LaneEntry(at=self.world.clock.now(), kind=kind, key=key),))
        self.world.timeline.add("world", f"{kind} {key}")
        self.check()

    def expiry_watch(self) -> router.Watch:
        """One pass of the expiry watcher (finalize, then prune) on the current process."""
        done: router.Watch = self.lane_run(router.watch(self._limits))
        self.check()
        return done

    def lane_restart(self, *, graceful: bool, running: tuple[SessionSource, ...] = (),
                     drained: bool = True) -> router.Startup:
        """Stop this process (gracefully: count the ``running`` lanes and, if ``drained``,
        leave the clean-exit marker; else it just dies) and start the next one, which runs
        the start pass and then the expiry watcher."""
        if graceful:
            keys = tuple(router.session_key(src, self._limits) for src in running)
            self.lane_run(router.shutdown(keys, drained))
        self.world.restart()
        self._engine = None
        startup: router.Startup = self.lane_run(router.start(self._limits))
        self.check()
        self.expiry_watch()
        return startup


def _comparable(obs: DoorObservation) -> bool:
    """Whether equal observations are equal worlds: not when one holds something that may
    change in place (a stream client, a caller's history list), which equality cannot see."""
    return not obs.clients and not any(isinstance(r, CallerHistoryRun) for r in obs.runs or ())


def _brief(text: str | None) -> str:
    if text is None:
        return "None"
    if FULL_TEXT.get():
        return repr(text)
    flat = text.replace("\n", " ")
    return repr(flat if len(flat) <= 40 else flat[:39] + "…")


@dataclass
class ScenarioOutcome:
    name: str
    title: str
    store_kind: StoreKind
    invariants: tuple[str, ...]
    violations: list[str]
    error: str | None
    timeline: str
    transcript: str
    findings: tuple[Violation, ...] = ()  # the violations as values: invariant, checker, text
    raised: bool = False  # the story ended in an exception, not a failed expectation

    @property
    def passed(self) -> bool:
        return not self.violations and self.error is None


def render_transcript(story: Story) -> str:
    lines: list[str] = []
    record = story.world.store.snapshot()
    for session in record.sessions:
        end = f" ended={session.end_reason}" if session.end_reason else ""
        lines.append(f"session {session.id}{end}")
        for row in record.transcript(session.id):
            lines.append("  " + _render_row(row))
    return "\n".join(lines) + "\n"


def _render_row(row: Message) -> str:
    head = f"#{row.row_id} {row.role.value}"
    if row.tool_calls:
        calls = "; ".join(f"{c.id} {c.name}({c.arguments})" for c in row.tool_calls)
        return f"{head} [{calls}] {row.content or ''}".rstrip()
    if row.tool_call_id:
        head += f" ({row.tool_call_id})"
    sidecar = " +api_content" if row.api_content else ""
    return f"{head}{sidecar}: {row.content}"


@contextmanager
def _workdir(base: Path | None) -> Iterator[Path]:
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
        yield base
        return
    with tempfile.TemporaryDirectory(prefix="hermes-ref-") as tmp:
        yield Path(tmp)


def run_scenario(spec: ScenarioSpec, store_kind: StoreKind = "memory", *,
                 workdir: Path | None = None, seed: int = 0, trace: bool = True,
                 verbose: bool = False) -> ScenarioOutcome:
    """Run one story on one store kind and collect its verdict (``verbose``: whole texts)."""
    token = FULL_TEXT.set(verbose)
    try:
        return _run_scenario(spec, store_kind, workdir, seed, trace)
    finally:
        FULL_TEXT.reset(token)


def _run_scenario(spec: ScenarioSpec, store_kind: StoreKind, workdir: Path | None, seed: int,
                  trace: bool) -> ScenarioOutcome:
    with _workdir(workdir) as tmp:
        story = Story(store_kind=store_kind, workdir=tmp, seed=seed, trace=trace)
        error: str | None = None
        raised = False
        try:
            spec.story(story)
            story.check()
            for provider in (story.world.provider, *story.world.providers.values()):
                if isinstance(provider, ScriptedProvider):
                    provider.assert_consumed()
        except ExpectationFailed as failed:
            error = f"expectation failed: {failed}"
            story.check()
        except Exception as exc:  # a scenario must report, not explode
            raised = True
            error = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc(limit=6))
            story.check()  # the record still tells what the failure left behind
        verdict = "PASS" if not story.violations and error is None else "FAIL"
        story.world.timeline.add("verdict", f"{verdict} ({len(story.violations)} violations)")
        outcome = ScenarioOutcome(
            name=spec.name, title=spec.title, store_kind=store_kind, invariants=spec.invariants,
            violations=[str(v) for v in story.violations], findings=tuple(story.violations),
            error=error, raised=raised,
            timeline=story.world.timeline.render(), transcript=render_transcript(story),
        )
        for actor in story.world.scheduler.live():
            actor.coro.close()  # the story is over: actors it left waiting never resume
        story.world.store.close()
        return outcome

