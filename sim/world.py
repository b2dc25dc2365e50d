"""One simulated world: clock, chooser, store, provider, tools, faults and the timeline.

Theory of operation
-------------------
The world is everything outside the engine, and it outlives engine instances: when the
simulated process crashes, the world keeps its committed store, its tool ledger and its
clock, and a fresh ``Engine`` is started against it. Only what the engine held in memory
(and the store's pending writes) is lost.

The timeline is the narrated record of a run: one short line per phase change, effect,
durable write, fault and checker verdict. Scenarios snapshot it, so it contains only
deterministic values (virtual time relative to the start, ids from the world).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hermes_ref.admission import AdmissionRow
from hermes_ref.delivery import Hub, TurnSeqs  # DEL-2
from hermes_ref.models import Event, Message, Opening, ProviderReply, SessionRecord, StreamDelta
from hermes_ref.phases import Phase
from hermes_ref.ports import Provider, Store
from hermes_ref.wire import ProviderRequest, WireBody
from sim.choices import Chooser
from sim.clock import VirtualClock
from sim.faults import FaultPlan, FaultState
from sim.scheduler import Scheduler
from sim.tools import SimTools


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What the provider was asked and answered: the world's own record of one call.

    ``wire_body`` holds the bytes that went out (as the pieces they were joined from, fixed
    at call time); ``request`` is the engine's value behind them, kept for the readings
    that need local fields (purpose, scaffolding flags).
    """

    seq: int                  # the driver's effect counter when the call was made
    session_id: str
    turn_id: str
    request: ProviderRequest
    reply: ProviderReply | None
    error: str | None
    watermark: int            # committed message high-water mark at call time
    at: float                 # virtual time of the call
    retry_after_s: float | None  # the Retry-After a RateLimited error carried, else None
    wire_body: WireBody       # the request body as sent (``ProviderRequest.wire_body``)
    cut: str | None = None    # LOOP-4: "redirect" when a correction cut the reply's stream
    # FIN-4 / LEASE-4: "interrupt" or "lease" when a stop from outside cut the call while the
    # turn waited on it, so its reply never reached the turn (the loop read nothing of it)
    stopped: str | None = None
    # DEL-1 / FIN-2: the deltas a cut stream delivered before it failed (a kept stream's
    # are its reply's ``deltas``)
    delivered: tuple[StreamDelta, ...] = ()
    # readings of this record's own values, kept with it by whoever makes them (the checkers'
    # ``sent_messages``): its fields never change, so neither do they; never compared
    readings: dict[str, Any] = field(default_factory=dict, init=False, compare=False,
                                     repr=False)

    @property
    def body(self) -> bytes:
        """The bytes that went out, exactly what ``HttpProvider`` would have posted."""
        return bytes(self.wire_body)

    @property
    def sent(self) -> Any:
        """The recorded bytes parsed: what the wire checkers judge, never the request object.

        Parsed once per record (checkers run after every step); the value is shared, and
        the model and tools in it with every call of the route (``WireBody.parsed``), so
        readers must not change it. Raises ``ValueError`` when the bytes are not JSON.
        """
        return self.wire_body.parsed()


@dataclass(frozen=True, slots=True)
class TurnRun:
    """One turn the harness asked a process to run, as the world saw it (not the engine).

    The turn id is the one the world minted while the turn ran; ``crashed`` says the
    process died during it; ``write_failures`` counts store writes the world failed;
    ``retryable`` is what the result the caller got said of a retry (LEASE-5).
    ``returned`` says the engine handed its caller a result, and ``answer`` is the final
    response that result held: what the user waits for, as the caller received it (FIN-6).
    """

    session_id: str
    text: str
    turn_id: str | None
    crashed: bool
    write_failures: int = 0
    retryable: bool | None = None  # what the caller's result said (None: no result)
    returned: bool = False
    answer: str | None = None


@dataclass(frozen=True, slots=True)
class RaisedRun(TurnRun):
    """A turn the engine itself raised out of (an error, not a simulated crash). The run
    stopped there, so its ending is excused as a crash's is (``crashed`` is true); but an
    answer the model had already given it is lost, and a store error that escaped it
    should have gone into its result (FIN-6)."""

    raised: str = ""  # the error's type and message
    store_error: bool = False  # a PersistenceError (a fenced write, LeaseLost, among them)


@dataclass(frozen=True, slots=True)
class RewriteRun(TurnRun):
    """Not a turn: a content rewrite the harness asked the store for (a redaction between
    turns), kept with the runs so checkers see it in order. ``text`` is the new content,
    ``row_id`` the row, ``seq`` the world's effect counter when it was asked: calls made
    before it sent the row as it was then (WIRE-2). ``was`` is the row as it was stored
    before the rewrite and ``watermark`` the store's last row id then: a compaction whose
    rows begin at or below it ran before the rewrite and wrote the row as ``was``."""

    row_id: int = 0
    seq: int = 0
    was: Message | None = None
    watermark: int = 0


