"""A world plan: everything one explored run does, drawn from a seed, small enough to read.

A plan is data, not code: the processes, the sessions and their principals, the steps of
the faulty phase on the virtual clock (submissions, drain claims, kills, stalls, clock
jumps) and the faults (provider replies by call number, a crash point, store write
failures). ``generate`` draws one from a seed, one seeded sub-stream per part, so that
changing how faults are drawn does not change the workload a seed gives. ``run`` in
``sim.explore.run`` executes a plan; the shrinker edits plans; ``render`` writes one
as a scenario file. The same plan always gives the same run.
"""

from __future__ import annotations

import random
from enum import StrEnum
from typing import Annotated, Literal, TypedDict

from pydantic import Field, ValidationError, model_validator

from hermes_ref.effects import Site
from hermes_ref.errors import BadInput
from hermes_ref.models import Frozen
from sim.explore.lanes import LanePlan, draw_lanes
from sim.explore.terminal import Direct, Redact, draw_terminal
from sim.explore.watch import Client, Recover, draw_clients, draw_rounds
from sim.faults import CrashPoint
from sim.world import seeded_id


class FaultKind(StrEnum):
    """Every kind of fault a plan can hold; a sweep reports which of them fired."""

    KILL = "kill"                      # a process dies wherever its actors are
    STALL = "stall"                    # a process freezes (its lease may lapse meanwhile)
    CLOCK_JUMP = "clock_jump"          # the virtual clock leaps forward
    CRASH_POINT = "crash_point"        # the process performing a site dies before/after it
    CRASH_AT_EFFECT = "crash_at_effect"  # the process performing the world's n-th effect dies
    WRITE_FAILURE = "write_failure"    # the store refuses a write at a site
    EMPTY_REPLY = "empty_reply"        # the model answers nothing
    RATE_LIMIT = "rate_limit"          # 429 with Retry-After
    SERVER_ERROR = "server_error"      # 5xx
    DROPPED_CALL = "dropped_call"      # finish_reason tool_calls with no calls
    SLOW_REPLY = "slow_reply"          # the answer arrives late
    TOOL_ERROR = "tool_error"          # the model asks for a file that is not there
    BAD_ARGUMENTS = "bad_arguments"    # a tool call whose arguments are not JSON
    UNKNOWN_TOOL = "unknown_tool"      # a call to a tool nobody offered
    AUTH_ERROR = "auth_error"          # 401: the credentials are renewed once, then retried
    REASONING_ONLY = "reasoning_only"  # a reply that only reasoned, nothing visible
    NARRATED_CALL = "narrated_call"    # finish_reason tool_calls, a narration and no call
    LONE_SURROGATE = "lone_surrogate"  # the answer carries a lone UTF-16 surrogate
    SHARED_CALL_IDS = "shared_call_ids"  # two calls of one reply under one id
    DEEP_ARGUMENTS = "deep_arguments"  # arguments nested past the parser's limit (a local bug)
    WIDE_BATCH = "wide_batch"          # ten reads in one round, more than the [8] workers
    STREAM_CUT = "stream_cut"          # the reply's stream breaks after a few deltas
    OVERFLOW = "overflow"              # 400: the request is past the model's context window
    OUTAGE = "outage"                  # 503 to one request and to every retry of it
    RUN_CODE = "run_code"              # a round of execute_code only: its budget unit comes back
    HUGE_READ = "huge_read"            # a read of a 120,000-character log: the result is spilled
    INTERRUPT = "interrupt"            # the user stops the session's running turn
    REDIRECT = "redirect"              # the user sends a correction to the running turn
    SLOW_TOOL = "slow_tool"            # a tool runs long, begins late, or never returns
    FALLBACK = "fallback"              # a fallback route behind the primary (LOOP-6)
    SMALL_WINDOW = "small_window"      # a context window a few turns fill: compaction, rotation
    VERIFY_GATE = "verify_gate"        # the first answer after a file change waits for a check
    DISCONNECT = "disconnect"          # a chat client drops, comes back and replays what it missed
    LANE_RESTART = "lane_restart"      # a process restarts: no clean-exit marker, or lanes running
    SUMMARY_FAILURE = "summary_failure"  # a compaction's summary request fails (503): the cooldown
    REFUSED_WRITE = "refused_write"    # the model writes under a file as if it were a folder
    LOCK_STALL = "lock_stall"          # a process freezes holding a compression lock (CMP-6)
    # a process freezes while its late tool call waits to begin, drawn only in
    # ``sim/explore/late.py``
    FROZEN_LATE_START = "frozen_late_start"
    # the model answers nothing to the first request after a correction taken in after a
    # tool round, drawn only in ``sim/explore/corrected.py``
    EMPTY_AFTER_CORRECTION = "empty_after_correction"
    # the provider refuses each request that asks the model to check its work (FIN-1's gate),
    # drawn only in ``sim/explore/gated.py``
    CHECK_REFUSED = "check_refused"
    # a lane's message arrives as its session rotates, drawn only in ``sim/explore/lineage.py``
    LANE_AT_ROTATION = "lane_at_rotation"
    # the summary asked as a late one arrives fails, and its lane's user comes back near the
    # cooldown's end, drawn only in ``sim/explore/cooldown.py``
    COOLDOWN_EDGE = "cooldown_edge"
    # a process that remembers a lane's lineage waits for the lease of a session of it that
    # another process rotates meanwhile, drawn only in ``sim/explore/waiter.py``
    WAIT_PAST_ROTATION = "wait_past_rotation"
    # the reply shapes of ``sim/explore/shapes.py``, drawn only there
    CUT_OFF_ARGUMENTS = "cut_off_arguments"  # arguments cut off mid-value, finish_reason tool_calls
    TRUNCATED_CALL = "truncated_call"  # arguments cut off mid-value, finish_reason length
    MALFORMED_AGAIN = "malformed_again"  # malformed, a round that parses, malformed twice more
    THINK_ONLY = "think_only"          # after a tool round, only an inline think block
    MIXED_HOUSEKEEPING = "mixed_housekeeping"  # todo and a read with text, then an empty reply
    ERRORS_AROUND_OVERFLOW = "errors_around_overflow"  # 503s, an overflow, 503s: one iteration
    PADDED_ANSWER = "padded_answer"    # an answer with whitespace at its edges


