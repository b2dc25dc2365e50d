"""Session lanes in an explored world: platform messages routed to incarnations (SES).

A plan's ``lanes`` part is the traffic of a chat gateway: messages from a group whose
members each have a lane (or share one), a thread, and direct messages, each resolved
through the lane router (``hermes_ref.router``) to its live incarnation and run there as a
turn on one of the world's processes, under the same lease and turn machinery as the
door's turns. The day is long: bursts of messages hours apart cross the idle and daily
reset boundaries (midnight too), users ask for a new conversation, background processes
are registered on a lane and end, the agent's row of a lane is closed elsewhere, and the
expiry watcher runs now and then. Restarts come from a sub-stream of their own: a process
dies and the next one starts without the clean-exit marker, or stops gracefully while a
lane's job still runs (the job reads ``build.log``, which is slow), repeatedly, up to the
stuck threshold.

``draw_lanes`` makes the part from a seed; ``LaneWorld`` carries it out (``run.stage`` and a
rendered scenario make the same calls), each event at its virtual time on the process the
slot holds then (a restart puts a new process in its slot).
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

from hermes_ref import router
from hermes_ref.effects import Sleep
from hermes_ref.lane_restart import LaneEntry
from hermes_ref.limits import Limits
from hermes_ref.models import Frozen
from hermes_ref.outcomes import TurnResult
from hermes_ref.rotation import COMPRESSION
from hermes_ref.session import SessionSource
from sim.processes import ProcessHandle, TurnHandle, start
from sim.scheduler import Actor

if TYPE_CHECKING:
    from sim.harness import Story

JOB_FILE = "build.log"  # a lane's long job reads it; reading it takes ``LanePlan.job_s``
JOB_TEXT = "Read build.log."
SETUP_S = 0.05  # from a message's routing to its turn, when a /new arrives meanwhile
STOP_GRACE_S = 1.0  # a graceful stop's shutdown pass has this long before the process exits
LANE_CHANCE = 0.4  # the share of worlds with a chat gateway
HOLD_S = 12 * 3600.0  # the longest a held message waits for its lane's rotation or failure


class LaneMessage(Frozen):
    """A message from ``source``, routed to its lane's incarnation and run there as a turn;
    with ``reset_too``, the user's request for a new conversation arrives in the same
    instant, between the message's routing and its turn, and runs beside the turn; with
    ``at_rotation``, it is held from ``at_s`` until the session its lane was last routed
    to rotates, with ``after_rotation_s``, until that rotation and then that many seconds
    more, with ``after_failure_s``, until a summary of that session fails and then that
    many seconds more, and with ``at_pass_elsewhere``, until a process other than its own
    asks for a summary of that session (``LaneWorld.message``)."""

    op: Literal["lane_message"] = "lane_message"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)
    source: SessionSource
    text: str
    reset_too: bool = False
    at_rotation: bool = False
    after_failure_s: float | None = Field(default=None, gt=0)
    after_rotation_s: float | None = Field(default=None, gt=0)
    at_pass_elsewhere: bool = False

    @model_validator(mode="after")
    def _one_hold(self) -> LaneMessage:
        holds = (self.at_rotation, self.after_failure_s is not None,
                 self.after_rotation_s is not None, self.at_pass_elsewhere)
        if sum(holds) > 1:
            raise ValueError("a lane message is held for one moment: a rotation (and some "
                             "seconds more), a failed summary, or a pass on another process")
        return self


class LaneReset(Frozen):
    """The user asks for a new conversation on ``source``'s lane."""

    op: Literal["lane_reset"] = "lane_reset"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)
    source: SessionSource


class Background(Frozen):
    """A background process of ``source``'s lane starts (``live``) or ends."""

    op: Literal["background"] = "background"
    at_s: float = Field(ge=0)
    source: SessionSource
    live: bool


class Evict(Frozen):
    """The agent of ``source``'s lane is evicted: its session row is closed (agent_close)."""

    op: Literal["evict"] = "evict"
    at_s: float = Field(ge=0)
    source: SessionSource


class WatchPass(Frozen):
    """One pass of the expiry watcher (finalize, then prune) on ``process``."""

    op: Literal["watch"] = "watch"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)