class CrashableStore(Store, Protocol):
    def crash(self) -> None: ...
    def admission_rows(self) -> tuple[AdmissionRow, ...]: ...  # ``snapshot().admissions``
    def reopen(self) -> None: ...
    def take_pending_events(self) -> list[Event]: ...
    def would_open(self, record: SessionRecord, holder: str, now: float, ttl_s: float,
                   poll_s: float, opening: Opening) -> bool: ...


SIM_PID_NAMESPACE = "sim"
"""The pid namespace every simulated process lives in (holders name it, as real ones do)."""


@dataclass(eq=False)
class SimProcess:
    """One simulated agent process: its pid, whether it lives, its unflushed events."""

    pid: int
    alive: bool = True
    pending_events: list[Event] = field(default_factory=list)
    died_at: float | None = None
    died_seq: int = 0  # the world's effect count when it died (orders same-instant events)


@dataclass(frozen=True, slots=True)
class LeaseStep:
    """One thing a lease holder did, as the world saw it (LEASE-2, LEASE-4, LEASE-6).

    ``what`` is ``granted``, ``busy`` (an ask refused), ``left`` (a waiter gave up its place
    in line), ``refresher_started``, ``refreshed``, ``refresh_failed``, ``interrupted``,
    ``refresher_stopped``, ``released`` or ``release_failed`` (a planned store failure);
    and, for the session's compression lock (CMP-6), ``lock_taken``, ``lock_released`` and
    ``compacted`` (its holder's compaction committed); ``at`` is virtual time, ``seq`` the
    world's effect counter.
    """

    what: str
    session_id: str
    holder: str
    token: int
    at: float
    seq: int


@dataclass(frozen=True, slots=True)
class LaneEffect:
    """SES-7: a lane effect of a process, in the world's effect order, which the durable
    record does not keep across its route revisions and its lane log.

    ``what`` is ``start`` (a start entry written to the lane log), ``read`` (the routes
    loaded, as a start pass loads what it judges) or ``route`` (the revision ``revision``
    of ``key`` written, and taken); ``seq`` is the world's effect counter.
    """

    what: str
    pid: int
    seq: int
    key: str = ""
    revision: int = 0


@dataclass(frozen=True, slots=True)
class FailedWrite:
    """A store write the world failed on purpose: whose turn wrote it (None: no turn was
    running), at which site (``hermes_ref.effects.Site``) and when, in virtual time."""

    turn_id: str | None
    site: str
    at: float


@dataclass(frozen=True, slots=True)
class Intervention:
    """LOOP-4, LOOP-5, FIN-4: something the world did to a running turn, as the world saw it.

    ``what`` is ``interrupt`` (the user stopped the turn; ``text`` is the reason),
    ``redirect`` (the user sent the correction ``text``), ``drained`` (the turn took the
    correction ``text`` in) or ``credentials`` (the turn had the credentials of the route
    ``text`` renewed). ``at`` is virtual time, ``seq`` the world's effect counter.
    """

    what: str
    session_id: str
    turn_id: str | None
    text: str
    at: float
    seq: int


@dataclass(frozen=True, slots=True)
class AckRecord:
    """ADM: one answer of the door as its submitter received it, and the store at that moment.

    ``mark`` is the store's committed admission high-water mark (highest ``seq``) when the
    answer arrived: an acknowledged row must already be at or below it (ADM-1).
    ``answer`` is the ``Ack`` or ``Refusal`` value itself; ``submitted`` what was handed in.
    """

    answer: Any
    mark: int
    submitted: Any = None