REPLY_FAULTS = (FaultKind.EMPTY_REPLY, FaultKind.RATE_LIMIT, FaultKind.SERVER_ERROR,
                FaultKind.DROPPED_CALL, FaultKind.SLOW_REPLY, FaultKind.TOOL_ERROR,
                FaultKind.BAD_ARGUMENTS, FaultKind.UNKNOWN_TOOL)
# the provider's odder replies, drawn from a sub-stream of their own ("provider")
ODD_REPLIES = (FaultKind.AUTH_ERROR, FaultKind.REASONING_ONLY, FaultKind.NARRATED_CALL,
               FaultKind.LONE_SURROGATE, FaultKind.SHARED_CALL_IDS, FaultKind.DEEP_ARGUMENTS,
               FaultKind.WIDE_BATCH, FaultKind.STREAM_CUT, FaultKind.OVERFLOW,
               FaultKind.RUN_CODE, FaultKind.HUGE_READ)
BIG_LOG = "big.log"  # the file a HUGE_READ reads; ``stage`` writes it (``BIG_LOG_TEXT``)
BIG_LOG_TEXT = "x" * 120_000 + "\n"
WHOLE_STREAM = 99  # STREAM_CUT deltas past any reply's last: the whole stream came, then it broke
# kinds that also come in bursts of calls in a row (the loop's bounds are about runs of them)
BURST_FAULTS = (FaultKind.EMPTY_REPLY, FaultKind.DROPPED_CALL, FaultKind.BAD_ARGUMENTS,
                FaultKind.UNKNOWN_TOOL)
# sites a crash point or a write failure may be aimed at: every durable write of a turn
# and of the door (an in-turn refresher write, a lease poll and the event flush are left
# to the scheduled kills, which land anywhere)
CRASH_SITES = (Site.LEASE, Site.USER, Site.TOOL_CALLS, Site.TOOLS, Site.TOOL_RESULTS,
               Site.FINAL, Site.RELEASE, Site.ADMIT, Site.CLAIM, Site.SETTLE)
WRITE_SITES = (Site.USER, Site.TOOL_CALLS, Site.TOOL_RESULTS, Site.FINAL)


class Submit(Frozen):
    op: Literal["submit"] = "submit"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)  # index into the plan's processes, 0-based
    principal: str
    session: str
    request_id: str
    text: str
    claims: dict[str, str] = Field(default_factory=dict)  # payload fields that claim authority
    intent: str = "queue"  # what the submitter asks for: queue, or steer (ADM-2)
    kind: str | None = None  # an internal event's claimed kind: background, cron, subagent


class Drain(Frozen):
    op: Literal["drain"] = "drain"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)
    session: str


class Kill(Frozen):
    op: Literal["kill"] = "kill"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)


class Stall(Frozen):
    op: Literal["stall"] = "stall"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)
    seconds: float = Field(gt=0)