class LaneRestart(Frozen):
    """``process`` stops (gracefully: its shutdown pass counts the lanes still running) or
    dies, and a new process takes its slot and runs the start pass and the watcher."""

    op: Literal["lane_restart"] = "lane_restart"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)
    graceful: bool


LaneEvent = Annotated[LaneMessage | LaneReset | Background | Evict | WatchPass | LaneRestart,
                      Field(discriminator="op")]


class LanePlan(Frozen):
    """The lane settings of a world and its lane events, in time order."""

    reset_mode: Literal["idle", "daily", "both", "none"] = "none"
    idle_minutes: int = Field(default=1440, ge=1)
    at_hour: int = Field(default=4, ge=0, le=23)
    group_per_user: bool = True
    thread_per_user: bool = False
    prune_after_s: float = 0.0
    stuck_threshold: int = Field(default=3, ge=1)
    job_s: float = Field(default=240.0, ge=0)
    events: tuple[LaneEvent, ...] = ()

    @property
    def messages(self) -> int:
        return sum(1 for e in self.events if e.op == "lane_message")

    @property
    def restarts(self) -> int:
        return sum(1 for e in self.events if e.op == "lane_restart")

    @property
    def held(self) -> int:
        """Messages held for their lane's rotation (``LaneMessage.at_rotation``)."""
        return sum(1 for e in self.events if isinstance(e, LaneMessage) and e.at_rotation)

    @property
    def returning(self) -> int:
        """Messages held for a failed summary (``LaneMessage.after_failure_s``)."""
        return sum(1 for e in self.events
                   if isinstance(e, LaneMessage) and e.after_failure_s is not None)

    @property
    def waiting_out(self) -> int:
        """Messages held for a rotation and some seconds more or for a pass on another
        process (``LaneMessage.after_rotation_s``, ``at_pass_elsewhere``)."""
        return sum(1 for e in self.events if isinstance(e, LaneMessage)
                   and (e.after_rotation_s is not None or e.at_pass_elsewhere))

    @property
    def size(self) -> tuple[int, int, int]:
        """Turns, faults and steps, as ``WorldPlan.size`` counts them."""
        return (self.messages, self.restarts + self.held + self.returning + self.waiting_out,
                len(self.events))

    def on_processes(self, count: int) -> LanePlan:
        """The same lanes on the first ``count`` processes (the rest move to the first)."""
        return self.model_copy(update={"events": tuple(
            e.model_copy(update={"process": 0}) if getattr(e, "process", 0) >= count else e
            for e in self.events)})

    def settings(self) -> dict[str, object]:
        """The limits these lanes run under (``Story.limits`` keywords)."""
        return {"session_reset_mode": self.reset_mode, "session_idle_minutes": self.idle_minutes,
                "session_reset_at_hour": self.at_hour,
                "group_sessions_per_user": self.group_per_user,
                "thread_sessions_per_user": self.thread_per_user,
                "session_prune_after_s": self.prune_after_s,
                "stuck_restart_threshold": self.stuck_threshold}


# ---- drawing the lanes of a world -----------------------------------------------------------


def _chats(rng: random.Random) -> list[list[SessionSource]]:
    """The gateway's chats, each as its speakers: a group, a thread, one or two DMs."""
    group = [SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                           participant=name)
             for name in ("alice", "bob", "carol")[:rng.randint(2, 3)]]
    thread = [SessionSource(platform="telegram", chat_type="group", chat_id="-1002285219667",
                            thread_id="17585", participant=name) for name in ("dave", "erin")]
    chats = [group, thread, [SessionSource(platform="telegram", chat_type="dm", chat_id="99",
                                           participant="42")]]
    if rng.random() < 0.5:
        chats.append([SessionSource(platform="slack", chat_type="dm", participant="frank")])
    return chats


def _text(rng: random.Random, n: int) -> str:
    pick = rng.random()
    if pick < 0.3:
        return f"Read notes-{rng.randint(1, 2)}.txt."
    if pick < 0.5:
        return f"Write note {n} to lane-out-{n}.txt."
    return f"Say hello {n}."


def _gap_s(rng: random.Random, idle_minutes: int) -> float:
    """The quiet between two bursts: minutes, about the idle limit, or hours."""
    shape = rng.random()
    if shape < 0.3:
        return rng.uniform(60.0, 900.0)
    if shape < 0.6:
        return rng.uniform(0.5, 2.0) * idle_minutes * 60
    return rng.uniform(2 * 3600.0, 11 * 3600.0)