@dataclass
class Timeline:
    """Narrated lines of one run; disabled timelines cost one attribute check per effect."""

    clock: VirtualClock
    enabled: bool = True
    lines: list[str] = field(default_factory=list)
    start_s: float = 0.0
    pid: int | None = None  # the process whose actor runs now (set by its driver)
    entries: list[tuple[float, str, str, int | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start_s = self.clock.now()

    def add(self, kind: str, text: str) -> None:
        if self.enabled:
            elapsed = self.clock.now() - self.start_s
            self.lines.append(f"{elapsed:9.3f}  {kind:<8} {text}")
            self.entries.append((elapsed, kind, text, self.pid))  # the same line, as data

    def phase(self, old: Phase, new: Phase) -> None:
        if self.enabled:
            self.add("phase", f"{old.value} -> {new.value}")

    def render(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")


def seeded_id(rng: random.Random, prefix: str, taken: set[str]) -> str:
    """``prefix`` and six hex digits drawn from ``rng``, drawn again until not in ``taken``
    (which it joins): unique by construction, short enough to read."""
    while True:
        minted = f"{prefix}{rng.getrandbits(24):06x}"
        if minted not in taken:
            taken.add(minted)
            return minted


@dataclass
class World:
    store: CrashableStore
    provider: Provider
    tools: SimTools
    seed: int = 0
    faults: FaultPlan = field(default_factory=FaultPlan)
    trace: bool = True
    id_base: int = 0
    # "counter" mints ``turn-1``, ``adm-2``, ... (scripted scenarios); "seeded" draws six hex
    # digits per id from the chooser's ``ids:<prefix>`` sub-stream (explored worlds)
    id_style: str = "counter"
    clock: VirtualClock = field(default_factory=VirtualClock)
    tool_batch_deadline_s: float = 420.0  # a hung tool costs this much virtual time (TOOL-5)
    stream: list[Event] = field(default_factory=list)
    subscribers: list[Callable[[Event], None]] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    summary_calls: list[CallRecord] = field(default_factory=list)  # CMP: compaction's
    manual_compactions: list[tuple[str, int]] = field(default_factory=list)  # CMP-4: (s, seq)
    batches: list[tuple[str, ...]] = field(default_factory=list)  # call ids run together
    tool_workers_max: int = 8
    crash_seqs: list[int] = field(default_factory=list)
    runs: list[TurnRun] = field(default_factory=list)  # every turn the harness ran, in order
    minted_turns: list[str] = field(default_factory=list)  # turn ids, in minting order
    write_failures: int = 0  # store writes the world failed on purpose, so far
    write_failures_by_turn: dict[str, int] = field(default_factory=dict)  # turn id -> failed
    failed_writes: list[FailedWrite] = field(default_factory=list)  # each one, in order
    on_crash: Callable[[str], None] | None = None  # called first at a crash point
    provider_delays_s: dict[int, float] = field(default_factory=dict)  # call n -> reply delay
    lease_log: list[LeaseStep] = field(default_factory=list)  # what each lease holder did
    stalls: list[tuple[int, float, float]] = field(default_factory=list)  # (pid, from, until)
    # CMP-6: session -> seconds: the next process granted that session's compression lock
    # freezes right after, holding it (a holder partitioned mid-commit); once per session
    lock_stalls: dict[str, float] = field(default_factory=dict)
    clock_jumps: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds)
    death_points: list[tuple[int, str]] = field(default_factory=list)  # (pid, where it died)
    acks: list[AckRecord] = field(default_factory=list)  # ADM: every answer a submitter got
    # DEL / FIN-2: planned stream cuts (world call n -> deltas delivered before the cut),
    # the live feed of committed events, each turn's event numbers, the clients' records
    stream_cuts: dict[int, int] = field(default_factory=dict)
    hub: Hub = field(default_factory=Hub)
    turn_seqs: TurnSeqs = field(default_factory=TurnSeqs)
    clients: list[Any] = field(default_factory=list)  # sim.stream_client.SimClient
    # LOOP-6: a fake of its own per model (a fallback route); any other model gets ``provider``
    providers: dict[str, Provider] = field(default_factory=dict)
    # LOOP-4: turn -> the corrections sent to it and not yet taken in, each with the session
    # the user addressed; they live in the turn's process and go when the turn ends
    redirects: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    interventions: list[Intervention] = field(default_factory=list)  # LOOP-4/5, FIN-4
    # LOOP-4: corrections the user holds for a moment of a turn (a tool round, the grace
    # call, a call preparing a tool call), each taken by the first such moment of its
    # session (``sim.interventions.Moment``)
    moments: list[Any] = field(default_factory=list)
    lane_effects: list[LaneEffect] = field(default_factory=list)  # SES-7: starts, reads, routes
    # CMP-5: called with (session, child) at every rotation a compaction writes, in effect
    # order (a lane message held for its session's rotation, ``sim.explore.lanes``)
    rotation_watchers: list[Callable[[str, str], None]] = field(default_factory=list)
    rotation_arrivals: int = 0  # lane messages that arrived as their lane's session rotated
    # called with the session of each summary request that fails (``sim/explore/lanes.py``)
    summary_failure_watchers: list[Callable[[str], None]] = field(default_factory=list)
    # called with the session and the pid of each summary request (``sim/explore/lanes.py``)
    summary_watchers: list[Callable[[str, int], None]] = field(default_factory=list)
    failure_arrivals: int = 0  # lane messages that arrived after their lane's summary failed
    # lane turns that waited for a session's lease as another turn rotated it, on a process
    # with no cache of it and a memory of its lineage (``sim/explore/waiter.py``)
    rotation_waits: int = 0
    streaming: dict[int, ProviderReply] = field(default_factory=dict)  # actor seq -> reply in flight

    def __post_init__(self) -> None:
        self.chooser = Chooser(self.seed)
        self.fault_state = FaultState(self.faults)
        self.timeline = Timeline(self.clock, enabled=self.trace)
        self._ids = self.id_base
        self._minted: set[str] = set()  # seeded ids so far: a collision is drawn again
        self.crashes = 0
        self.effects_performed = 0  # every effect of every process, in world order
        self.processes: dict[int, SimProcess] = {1: SimProcess(1)}
        self.pid = 1  # the default process: the one a story's plain ``turn`` runs on
        self.scheduler = Scheduler(self._pick_actor, self.clock.now, self._advance_to)

    def _pick_actor(self, count: int) -> int:
        return self.chooser.stream("schedule").randrange(count)

    def _advance_to(self, deadline: float) -> None:
        self.clock.advance(deadline - self.clock.now())

    def mint_id(self, prefix: str) -> str:
        """A fresh id, unique in this world: a counter, or drawn from the seed (``id_style``)."""
        if self.id_style == "seeded":
            minted = seeded_id(self.chooser.stream(f"ids:{prefix}"), f"{prefix}-", self._minted)
        else:
            self._ids += 1
            minted = f"{prefix}-{self._ids}"
        if prefix == "turn":
            self.minted_turns.append(minted)
        return minted

    def mark_pending_call(self, turn_id: str | None, *, cut: str | None = None,
                          stopped: str | None = None) -> None:
        """Something from outside cut the model call ``turn_id`` waits on, the turn's last:
        mark its record (``cut`` for a correction, ``stopped`` for a stop), so readers know
        its reply never reached the turn."""
        for index in range(len(self.calls) - 1, -1, -1):
            if self.calls[index].turn_id == turn_id:
                record = self.calls[index]
                self.calls[index] = replace(record, cut=cut or record.cut,
                                            stopped=stopped or record.stopped)
                return

    def crash(self, point: str, seq: int, pid: int | None = None) -> None:
        """A process dies: its pending writes are gone; the committed record stays."""
        process = self.processes[self.pid if pid is None else pid]
        others_live = any(p.alive for p in self.processes.values() if p is not process)
        process.alive = False
        process.died_at, process.died_seq = self.clock.now(), seq
        self.death_points.append((process.pid, point))
        process.pending_events.clear()
        self.crashes += 1
        self.crash_seqs.append(seq)
        self.store.crash()
        self.store.reopen()  # the file survives; what reads it next is a new connection
        self.timeline.add("CRASH", f"pid={process.pid} at {point}" if others_live else point)

    def stall(self, pid: int, seconds: float) -> tuple[float, float]:
        """Process ``pid`` freezes from now for ``seconds``: the scheduler runs none of its
        actors (its lease refresher included), and the stretch joins ``stalls``, which the
        lease checkers read to excuse a lapse in it. Returns the stretch."""
        at = self.clock.now()
        self.scheduler.freeze(pid, at + seconds)
        self.stalls.append((pid, at, at + seconds))
        return at, at + seconds

    def deaths(self) -> tuple[tuple[int, float], ...]:
        """Every simulated process that died (crashed or was replaced), with the time."""
        return tuple((p.pid, p.died_at) for p in self.processes.values() if p.died_at is not None)

    def death_seqs(self) -> tuple[tuple[int, int], ...]:
        """(pid, the world's effect count at its death) of every process that died."""
        return tuple((p.pid, p.died_seq) for p in self.processes.values() if p.died_at is not None)

    def restart(self) -> str:
        """A new default process: returns its holder identity (the old one is dead)."""
        old = self.processes[self.pid]
        if old.alive:
            old.alive, old.died_at, old.died_seq = False, self.clock.now(), self.effects_performed
        self.scheduler.drop_process(old.pid, "restart")  # nothing of the old process runs on
        self.pid = self.start_process().pid
        self.timeline.add("restart", f"process pid={self.pid}")
        return self.holder

    def start_process(self) -> SimProcess:
        """One more live process in the world (its pid is the next free one)."""
        pid = max(self.processes) + 1
        process = SimProcess(pid)
        self.processes[pid] = process
        return process

    @property
    def holder(self) -> str:
        return self.holder_of(self.pid)

    @staticmethod
    def holder_of(pid: int) -> str:
        """A simulated process's holder prefix: its pid and the world's pid namespace."""
        return f"pid={pid}:pidns={SIM_PID_NAMESPACE}"

    def holder_alive(self, holder: str) -> bool:
        """LEASE-3 in the simulator: a holder is alive while its process is."""
        head = holder.split(":", 1)[0]
        if not head.startswith("pid="):
            return True
        try:
            process = self.processes.get(int(head[4:]))
        except ValueError:
            return True
        return process is not None and process.alive