class ClockJump(Frozen):
    op: Literal["clock_jump"] = "clock_jump"
    at_s: float = Field(ge=0)
    seconds: float = Field(gt=0)


class Interrupt(Frozen):
    """The user stops the session's running turn, if one runs then (FIN-4)."""

    op: Literal["interrupt"] = "interrupt"
    at_s: float = Field(ge=0)
    session: str


class Redirect(Frozen):
    """The user sends ``text`` to the session's running turn as a correction (LOOP-4): at
    ``at_s`` if it waits on a model call then, or, with ``during``, at the first moment
    from ``at_s`` on that a turn of the session begins a tool round after its ``calls``-th
    model call (``tools``), sends its grace call (``grace``), a call preparing a tool
    call (``call``) or the call asking for the gate's check (``check``), the last three
    slow to stream (``slow_s``) and cut halfway (``sim.interventions.Moment``)."""

    op: Literal["redirect"] = "redirect"
    at_s: float = Field(ge=0)
    session: str
    text: str
    during: Literal["tools", "grace", "call", "check"] | None = None
    slow_s: float = Field(default=0.0, ge=0)
    calls: int = Field(default=0, ge=0)


class Handover(Frozen):
    """A caller hands ``process`` a turn of session ``into`` directly, not through the door,
    with its own history of ``history`` exchanges (CTX-2). ``into`` is no session of the
    plan's: nobody is bound to it, so its user rows need no admission (ADM-1)."""

    op: Literal["handover"] = "handover"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)
    into: str
    text: str
    history: int = Field(default=2, ge=0)


Step = Annotated[Submit | Drain | Kill | Stall | ClockJump | Interrupt | Redirect | Direct
                 | Redact | Recover | Handover, Field(discriminator="op")]
TIMED_FAULTS = {"kill", "stall", "clock_jump", "interrupt", "redirect"}  # steps that are faults


class ReplyFault(Frozen):
    """What the model does on the world's ``call``-th request (1-based) instead of answering."""

    call: int = Field(ge=1)
    kind: FaultKind
    seconds: float = Field(default=0.0, ge=0)  # SLOW_REPLY: the delay; RATE_LIMIT: Retry-After
    deltas: int = Field(default=0, ge=0)  # STREAM_CUT: the deltas delivered before the break


class ToolTiming(Frozen):
    """Calls of ``tool`` aimed at ``path`` begin ``start_delay_s`` late and run ``seconds``,
    or never return (``stuck``): the batch's start gate and deadline (TOOL-5). With
    ``stall_s``, the process of the first such call freezes that long as the call begins
    to wait out its delay (``frozen_late_start``, ``sim/explore/late.py``: LEASE-4)."""

    tool: str
    path: str
    seconds: float = Field(default=0.0, ge=0)
    start_delay_s: float = Field(default=0.0, ge=0)
    stuck: bool = False
    stall_s: float = Field(default=0.0, ge=0)