def draw_lanes(seed: int, processes: int, restarts: bool) -> LanePlan | None:
    """The lanes of the world ``seed`` decides ("lanes"; restarts from "lane_restarts"), in
    about two worlds in five."""
    rng = random.Random(f"{seed}:lanes")
    if rng.random() >= LANE_CHANCE:
        return None
    plan = LanePlan(reset_mode=rng.choice(("idle", "daily", "both", "none")),
                    idle_minutes=rng.choice((30, 60, 240)), at_hour=rng.choice((3, 4, 6, 9)),
                    group_per_user=rng.random() < 0.7, thread_per_user=rng.random() < 0.3,
                    prune_after_s=rng.choice((0.0, 0.0, 3 * 3600.0, 12 * 3600.0)),
                    stuck_threshold=rng.choice((2, 3, 3)), job_s=rng.choice((240.0, 400.0)))
    chats, events = _chats(rng), list[LaneEvent]()
    at, n, bursts = rng.uniform(600.0, 3600.0), 0, []
    for _ in range(rng.randint(3, 6)):
        chat, first = rng.choice(chats), at
        for _ in range(rng.randint(1, 3)):
            n += 1
            source = rng.choice(chat)
            events.append(LaneMessage(at_s=round(at, 1), process=rng.randrange(processes),
                                      source=source, text=_text(rng, n)))
            if rng.random() < 0.12:  # the user starts over: a new conversation
                events.append(LaneReset(at_s=round(at + rng.uniform(1.0, 20.0), 1),
                                        process=rng.randrange(processes), source=source))
            at += rng.uniform(25.0, 90.0)
        bursts.append((first, at, chat))
        at += _gap_s(rng, plan.idle_minutes)
    events += _lane_world(rng, bursts, processes)
    if restarts:
        events += _restarts(random.Random(f"{seed}:lane_restarts"), bursts, events, processes,
                            plan, n)
    _races(random.Random(f"{seed}:lane_races"), events)
    return plan.model_copy(update={"events": tuple(sorted(events, key=lambda e: e.at_s))})


def _races(rng: random.Random, events: list[LaneEvent]) -> None:
    """In a third of the worlds, the user of one or two lanes asks for a new conversation
    in the very instant their first message is routed (``reset_too``): the reset runs
    while the gateway sets the message's turn up (``SETUP_S``), between the routing, which
    begins the lane's first incarnation, and the turn, which runs on the incarnation it
    was routed to (SES-2)."""
    if rng.random() >= 1 / 3:
        return
    firsts: dict[SessionSource, int] = {}
    for index, event in enumerate(events):
        if isinstance(event, LaneMessage):
            firsts.setdefault(event.source, index)
    for index in rng.sample(sorted(firsts.values()), min(len(firsts), rng.randint(1, 2))):
        events[index] = events[index].model_copy(update={"reset_too": True})


def _lane_world(rng: random.Random, bursts: list[tuple[float, float, list[SessionSource]]],
                processes: int) -> list[LaneEvent]:
    """Background processes, an eviction and watcher passes between the bursts."""
    events: list[LaneEvent] = []
    if rng.random() < 0.5:
        start_at, _, chat = bursts[rng.randrange(len(bursts))]
        source = rng.choice(chat)
        events.append(Background(at_s=round(start_at + 10.0, 1), source=source, live=True))
        if rng.random() < 0.5:
            events.append(Background(at_s=round(start_at + rng.uniform(600.0, 8 * 3600.0), 1),
                                     source=source, live=False))
    if rng.random() < 0.2:
        _, end, chat = bursts[rng.randrange(len(bursts))]
        events.append(Evict(at_s=round(end + rng.uniform(5.0, 600.0), 1), source=rng.choice(chat)))
    for _ in range(rng.randint(1, 3)):
        _, end, _ = bursts[rng.randrange(len(bursts))]
        events.append(WatchPass(at_s=round(end + rng.uniform(60.0, 6 * 3600.0), 1),
                                process=rng.randrange(processes)))
    return events