class WorldPlan(Frozen):
    """One explored world: who runs, what they submit, and what goes wrong."""

    seed: int
    processes: int = Field(ge=1, le=8)
    sessions: dict[str, str]  # session id -> its principal
    members: dict[str, str] = Field(default_factory=dict)  # more principals -> their session
    max_iterations: int | None = Field(default=None, ge=1)  # a tight iteration budget
    files: dict[str, str] = Field(default_factory=dict)
    steps: tuple[Step, ...] = ()
    replies: tuple[ReplyFault, ...] = ()
    crash: CrashPoint | None = None
    crash_at_effect: int | None = Field(default=None, ge=1)
    write_failures: dict[Site, int] = Field(default_factory=dict)
    tool_timings: tuple[ToolTiming, ...] = ()
    fallback_window: int | None = Field(default=None, ge=1)  # tokens of the fallback route
    context_window: int | None = Field(default=None, ge=1)  # tokens of the primary's window
    verify_before_answer: bool = False  # the verification gate (FIN-1's withheld answer)
    terminals: tuple[str, ...] = ()  # sessions run from a terminal, not through the door
    lease_wait_s: float | None = Field(default=None, gt=0)  # a short lease wait (LEASE-5)
    build_log_s: float | None = Field(default=None, ge=0)  # a terminal's build log's read time
    clients: tuple[Client, ...] = ()  # chat clients following sessions (DEL-2)
    lanes: LanePlan | None = None  # platform messages through the lane router (SES)
    iteration_budget: int | None = Field(default=None, ge=1)  # budget units (LOOP-1)
    grace_call: bool = True  # the summary call at the end of a budget (FIN-1, FIN-8)
    symlinks: dict[str, str] = Field(default_factory=dict)  # link -> target, in the workspace
    idle_compact_after_s: float | None = Field(default=None, gt=0)  # idle compaction (CTX-5)
    summary_failures: tuple[int, ...] = ()  # the n-th summary requests that fail (CMP-4)
    summary_timeouts: tuple[int, ...] = ()  # the n-th summary requests that time out (CMP-4)
    huge_reads_share_id: bool = False  # every read of the huge log under one call id (TOOL-7)
    summary_delay_s: float | None = Field(default=None, gt=0)  # each summary arrives this late
    grace_outages: tuple[int, ...] = ()  # the n-th grace calls that meet an outage (LOOP-2/6)
    lock_stall_s: float | None = Field(default=None, gt=0)  # the terminal's lock holder freezes
    compression_lock_ttl_s: float | None = Field(default=None, gt=0)  # a lock outlasting a lease
    errors_max: int | None = Field(default=None, ge=1)  # a turn's failed calls (LOOP-5)
    # the model answers nothing to the first request after each correction a turn took in
    # after a tool round (``sim/explore/corrected.py``: LOOP-8)
    empty_after_correction: bool = False
    # a summary asked in the instant a late one arrived fails (``sim/explore/cooldown.py``: CMP-4)
    summary_stumbles: bool = False
    # the provider refuses (a 400) each request that asks the model to verify its work after
    # the gate held an answer back (``sim/explore/gated.py``: FIN-6)
    refuse_the_check: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> WorldPlan:
        """Every step names a process of the plan and a session of the plan."""
        for number, step in enumerate(self.steps):
            process = getattr(step, "process", None)
            if process is not None and process >= self.processes:
                raise ValueError(f"step {number} ({step.op}) names process {process}, but the "
                                 f"plan has {self.processes} (0 to {self.processes - 1})")
            session = getattr(step, "session", None)
            if session is not None and session not in self.sessions \
                    and session not in self.terminals:
                raise ValueError(f"step {number} ({step.op}) names session {session!r}, which "
                                 f"is not among the plan's sessions")
        unknown = sorted(s for s in self.members.values() if s not in self.sessions)
        if unknown:
            raise ValueError(f"members are bound to unknown session(s) {', '.join(unknown)}")
        if self.refuse_the_check and not self.verify_before_answer:
            raise ValueError("refuse_the_check needs verify_before_answer: only the gate asks "
                             "for a check")
        if self.summary_stumbles and self.summary_delay_s is None:
            raise ValueError("summary_stumbles needs summary_delay_s: a summarizer stumbles "
                             "only after a late summary")
        if any(n < 0 for n in self.write_failures.values()):
            raise ValueError("write_failures counts must be 0 or more")
        if self.lanes is not None and any(getattr(e, "process", 0) >= self.processes
                                          for e in self.lanes.events):
            raise ValueError(f"a lane event names a process the plan does not have "
                             f"({self.processes})")
        return self

    def fault_kinds(self) -> set[FaultKind]:
        """The fault kinds this plan holds (not all need fire: a kill after the end does not)."""
        kinds = {FaultKind(s.op) for s in self.steps if s.op in TIMED_FAULTS}
        kinds |= {r.kind for r in self.replies}
        if self.grace_outages:
            kinds.add(FaultKind.OUTAGE)
        if self.tool_timings:
            kinds.add(FaultKind.SLOW_TOOL)
        if any(t.stall_s > 0 for t in self.tool_timings):
            kinds.add(FaultKind.FROZEN_LATE_START)
        if self.empty_after_correction:
            kinds.add(FaultKind.EMPTY_AFTER_CORRECTION)
        if self.refuse_the_check:
            kinds.add(FaultKind.CHECK_REFUSED)
        if self.fallback_window is not None:
            kinds.add(FaultKind.FALLBACK)
        if self.context_window is not None:
            kinds.add(FaultKind.SMALL_WINDOW)
        if self.verify_before_answer:
            kinds.add(FaultKind.VERIFY_GATE)
        if self.crash is not None:
            kinds.add(FaultKind.CRASH_POINT)
        if self.crash_at_effect is not None:
            kinds.add(FaultKind.CRASH_AT_EFFECT)
        if any(self.write_failures.values()):
            kinds.add(FaultKind.WRITE_FAILURE)
        if any(c.disconnect_after is not None for c in self.clients):
            kinds.add(FaultKind.DISCONNECT)
        if self.lanes is not None and self.lanes.restarts:
            kinds.add(FaultKind.LANE_RESTART)
        if self.lanes is not None and self.lanes.held:
            kinds.add(FaultKind.LANE_AT_ROTATION)
        if self.summary_failures or self.summary_timeouts:
            kinds.add(FaultKind.SUMMARY_FAILURE)
        if self.summary_stumbles:
            kinds.add(FaultKind.COOLDOWN_EDGE)
        if self.lanes is not None and self.lanes.waiting_out:
            kinds.add(FaultKind.WAIT_PAST_ROTATION)
        if self.lock_stall_s is not None:
            kinds.add(FaultKind.LOCK_STALL)
        return kinds

    @property
    def size(self) -> tuple[int, int, int, int, int]:
        """What the shrinker makes smaller, most important first."""
        faults = (len(self.replies) + (self.crash is not None) + (self.crash_at_effect is not None)
                  + sum(self.write_failures.values())
                  + len(self.tool_timings) + (self.fallback_window is not None)
                  + sum(1 for t in self.tool_timings if t.stall_s > 0)
                  + (self.context_window is not None) + self.verify_before_answer
                  + len(self.summary_failures) + len(self.summary_timeouts)
                  + len(self.grace_outages)
                  + (self.lock_stall_s is not None) + self.empty_after_correction
                  + self.refuse_the_check
                  + self.summary_stumbles
                  + sum(1 for s in self.steps if s.op in TIMED_FAULTS)
                  + sum(1 for c in self.clients if c.disconnect_after is not None))
        turns = sum(1 for s in self.steps if s.op in ("submit", "direct"))
        lanes = self.lanes.size if self.lanes is not None else (0, 0, 0)
        return (self.processes, len(self.sessions) + len(self.terminals), turns + lanes[0],
                faults + lanes[1], len(self.steps) + lanes[2])


def load_plan(text: str, where: str = "plan") -> WorldPlan:
    """A plan from its JSON, or ``BadInput`` naming what is wrong."""
    try:
        return WorldPlan.model_validate_json(text)
    except ValidationError as error:
        first = error.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise BadInput(f"{where}: {loc}: {first['msg']}") from error


# ---- drawing a plan from a seed -------------------------------------------------------------


# kinds a sweep draws only when named: the verification gate with the whole budget (the
# edges draw the gate in worlds of a budget of two or three on their own stream, by
# default). Drawn everywhere, the gate found no sabotage the default plan missed and made
# the worlds longer
OPT_IN = frozenset({FaultKind.VERIFY_GATE})


class FaultMix(Frozen):
    """Which fault kinds a sweep may draw, and how often (``--faults``)."""

    kinds: frozenset[FaultKind] = frozenset(FaultKind) - OPT_IN
    reply_fault_share: float = 0.25  # of the calls of the faulty phase
    process_fault_chance: float = 0.5  # per process: a kill, a stall or nothing

    @classmethod
    def parse(cls, text: str | None) -> FaultMix:
        """``all`` (every kind but the opt-in ones), ``none`` or a comma list of kinds, e.g.
        ``kill,empty_reply``; ``all,verify_gate`` adds an opt-in kind to all."""
        if text is None or text == "all":
            return cls()
        if text == "none":
            return cls(kinds=frozenset())
        names = [n.strip() for n in text.split(",") if n.strip()]
        base = cls().kinds if "all" in names else frozenset()
        names = [n for n in names if n != "all"]
        unknown = [n for n in names if n not in FaultKind.__members__.values()]
        if unknown:
            known = ", ".join(k.value for k in FaultKind)
            raise BadInput(f"unknown fault kind(s) {', '.join(unknown)} (known: {known}, "
                           "or all, none)")
        return cls(kinds=base | {FaultKind(n) for n in names})


def _rng(seed: int, part: str) -> random.Random:
    """One sub-stream per part of the plan: the workload does not move when faults do."""
    return random.Random(f"{seed}:{part}")


def _request_text(rng: random.Random, session: str, n: int, files: list[str]) -> str:
    pick = rng.random()
    if pick < 0.1 and len(files) > 1:
        return f"Read {files[0]} and {files[1]}."
    if pick < 0.35 and files:
        return f"Read {rng.choice(files)}."
    if pick < 0.6:
        return f"Write note {n} to {session}-out-{n}.txt."
    return f"Say hello {n}."