def _restarts(rng: random.Random, bursts: list[tuple[float, float, list[SessionSource]]],
              events_so_far: list[LaneEvent], processes: int, plan: LanePlan,
              n: int) -> list[LaneEvent]:
    """Process restarts: some without the clean-exit marker after a burst, some graceful;
    a crash moments after a message, its user back minutes or hours later; and in some
    worlds a lane's job still running at each of several graceful stops in a row."""
    events: list[LaneEvent] = []
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        _, end, _ = bursts[rng.randrange(len(bursts))]
        events.append(LaneRestart(at_s=round(end + rng.choice((rng.uniform(1.0, 100.0),
                                                               rng.uniform(100.0, 7200.0))), 1),
                                  process=rng.randrange(processes), graceful=rng.random() < 0.3))
    talk = [e for e in events_so_far if isinstance(e, LaneMessage)]
    if talk and rng.random() < 0.5:  # a crash mid-conversation; the user comes back later
        said = rng.choice(talk)
        at = said.at_s + rng.uniform(2.0, 60.0)
        events.append(LaneRestart(at_s=round(at, 1), process=said.process, graceful=False))
        n += 1
        events.append(LaneMessage(at_s=round(at + _gap_s(rng, plan.idle_minutes), 1),
                                  process=rng.randrange(processes), source=said.source,
                                  text=f"Say hello {n}."))
    if rng.random() < 0.4:  # a job that hangs its lane: every stop finds it running
        _, end, chat = bursts[rng.randrange(len(bursts))]
        source, slot, at = rng.choice(chat), rng.randrange(processes), end + rng.uniform(60, 900)
        for _ in range(rng.randint(plan.stuck_threshold, plan.stuck_threshold + 1)):
            events.append(LaneMessage(at_s=round(at, 1), process=slot, source=source,
                                      text=JOB_TEXT))
            events.append(LaneRestart(at_s=round(at + rng.uniform(5.0, 30.0), 1), process=slot,
                                      graceful=True))
            at += rng.uniform(120.0, 900.0)
        n += 1
        events.append(LaneMessage(at_s=round(at, 1), process=slot, source=source,
                                  text=f"Say hello {n}."))
    return events


# ---- carrying the lanes out -----------------------------------------------------------------


@dataclass(frozen=True)
class _Hold:
    """What a held lane message waits for (``LaneWorld.message``): its lane's session to
    rotate, a summary of it to fail, or a process other than its own to ask for one (a
    ``pass``), and how many seconds after that it arrives."""

    on: Literal["rotation", "failure", "pass"]
    after_s: float = 0.0

    @classmethod
    def of(cls, at_rotation: bool, after_failure_s: float | None,
           after_rotation_s: float | None, at_pass_elsewhere: bool) -> _Hold | None:
        """The hold ``LaneMessage``'s fields ask for, or None for a message not held."""
        if after_failure_s is not None:
            return cls("failure", after_failure_s)
        if after_rotation_s is not None or at_rotation:
            return cls("rotation", after_rotation_s or 0.0)
        return cls("pass") if at_pass_elsewhere else None

    @property
    def awaited(self) -> str:
        """What never came, when the message arrives after ``HOLD_S``."""
        return {"rotation": "a rotation", "failure": "a failed summary",
                "pass": "a pass elsewhere"}[self.on]

    def until(self) -> str:
        """The moment it is held for, in words."""
        event = {"rotation": "its lane's session rotates",
                 "failure": "a summary of its lane's session fails",
                 "pass": "another process asks for a summary of its lane's session"}[self.on]
        return f"{self.after_s:g} s after {event}" if self.after_s else event

    def why(self, session: str) -> str:
        """Why it arrives now: the moment came, for ``session``."""
        if self.on == "failure":
            return f"{self.after_s:g} s after a summary of {session} failed"
        if self.on == "pass":
            return f"as another process asks for a summary of {session}"
        return f"{self.after_s:g} s after {session} rotated" if self.after_s \
            else f"as {session} rotates"