def generate(seed: int, mix: FaultMix | None = None) -> WorldPlan:
    """The plan the seed decides: 1-3 processes, 1-3 sessions, 2-6 submissions each."""
    mix = mix or FaultMix()
    shape = _rng(seed, "shape")
    processes = shape.randint(1, 3)
    sessions = {f"s-{i}": f"p-{i}" for i in range(1, shape.randint(1, 3) + 1)}
    files = {f"notes-{i}.txt": f"note {i} of seed {seed}" for i in range(1, 3)}
    work = _rng(seed, "workload")
    # the n-th request of every session shares one id drawn from the seed (``r-3fa2c1``):
    # request ids are per principal, so sessions reusing them is a case the door must take
    ids, taken = _rng(seed, "request_ids"), set[str]()
    request_ids = [seeded_id(ids, "r-", taken) for _ in range(6)]
    steps: list[Step] = []
    turns = 0
    for session, principal in sessions.items():
        for n in range(1, work.randint(2, 6) + 1):
            at = round(work.uniform(0.0, 120.0), 1)
            steps.append(Submit(at_s=at, process=work.randrange(processes), principal=principal,
                                session=session, request_id=request_ids[n - 1],
                                text=_request_text(work, session, n, sorted(files))))
            steps.append(Drain(at_s=round(at + work.uniform(0.5, 30.0), 1),
                               process=work.randrange(processes), session=session))
            turns += 1
    members, iterations = _more_requests(seed, sessions, steps, processes, request_ids[0])
    faults = _rng(seed, "faults")
    kinds = mix.kinds
    # how faulty this world is, drawn per seed around the mix's figures: some worlds are
    # nearly calm, some are storms
    process_chance = min(1.0, mix.process_fault_chance * faults.uniform(0.0, 2.0))
    reply_share = min(0.9, mix.reply_fault_share * faults.uniform(0.0, 2.0))
    steps += _kills_and_stalls(faults, kinds, processes, process_chance)
    if FaultKind.CLOCK_JUMP in kinds and faults.random() < 0.2:
        steps.append(ClockJump(at_s=round(faults.uniform(1.0, 150.0), 1),
                               seconds=float(faults.choice((60, 400, 3600)))))
    replies = _reply_faults(faults, kinds, reply_share, calls=turns * 2)
    crash = None
    if FaultKind.CRASH_POINT in kinds and faults.random() < 0.4:
        crash = CrashPoint(when=faults.choice(("before", "after")), site=faults.choice(CRASH_SITES),
                        occurrence=faults.randint(1, 3))
    failures: dict[Site, int] = {}
    if FaultKind.WRITE_FAILURE in kinds and faults.random() < 0.3:
        failures[faults.choice(WRITE_SITES)] = 1
    at_effect = None
    if FaultKind.CRASH_AT_EFFECT in kinds and faults.random() < 0.2:
        at_effect = faults.randint(1, 40 * turns)  # a turn is some 20-60 effects
    crash_free = not any(isinstance(s, Kill) for s in steps) and crash is None and at_effect is None
    timings, fallback = _odder_world(seed, kinds, sorted(files), steps, replies, turns * 2,
                                     crash_free)
    if failures:  # a huge result whose write fails is closed as unknown, which TOOL-7 takes
        replies = [r for r in replies if r.kind is not FaultKind.HUGE_READ]  # for unspilled
    watched = _bystanders(seed, kinds, processes, sorted(sessions), sorted(files), steps)
    steps.sort(key=lambda s: s.at_s)
    plan = WorldPlan(
        seed=seed, processes=processes, sessions=sessions, members=members,
        max_iterations=iterations, files=files, steps=tuple(steps), replies=tuple(replies),
        crash=crash, crash_at_effect=at_effect, write_failures=failures, tool_timings=timings,
        fallback_window=fallback, context_window=_small_window(seed, kinds, processes),
        verify_before_answer=_verify_gate(seed, kinds, iterations), **watched)
    # drawn last, on streams of their own
    from sim.explore import cooldown, corrected, edges, gated, late, lineage, shapes, waiter
    for part in (edges, shapes, late, corrected, lineage, cooldown, waiter, gated):
        plan = part.draw(seed, kinds, plan)
    return plan


def _kills_and_stalls(faults: random.Random, kinds: frozenset[FaultKind], processes: int,
                      chance: float) -> list[Step]:
    """Per process, with ``chance``: a kill or a stall at a time drawn from ``faults``."""
    steps: list[Step] = []
    for index in range(processes):
        if faults.random() >= chance:
            continue
        chosen: list[FaultKind] = [k for k in (FaultKind.KILL, FaultKind.STALL) if k in kinds]
        if not chosen:
            break
        kind = faults.choice(chosen)
        at = round(faults.uniform(1.0, 150.0), 1)
        if kind is FaultKind.KILL:
            steps.append(Kill(at_s=at, process=index))
        else:
            steps.append(Stall(at_s=at, process=index,
                               seconds=float(faults.choice((30, 200, 400, 900)))))
    return steps


class _Watched(TypedDict):
    terminals: tuple[str, ...]
    lease_wait_s: float | None
    build_log_s: float | None
    clients: tuple[Client, ...]
    lanes: LanePlan | None


def _bystanders(seed: int, kinds: frozenset[FaultKind], processes: int, sessions: list[str],
                files: list[str], steps: list[Step]) -> _Watched:
    """The terminal beside the door ("terminal"), recovery rounds after deaths ("watch"),
    chat clients ("clients") and a chat gateway's lanes ("lanes"), each on a sub-stream of
    its own (``sim.explore.terminal``, ``sim.explore.watch``, ``sim.explore.lanes``);
    returns the plan fields they fill."""
    direct, terminals, wait, log_s = draw_terminal(_rng(seed, "terminal"), processes, files)
    kills = [(s.at_s, s.process) for s in steps if isinstance(s, Kill)]
    for recover, drains in draw_rounds(_rng(seed, "watch"), processes, kills, sessions):
        steps.append(recover)
        steps += [Drain(at_s=at, process=recover.process, session=session)
                  for at, session in drains]
    steps += direct
    # a client follows one session id; a compaction's rotation moves the stream to a child
    followed = [] if _small_window(seed, kinds, processes) else [*sessions, *terminals]
    clients = draw_clients(_rng(seed, "clients"), followed, FaultKind.DISCONNECT in kinds)
    return _Watched(terminals=terminals, lease_wait_s=wait, build_log_s=log_s, clients=clients,
                    lanes=draw_lanes(seed, processes, FaultKind.LANE_RESTART in kinds))


def _reply_faults(faults: random.Random, kinds: frozenset[FaultKind], share: float,
                  calls: int) -> list[ReplyFault]:
    """Faulted model calls among the first ``calls`` (about two a turn), and now and then a
    burst of one kind four calls in a row."""
    reply_kinds = [k for k in REPLY_FAULTS if k in kinds]
    replies: list[ReplyFault] = []
    if not reply_kinds:
        return replies
    for call in range(1, calls + 1):
        if faults.random() < share:
            kind = faults.choice(reply_kinds)
            seconds = {FaultKind.SLOW_REPLY: float(faults.choice((5, 90, 400))),
                       FaultKind.RATE_LIMIT: float(faults.choice((1, 20)))}.get(kind, 0.0)
            replies.append(ReplyFault(call=call, kind=kind, seconds=seconds))
    bursts = [k for k in BURST_FAULTS if k in kinds]
    if bursts and faults.random() < 0.15:  # a run of one kind, as bounds are about runs
        kind, first = faults.choice(bursts), faults.randint(1, calls)
        taken = {r.call for r in replies}
        replies += [ReplyFault(call=c, kind=kind) for c in range(first, first + 4)
                    if c not in taken]
        replies.sort(key=lambda r: r.call)
    return replies


def _more_requests(seed: int, sessions: dict[str, str], steps: list[Step], processes: int,
                   first_id: str) -> tuple[dict[str, str], int | None]:
    """The door's hard cases, on their own sub-stream: a second member of a session reusing
    request ids, duplicate and conflicting resubmissions, payloads claiming authority, a
    stranger nobody bound; and, for some worlds, a tight iteration budget."""
    more = _rng(seed, "requests")
    members: dict[str, str] = {}
    submits = [s for s in steps if isinstance(s, Submit)]
    for session in sessions:
        if more.random() < 0.3:
            member = f"q-{session[2:]}"
            members[member] = session
            for old in [s for s in submits if s.session == session][:2]:
                steps.append(old.model_copy(update={
                    "principal": member, "at_s": round(old.at_s + more.uniform(0.1, 10.0), 1),
                    "text": f"Say hello {old.request_id[2:]} from {member}."}))
    for old in submits:
        roll = more.random()
        later = round(old.at_s + more.uniform(0.1, 20.0), 1)
        if roll < 0.12:  # the same request again: one admission
            steps.append(old.model_copy(update={"at_s": later}))
        elif roll < 0.2:  # the same id with another payload: a conflict
            steps.append(old.model_copy(update={"at_s": later, "text": "Say hello 99."}))
        elif roll < 0.28:  # a payload that claims to be the operator
            steps.append(old.model_copy(update={"at_s": later, "request_id": old.request_id + "x",
                                                "claims": {"role": "operator"}}))
    if more.random() < 0.15:
        session = more.choice(sorted(sessions))
        steps.append(Submit(at_s=round(more.uniform(0.0, 120.0), 1),
                            process=more.randrange(processes), principal="stranger",
                            session=session, request_id=first_id, text="Say hello 1."))
    iterations = more.choice((1, 2, 3)) if more.random() < 0.2 else None
    return members, iterations