class LaneWorld:
    """The lane events of a story, each handed out at its virtual time to the process its
    slot holds then; the story's ``run_all`` waits for every one of them."""

    def __init__(self, story: Story, handles: list[ProcessHandle], *, job_s: float) -> None:
        self.story, self.slots = story, list(handles)
        self.waiting = 0  # events not yet handed out
        self.actors: list[Actor] = []
        self.routed: dict[int, str] = {}  # id of a message's actor -> its lane's key
        # id of a message's actor -> the session its turn asks for, and its process
        self.asked: dict[int, tuple[str, ProcessHandle]] = {}
        # whether a rotation looks for the turns waiting past it (``_waits_past``): only in a
        # world with a message held for a rotation and some seconds more or for a pass
        # elsewhere (``sim/explore/waiter.py``), so that the other worlds narrate what they
        # always did
        self.watch_waits = False
        # a source -> the session its last message was routed to, moved along each rotation
        self.sessions: dict[SessionSource, str] = {}
        # key -> (source, slot, what it waits for, arrive) per held message, in hold order
        self.held: dict[int, tuple[SessionSource, int, _Hold, Callable[[str | None], None]]] = {}
        self._holds = itertools.count()
        self.coming: set[int] = set()  # held messages on their way, some seconds after
        story.world.rotation_watchers.append(self._rotated)
        story.world.summary_failure_watchers.append(self._failed)
        story.world.summary_watchers.append(self._asked)
        self.stopping: set[int] = set()  # pids whose graceful stop is under way
        story._processes.waits.append(self.busy)
        story.files({JOB_FILE: "build started\n"})
        story.world.tools.slow("read_file", job_s, path=JOB_FILE)

    def busy(self) -> bool:
        return self.waiting > 0 or any(not a.done for a in self.actors)

    def _at(self, after_s: float, act: Callable[[], None]) -> None:
        world = self.story.world
        self.waiting += 1

        def fire() -> None:
            self.waiting -= 1
            act()
        world.scheduler.at(world.clock.now() + after_s, fire)

    def _live(self, slot: int, what: str) -> ProcessHandle | None:
        handle = self.slots[slot]
        if handle.process.alive:
            return handle
        self.story.world.timeline.add(what, f"pid={handle.pid} is dead: nothing handed to it")
        return None

    def message(self, slot: int, source: SessionSource, text: str, *, after_s: float,
                reset_too: bool = False, at_rotation: bool = False,
                after_failure_s: float | None = None, after_rotation_s: float | None = None,
                at_pass_elsewhere: bool = False) -> None:
        """``after_s`` from now a message from ``source`` arrives at the slot's process; with
        ``reset_too``, the user's request for a new conversation arrives in the same instant,
        once the message is routed and before its turn begins, and runs beside the turn.

        With ``at_rotation`` the message is held from then until the session ``source``'s
        lane is on rotates: the one its last message was routed to, or a child that one
        rotated to since. It arrives in the instant a compaction writes that rotation,
        while the turn that compacted goes on (CMP-5), or after ``HOLD_S`` without one, or
        at once when no message of ``source`` was routed yet. With ``after_rotation_s`` it
        arrives that many seconds after that rotation instead.

        With ``after_failure_s`` it is held in the same way until a summary request of that
        session fails, and arrives that many seconds after the failure: the user comes back
        while the cooldown the failure started runs, or just after (CMP-4). With
        ``at_pass_elsewhere`` it is held until a process other than the slot's asks for a
        summary of that session, and arrives then, while that compaction pass waits for
        its summary under the session's lease.

        The last two holds make every rotation look for the lane turns waiting past it
        (``_waits_past``)."""
        if after_rotation_s is not None or at_pass_elsewhere:
            self.watch_waits = True
        hold = _Hold.of(at_rotation, after_failure_s, after_rotation_s, at_pass_elsewhere)
        if hold is not None:
            self._at(after_s, lambda: self._hold(slot, source, text, reset_too, hold))
        else:
            self._at(after_s, lambda: self._message(slot, source, text, reset_too))

    def _hold(self, slot: int, source: SessionSource, text: str, reset_too: bool,
              hold: _Hold) -> None:
        world = self.story.world
        if source not in self.sessions:
            self._message(slot, source, text, reset_too)
            return
        world.timeline.add("lane", f"{source.platform} {source.participant or source.chat_id} "
                           f"{text!r} is held until {hold.until()}")
        self.waiting += 1
        key = next(self._holds)

        def arrive(session: str | None) -> None:
            """``session`` names the session whose rotation, failed summary or pass it
            waited for; None, when ``HOLD_S`` passed without one."""
            if self.held.get(key) is None or (session is None and key in self.coming):
                return  # it arrived already, or is on its way
            del self.held[key]
            self.waiting -= 1
            why = hold.why(session) if session is not None \
                else f"after {HOLD_S:g} s without {hold.awaited}"
            world.timeline.add("lane", f"the held message {text!r} arrives {why}")
            world.rotation_arrivals += session is not None and hold.on == "rotation" \
                and not hold.after_s
            world.failure_arrivals += session is not None and hold.on == "failure"
            self._message(slot, source, text, reset_too)
        self.held[key] = (source, slot, hold, arrive)
        world.scheduler.at(world.clock.now() + HOLD_S, functools.partial(arrive, None))

    def _release(self, on: str, session: str, pid: int | None = None) -> None:
        """The held messages waiting ``on`` this event of ``session`` arrive, each its
        seconds later; one with seconds to wait is on its way, and a later event finds it
        so (the first counts). A pass releases only the messages of other processes."""
        world = self.story.world
        for key, (source, slot, hold, arrive) in list(self.held.items()):
            if hold.on != on or key in self.coming or self.sessions.get(source) != session \
                    or (pid is not None and self.slots[slot].pid == pid):
                continue
            if hold.after_s:
                self.coming.add(key)
            world.scheduler.at(world.clock.now() + hold.after_s,
                               functools.partial(arrive, session))

    def _rotated(self, session: str, child: str) -> None:
        """A compaction rotated ``session`` to ``child``: lanes routed there move along, and
        the messages held for that rotation arrive, in the same instant, each once the
        compacting process's effect is done (handed to the scheduler), or their seconds
        later."""
        if self.watch_waits:
            self._waits_past(session)
        self._release("rotation", session)
        for source, routed in list(self.sessions.items()):
            if routed == session:
                self.sessions[source] = child

    def _failed(self, session: str) -> None:
        """A summary request of ``session`` failed: the messages held for that arrive their
        seconds later."""
        self._release("failure", session)

    def _asked(self, session: str, pid: int) -> None:
        """``pid`` asked for a summary of ``session``: the messages of other processes held
        for a pass there arrive (``at_pass_elsewhere``)."""
        self._release("pass", session, pid)

    def _waits_past(self, session: str) -> None:
        """Count the lane turns that asked for ``session`` and still wait for its lease as it
        rotates, on a process that holds no cache of it yet remembers its lineage: once the
        lease is theirs, at the child, their process looks the lineage's compression memory
        up from the child through ``session`` (``hermes_ref.prologue._lineage_memory``),
        which has ended by compression only now, after they asked (CMP-4 across CMP-5)."""
        world = self.story.world
        for actor in self.actors:
            asked = self.asked.get(id(actor))
            if actor.done or asked is None or asked[0] != session:
                continue
            engine = asked[1].engine
            if session in engine.caches or not self._remembered(engine, session):
                continue
            world.rotation_waits += 1
            world.timeline.add("lane", f"pid={asked[1].pid} waits for {session} as it rotates, "
                               "with no cache of it and a memory of its lineage")

    def _remembered(self, engine: Any, session: str) -> bool:
        """Whether ``engine`` keeps compression memory for ``session`` or for a session above
        it that ended by compression (the lineage its walk goes up)."""
        store, current, seen = self.story.world.store, session, set[str]()
        while current not in seen:
            seen.add(current)
            if current in engine.caches or current in engine.carried:
                return True
            row = store.get_session(current)
            parent = store.get_session(row.parent_session_id) \
                if row is not None and row.parent_session_id is not None else None
            if parent is None or parent.end_reason != COMPRESSION:
                return False
            current = parent.id
        return False

    def _message(self, slot: int, source: SessionSource, text: str, reset_too: bool) -> None:
        handle = self._live(slot, "lane")
        if handle is None:
            return
        story, box = self.story, list[Actor]()

        async def run() -> TurnResult | None:
            routed = await router.route(source, story._limits, story._tools)
            notice = " +notice" if routed.notice else ""
            story.world.timeline.add("routed", f"{routed.rule} -> {routed.route.session_id}{notice}")
            self.routed[id(box[0])] = routed.route.key
            self.asked[id(box[0])] = (routed.route.session_id, handle)
            self.sessions[source] = routed.route.session_id
            if reset_too:  # the user's /new arrives while the gateway sets the turn up
                self._spawn(slot, "reset", self._reset_of(), source)
                await Sleep(SETUP_S)
            story._processes.pending.append(TurnHandle(routed.route.session_id, text, box[0]))
            result = await handle.engine.run_turn(router.turn_input(routed, text))
            await router.after_turn(routed, result)
            return result
        story.world.timeline.add("lane", f"pid={handle.pid} {source.platform} "
                                 f"{source.participant or source.chat_id} {text!r}")
        box.append(handle.driver.spawn(run(), name="lane"))
        self.actors.append(box[0])

    def _reset_of(self) -> Callable[..., Any]:
        tools = self.story._tools  # named in the prompt of the incarnation the reset begins

        def reset(source: SessionSource, limits: Limits) -> Any:
            return router.reset(source, limits, tools)
        return reset

    def reset(self, slot: int, source: SessionSource, *, after_s: float) -> None:
        """``after_s`` from now the user of ``source`` asks for a new conversation."""
        reset = self._reset_of()
        self._at(after_s, lambda: self._spawn(slot, "reset", reset, source))

    def watch(self, slot: int, *, after_s: float) -> None:
        """``after_s`` from now the slot's process runs one pass of the expiry watcher."""
        self._at(after_s, lambda: self._spawn(slot, "watch", router.watch))

    def _spawn(self, slot: int, what: str, make: Callable[..., Any], *args: object) -> None:
        handle = self._live(slot, what)
        if handle is None:
            return
        self.story.world.timeline.add("lane", f"pid={handle.pid} {what}")
        coro = make(*args, self.story._limits)
        self.actors.append(handle.driver.spawn(coro, name=what))

    def background(self, source: SessionSource, *, live: bool, after_s: float) -> None:
        """``after_s`` from now a background process of the lane starts or ends."""
        def registry() -> None:
            world = self.story.world
            key = router.session_key(source, self.story._limits)
            kind = "background_started" if live else "background_ended"
            world.store.write_lane((), (LaneEntry(at=world.clock.now(), kind=kind, key=key),))
            world.timeline.add("world", f"{kind} {key}")
        self._at(after_s, registry)

    def evict(self, source: SessionSource, *, after_s: float) -> None:
        """``after_s`` from now the lane's agent is evicted: its row is closed elsewhere."""
        def close() -> None:
            world = self.story.world
            route = world.store.get_route(router.session_key(source, self.story._limits))
            record = world.store.get_session(route.session_id) if route is not None else None
            if route is None or record is None or record.ended_at is not None:
                return
            world.store.end_session(route.session_id, "agent_close", world.clock.now())
            world.timeline.add("world", f"agent of {route.key} evicted: {route.session_id} closed")
        self._at(after_s, close)

    def restart(self, slot: int, *, graceful: bool, after_s: float) -> None:
        """``after_s`` from now the slot's process stops or dies and a new one starts."""
        self._at(after_s, lambda: self._stop(slot, graceful))

    def _stop(self, slot: int, graceful: bool) -> None:
        handle = self._live(slot, "restart")
        if handle is None:
            return
        world = self.story.world
        if not graceful:
            world.timeline.add("FAULT", f"pid={handle.pid} dies; the next start finds no "
                               "clean-exit marker")
            handle.driver.crash_process("restart")
            self._start(slot)
            return
        if handle.pid in self.stopping:
            # a process stops once: a second stop request during its drain changes nothing
            world.timeline.add("lane", f"pid={handle.pid} is already stopping: nothing more")
            return
        self.stopping.add(handle.pid)
        running = tuple(sorted({key for actor in self.actors if not actor.done
                                and actor.pid == handle.pid
                                for key in [self.routed.get(id(actor))] if key}))
        world.timeline.add("lane", f"pid={handle.pid} stops gracefully; still running: "
                           f"{', '.join(running) or 'nothing'}")
        self.actors.append(handle.driver.spawn(router.shutdown(running, not running),
                                               name="stop"))
        self._at(STOP_GRACE_S, lambda: self._exit(slot, handle))

    def _exit(self, slot: int, handle: ProcessHandle) -> None:
        """The stopping process exits and the next one starts in its slot; if it died during
        its drain, that death already started its successor, which this stop must not touch."""
        world, process = self.story.world, handle.process
        self.stopping.discard(handle.pid)
        if not process.alive:
            return
        process.alive, process.died_at = False, world.clock.now()
        process.died_seq = world.effects_performed
        world.scheduler.drop_process(process.pid, "stop")
        world.timeline.add("restart", f"pid={process.pid} exits")
        self._start(slot)

    def _start(self, slot: int) -> None:
        handle = start(self.story)
        self.slots[slot] = handle

        async def boot() -> router.Startup:
            startup = await router.start(self.story._limits)
            await router.watch(self.story._limits)
            return startup
        self.actors.append(handle.driver.spawn(boot(), name="start"))