def _verify_gate(seed: int, kinds: frozenset[FaultKind], iterations: int | None) -> bool:
    """The verification gate, in a world in four with the whole budget ("gate"): with a
    tight one, the held-back answer delivered at max_iterations breaks FIN-1 and LOOP-3 on
    the intact engine."""
    return FaultKind.VERIFY_GATE in kinds and _rng(seed, "gate").random() < 0.25 \
        and iterations is None


def _small_window(seed: int, kinds: frozenset[FaultKind], processes: int) -> int | None:
    """A context window a few turns fill, in some one-process worlds ("context")."""
    pressure = _rng(seed, "context")
    if window_allowed(kinds, processes) and pressure.random() < 0.3:
        return pressure.choice((250, 320, 400))
    return None


def window_allowed(kinds: frozenset[FaultKind], processes: int) -> bool:
    """Whether the context part may draw a small window in a world: its kind is in the
    mix and the world has one process (``_small_window``; the lineage part asks too)."""
    return FaultKind.SMALL_WINDOW in kinds and processes == 1


def _odder_world(seed: int, kinds: frozenset[FaultKind], files: list[str], steps: list[Step],
                 replies: list[ReplyFault], calls: int,
                 crash_free: bool) -> tuple[tuple[ToolTiming, ...], int | None]:
    """What the first parts leave out, each on a sub-stream of its own so the parts drawn
    before do not move: the provider's odder replies and a fallback route ("provider"), the
    user's hand on a running turn ("interventions"), slow tools ("tools"). A call past the
    batch deadline comes only in a world where no process dies and the user interrupts
    nothing (a crash or an interrupt closes such a call as unknown, which the deadline's
    checker does not tell from a result that counts)."""
    provider = _rng(seed, "provider")
    taken = {r.call for r in replies}
    odd = [k for k in ODD_REPLIES if k in kinds]
    for _ in range(provider.choice((0, 1, 2, 2, 3)) if odd else 0):
        call, kind = provider.randint(1, calls), provider.choice(odd)
        if call in taken:
            continue
        taken.add(call)
        replies.append(ReplyFault(call=call, kind=kind, deltas=provider.randint(1, 3)
                                  if kind is FaultKind.STREAM_CUT else 0))
        if kind is FaultKind.STREAM_CUT and call + 1 not in taken and provider.random() < 0.5:
            taken.add(call + 1)  # and the retry's stream delivers everything, then breaks
            replies.append(ReplyFault(call=call + 1, kind=kind, deltas=WHOLE_STREAM))
    fallback = None
    if FaultKind.FALLBACK in kinds and provider.random() < 0.4:
        fallback = provider.choice((120, 200, 4_000))  # tokens: small ones refuse most requests
        first = provider.randint(1, calls)  # the primary fails one request and its retries
        if first not in taken and provider.random() < 0.8:
            taken.add(first)
            replies.append(ReplyFault(call=first, kind=FaultKind.OUTAGE))
    replies.sort(key=lambda r: r.call)
    hand = _rng(seed, "interventions")
    drains = [s for s in steps if isinstance(s, Drain)]
    wanted = [k for k in (FaultKind.INTERRUPT, FaultKind.REDIRECT) if k in kinds]
    for _ in range(hand.choice((0, 1, 2, 3)) if wanted and drains else 0):
        drain, kind = hand.choice(drains), hand.choice(wanted)
        at = round(drain.at_s + hand.uniform(0.0, 40.0), 1)  # while its turn may be running
        steps.append(Interrupt(at_s=at, session=drain.session) if kind is FaultKind.INTERRUPT
                     else Redirect(at_s=at, session=drain.session,
                                   text=f"Say hello {hand.randint(10, 99)} instead."))
    tools = _rng(seed, "tools")
    timings: list[ToolTiming] = []
    if FaultKind.SLOW_TOOL in kinds and tools.random() < 0.35:
        path, shape = tools.choice(files), tools.choice(("slow", "slow", "late", "past"))
        calm_user = not any(isinstance(s, Interrupt) for s in steps)
        shape = shape if shape != "past" or (crash_free and calm_user) else "slow"
        timings.append(ToolTiming(
            tool="read_file", path=path, seconds={"slow": float(tools.choice((20, 60))),
                                                  "late": 1.0, "past": 500.0}.get(shape, 0.0),
            start_delay_s=300.0 if shape == "late" else 0.0))
    return tuple(timings), fallback