def restarted(story: Story) -> bool:
    """Whether a lane restart's start pass ran (the lane log shows a start)."""
    return any(e.kind.startswith("start") for e in story.world.store.snapshot().lane_log)


def stage(story: Story, plan: LanePlan, handles: list[ProcessHandle]) -> LaneWorld:
    """Hand out every lane event of ``plan`` (``run.stage``'s last call)."""
    lanes = LaneWorld(story, handles, job_s=plan.job_s)
    for event in plan.events:
        if isinstance(event, LaneMessage):
            lanes.message(event.process, event.source, event.text, after_s=event.at_s,
                          reset_too=event.reset_too, at_rotation=event.at_rotation,
                          after_failure_s=event.after_failure_s,
                          after_rotation_s=event.after_rotation_s,
                          at_pass_elsewhere=event.at_pass_elsewhere)
        elif isinstance(event, LaneReset):
            lanes.reset(event.process, event.source, after_s=event.at_s)
        elif isinstance(event, Background):
            lanes.background(event.source, live=event.live, after_s=event.at_s)
        elif isinstance(event, Evict):
            lanes.evict(event.source, after_s=event.at_s)
        elif isinstance(event, WatchPass):
            lanes.watch(event.process, after_s=event.at_s)
        elif isinstance(event, LaneRestart):
            lanes.restart(event.process, graceful=event.graceful, after_s=event.at_s)
    return lanes


# ---- a lanes part as scenario lines, and smaller ones ---------------------------------------


def _source(source: SessionSource) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in source.model_dump(exclude_none=True).items())
    return f"SessionSource({fields})"


def render_lanes(plan: LanePlan, names: tuple[str, ...]) -> list[str]:
    """The calls ``stage`` makes for ``plan``, as lines of a scenario (after its steps)."""
    lines = [f"lanes = LaneWorld(s, [{', '.join(names)}], job_s={plan.job_s!r})"]
    for e in plan.events:
        if isinstance(e, LaneMessage):
            lines.append(f"lanes.message({e.process}, {_source(e.source)}, {e.text!r}, "
                         f"after_s={e.at_s!r}" + (", reset_too=True" if e.reset_too else "")
                         + (", at_rotation=True" if e.at_rotation else "")
                         + (f", after_rotation_s={e.after_rotation_s!r}"
                            if e.after_rotation_s is not None else "")
                         + (", at_pass_elsewhere=True" if e.at_pass_elsewhere else "")
                         + (f", after_failure_s={e.after_failure_s!r})"
                            if e.after_failure_s is not None else ")"))
        elif isinstance(e, LaneReset):
            lines.append(f"lanes.reset({e.process}, {_source(e.source)}, after_s={e.at_s!r})")
        elif isinstance(e, Background):
            lines.append(f"lanes.background({_source(e.source)}, live={e.live}, "
                         f"after_s={e.at_s!r})")
        elif isinstance(e, Evict):
            lines.append(f"lanes.evict({_source(e.source)}, after_s={e.at_s!r})")
        elif isinstance(e, WatchPass):
            lines.append(f"lanes.watch({e.process}, after_s={e.at_s!r})")
        elif isinstance(e, LaneRestart):
            lines.append(f"lanes.restart({e.process}, graceful={e.graceful}, after_s={e.at_s!r})")
    return lines


def render_settings(plan: LanePlan) -> str:
    return "s.limits(" + ", ".join(f"{k}={v!r}" for k, v in plan.settings().items()) + ")"


def fewer_events(plan: LanePlan, start: int, size: int) -> LanePlan:
    """``plan`` without ``size`` events from ``start`` on (the shrinker's edit)."""
    return plan.model_copy(update={"events": plan.events[:start] + plan.events[start + size:]})
