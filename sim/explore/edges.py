"""The world's context and loop-ending parts, each drawn from a sub-stream of its own.

``draw`` adds them to a plan the older parts have drawn, moving nothing of those:

* ``budgets``: in a world in five an iteration budget of 1-3 units (``iteration_budget``),
  which binds before ``max_iterations`` does (LOOP-1); in about a third of the worlds
  with a tight budget or cap, no grace call, so a turn whose budget ends on a tool round
  stops on its results (FIN-8); in four of five worlds with a budget of 2 or 3 (and the
  whole cap) the verification gate, whose held-back answer the budget's end delivers (FIN-1);
* ``aliases``: in about a third of the worlds one or two turns that read a notes file and
  rewrite it in the same round, naming it again, by its absolute path, through a symlink
  (``link-notes-1.txt``) or as ``./notes-1.txt``: one file, so the write waits for the
  read (TOOL-4);
* ``folders``: in a world in five one turn writes a note into ``drafts/`` and searches
  ``drafts`` in the same round: the search of the folder waits for the write inside it
  (TOOL-4). It is drawn last and only adds its turn, so the other parts' draws stand;
* ``retries``: in a world in five one turn patches a note into a file that is not there,
  through ``./``, which fails, and then writes it under the plain path: the answer must
  not report the write the turn redid (TOOL-9). Drawn last, like ``folders``;
* ``returns``: a session's user comes back after its workload, within a minute or after
  a pause of 5-25 minutes, and half the time asks again what they asked first;
* ``pressure``: in a world with a small context window, half the time idle compaction
  (``idle_compact_after_s`` 300 or 600 s, CTX-5), and in three worlds in five one or two
  failed summary requests (``summary_failures``, numbered by summary request: the cooldown
  of CMP-4);
* ``writes``: in a world in four the model writes under a file as if it were a folder
  (``notes-1.txt/draft.txt``); the tool refuses, and the answer must say so (TOOL-9);
* ``chores``: in a world in four a session opens with a long chore of 6-10 reads, one a
  round (``Go through part-1.txt to part-8.txt in order.``), and half the time its user
  asks for it again later; a one-process world without a small window gets one of 500-700
  tokens, which a chore fills halfway: the mid-turn compaction must keep that turn's own
  user row, not its earlier twin in the session's head (CTX-7);
* ``handover``: in a world in four a conversation brought in from elsewhere: a caller hands
  a process a turn of a session of its own with its history list (``Handover``), which the
  turn must copy and never change (CTX-2), then one or two more with that list grown;
* ``graces``: in three worlds in ten with a fallback route, an outage at the first or
  second grace call of the faulty phase (``grace_outages``): its retries spent on the
  primary, the grace call is asked again of the fallback and gives back no unit it never
  spent (LOOP-2, LOOP-6); a world with no tight bound gets an iteration budget of 1-3 for it;
* ``contention``: in a world in four of several processes with a terminal that waits the
  whole lease wait, the terminal's user types on (4-8 more turns) into a window of 400-600
  tokens, and the first holder granted the session's compression lock freezes right after,
  for 400 or 600 s (``lock_stall_s``), under a lock that lasts 900 s
  (``compression_lock_ttl_s``): its lease lapses, the next turn in line takes the session,
  compacts too and must be refused the lock (CMP-6);
* ``corrections``: in a world in four, two to four corrections sent at a moment of a turn
  (``Redirect.during``): during a tool round (the last one the bound allows), during the
  grace call, or during a call preparing a tool call, cut before it showed anything; a
  world with no bound gets a ``max_iterations`` of 1-3, and one with a correction of a
  call, outages at every grace call and a fallback route of 150-260 tokens (LOOP-4, LOOP-6);
  a world with a correction of a call, a small window and the overflow fault kind also
  gets overflows at four of model calls 3-20, so a request is sent again after a
  compaction with the hidden row the cut left in its history (LOOP-4, LOOP-5);
* ``steers``: in a world in three with a member bound to a session (the door's hard cases),
  that member asks to steer the session (``Submit.intent``), which only an owner or an
  operator may: the door refuses it (ADM-2). Drawn last, like ``folders``;
* ``internal``: in a world in eight, a session's owner, bound as a user, hands the door an
  internal event (``Submit.kind``: a background completion, a cron tick or a subagent
  report, request id ``cron:e-...``): only a principal bound as that kind may, so the door
  refuses it (ADM-2). Drawn last;
* ``timeouts``: in a world in three with a small window (and the summary failures' kind),
  the first or second summary request the 503s leave alone times out instead
  (``summary_timeouts``): a timeout starts the cooldown as a failure does (CMP-4). Drawn last;
* ``admits``: in a world in eight (with the write failures' kind), the store refuses the
  door's first admission write (``write_failures["admit"]``): the door must refuse the
  submission, never acknowledge it (ADM-1). Drawn last;
* ``spills``: in a world in ten (with the huge reads' kind), two reads of the huge log, at
  calls 1-6 and 2-12 calls later, and every huge read of the world under one call id
  (``huge_reads_share_id``), as a provider that numbers calls per request sends them: each
  output is spilled to a file of its own (TOOL-7). Drawn last;
* ``stops``: in a world in four with a small window (and the interrupts' kind), every
  summary arrives 30, 90 or 180 s late (``summary_delay_s``) and the user stops one to
  three running turns in the first 400 s, so a stop may land while a turn's preflight
  waits on its summary: the turn sent nothing and must get back the budget unit the loop
  spent for the iteration (CTX-1, LOOP-2). Drawn last.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hermes_ref.effects import Site
from hermes_ref.errors import ProviderServerError, ProviderTimeout
from hermes_ref.models import Message, ProviderReply, Role
from hermes_ref.scaffolding import PRE_VERIFY_NUDGE
from hermes_ref.wire import ProviderRequest
from sim.explore.plan import (
    BURST_FAULTS,
    Drain,
    FaultKind,
    Handover,
    Interrupt,
    Redirect,
    ReplyFault,
    Step,
    Submit,
    WorldPlan,
)
from sim.explore.terminal import Direct, turn_text
from sim.summarizer import Summarizer
from sim.tools import SIM_ROOT
from sim.world import seeded_id

if TYPE_CHECKING:
    from sim.clock import VirtualClock as Clock
    from sim.harness import Story
    from sim.world import World

REWRITE = re.compile(r"^Read (\S+) and rewrite it as note (\d+) at (\S+)\.$")
FOLDER = re.compile(r"^Write note (\d+) to (\S+)/(\S+) and search (\S+) for it\.$")
RETRY = re.compile(r"^Patch note (\d+) into (\S+), or write it there\.$")
CHORE = re.compile(r"^Go through part-1\.txt to part-(\d+)\.txt in order\.$")
PART = re.compile(r"part-(\d+)\.txt")
PATH = re.compile(r'"path": "([^"]+)"')
REFUSED_PATH = "notes-1.txt/draft.txt"  # under a file: no folder is there to write into
LATER = (300.0, 600.0)  # seconds of idleness after which a turn compacts (CTX-5)
LOCK_TTL_S = 900.0  # a compression lock that outlasts the 300 s lease it was taken under


def _rng(seed: int, part: str) -> random.Random:
    return random.Random(f"{seed}:{part}")


def draw(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> WorldPlan:
    """``plan`` with this module's parts added (see the module docstring)."""
    steps = list(plan.steps)
    taken = {s.request_id for s in steps if isinstance(s, Submit)}
    links = _aliases(seed, plan, steps, taken)
    _returns(seed, plan, steps, taken)
    _handover(seed, plan, steps)
    files, window = _chores(seed, kinds, plan, steps, taken)
    window, lock_stall, lock_ttl = _contention(seed, kinds, plan, steps, window)
    steps.sort(key=lambda s: s.at_s)
    # a client follows one session id, and a compaction's rotation moves the stream to a child
    clients = () if window is not None else plan.clients
    plan = plan.model_copy(update={"context_window": window, "clients": clients,
                                   "lock_stall_s": lock_stall, "compression_lock_ttl_s": lock_ttl})
    budget, grace, gate = _budgets(seed, plan)
    budget, outages = _graces(seed, kinds, plan, budget)
    idle, failures = _pressure(seed, kinds, plan)
    corrected = _corrections(seed, kinds, plan, steps, budget, grace, gate, outages)
    replies = _with_overflows(_refused_writes(seed, kinds, plan), corrected.pop("overflows", ()))
    replies, shared_spills = _spills(seed, kinds, replies)  # last, as the parts below are
    added = _folders(seed, plan, steps, taken)  # last: the parts before drew over the steps
    added = _retries(seed, plan, steps, taken) or added  # as they were
    added = _steers(seed, plan, steps, taken) or added
    added = _internal(seed, plan, steps) or added
    slow = _stops(seed, kinds, plan, steps)
    added = slow is not None or added
    if added:
        steps.sort(key=lambda s: s.at_s)
    timeouts = _timeouts(seed, kinds, window, failures)
    return plan.model_copy(update={
        "steps": tuple(steps), "replies": replies,
        "iteration_budget": budget, "grace_call": grace, "verify_before_answer": gate,
        "symlinks": links, "files": files, "idle_compact_after_s": idle,
        "summary_failures": failures, "grace_outages": outages, **corrected,
        **({"summary_timeouts": timeouts} if timeouts else {}),
        **({"huge_reads_share_id": True} if shared_spills else {}),
        **({"summary_delay_s": slow} if slow is not None else {}),
        **_admits(seed, kinds, plan)})


def _turn(rng: random.Random, plan: WorldPlan, steps: list[Step], taken: set[str],
          session: str, at: float, text: str) -> None:
    """One more submission of ``session``'s principal, and a drain claim after it."""
    steps.append(Submit(at_s=round(at, 1), process=rng.randrange(plan.processes),
                        principal=plan.sessions[session], session=session,
                        request_id=seeded_id(rng, "r-", taken), text=text))
    steps.append(Drain(at_s=round(at + rng.uniform(0.5, 30.0), 1),
                       process=rng.randrange(plan.processes), session=session))


def _budgets(seed: int, plan: WorldPlan) -> tuple[int | None, bool, bool]:
    """A tight iteration budget, no grace call, and the verification gate, in some worlds
    ("budgets"): the gate only with a budget of 2 or 3 and the whole call cap, where the held
    answer is delivered when the budget ends (FIN-1). Neither a tight budget nor the grace
    call off comes with a fallback route, nor a tight budget with a small window or the
    gate of the opt-in part (docs/explore.md)."""
    rng = _rng(seed, "budgets")
    budget = rng.choice((1, 2, 3)) if rng.random() < 0.2 else None
    if plan.verify_before_answer or plan.fallback_window is not None \
            or plan.context_window is not None:
        budget = None
    tight = budget is not None or plan.max_iterations is not None
    grace = not (tight and rng.random() < 0.35) or plan.fallback_window is not None
    gate = (budget or 0) >= 2 and plan.max_iterations is None and rng.random() < 0.8
    return budget, grace, gate or plan.verify_before_answer


def _graces(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan,
            budget: int | None) -> tuple[int | None, tuple[int, ...]]:
    """In three worlds in ten with a fallback route, an outage at the first or second grace
    call of the faulty phase: the call after a turn's budget or call cap, whose retries are
    spent on the primary, so it is asked again of the fallback and gives back no unit it
    never spent (LOOP-2, LOOP-6) ("graces"). A world with neither bound tight gets an
    iteration budget of 1-3 units for it, unless it has a small window or the gate.
    Returns the budget and the grace calls the outage strikes."""
    rng = _rng(seed, "graces")
    if plan.fallback_window is None or FaultKind.OUTAGE not in kinds or rng.random() >= 0.3:
        return budget, ()
    if budget is None and plan.max_iterations is None and plan.context_window is None \
            and not plan.verify_before_answer:
        budget = rng.choice((1, 2, 3))
    if budget is None and plan.max_iterations is None:
        return budget, ()
    return budget, (rng.randint(1, 2),)


def _corrections(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan, steps: list[Step],
                 budget: int | None, grace: bool, gate: bool,
                 outages: tuple[int, ...]) -> dict[str, Any]:
    """In a world in four, two to four corrections the user sends at a moment of a turn of
    a session, watching from a time before one of its drain claims ("corrections"):
    during a tool round (in a world with a tight bound, the round after as many calls as
    the bound allows, the last one), during its next grace call (slow to stream, cut
    halfway), or during its next call preparing a tool call (slow, cut before it showed
    anything, so the cut reply is stored hidden). A world with neither bound tight gets a
    ``max_iterations`` of 1-3, so turns end at the loop's bound with a grace call still to
    come (a budget's end drains corrections at the top of the iteration that finds it
    spent; the loop's bound leaves the loop first), unless it has a small window or the
    gate (as for the grace outages), or a burst of one reply fault, whose run a tight bound
    would cut short. In a world
    with a correction of a call and the grace call on, every grace call of the faulty
    phase meets an outage and falls back to a route of 150-260 tokens, where a grace
    request of a few turns lies, with the hidden row in its session's history (LOOP-4,
    LOOP-6). Returns the plan fields it sets."""
    rng = _rng(seed, "corrections")
    drains = [s for s in steps if isinstance(s, Drain)]
    out: dict[str, Any] = {"iteration_budget": budget, "grace_outages": outages}
    if FaultKind.REDIRECT not in kinds or not drains or rng.random() >= 0.25:
        return out
    iterations = plan.max_iterations
    if budget is None and iterations is None and plan.context_window is None \
            and grace and not gate and not plan.verify_before_answer and not _burst(plan):
        iterations = out["max_iterations"] = rng.choice((1, 2, 3))
    bound = min(n for n in (budget, iterations, 99) if n is not None)
    moments: list[str] = []
    for _ in range(rng.randint(2, 4)):
        drain, during = rng.choice(drains), rng.choice(("tools", "grace", "call"))
        moments.append(during)
        steps.append(Redirect(
            at_s=round(rng.uniform(0.0, drain.at_s), 1), session=drain.session,
            during=during, text=f"Say hello {rng.randint(10, 99)} instead.",
            slow_s=float(rng.choice((5, 30, 90))) if during != "tools" else 0.0,
            calls=bound if during == "tools" and bound < 99 else 0))
    steps.sort(key=lambda s: s.at_s)
    if "call" in moments and grace and bound < 99 \
            and {FaultKind.OUTAGE, FaultKind.FALLBACK} <= kinds:
        out["grace_outages"] = tuple(range(1, 9))
        out["fallback_window"] = rng.randint(150, 260)
    if "call" in moments and FaultKind.OVERFLOW in kinds and plan.context_window is not None:
        out["overflows"] = tuple(sorted(rng.sample(range(3, 21), 4)))
    return out


def _with_overflows(replies: tuple[ReplyFault, ...],
                    calls: tuple[int, ...]) -> tuple[ReplyFault, ...]:
    """``replies`` with an overflow at each of ``calls`` that has no fault yet."""
    taken = {r.call for r in replies}
    more = [ReplyFault(call=c, kind=FaultKind.OVERFLOW) for c in calls if c not in taken]
    return tuple(sorted((*replies, *more), key=lambda r: r.call))


def _burst(plan: WorldPlan) -> bool:
    """Whether the plan holds a burst: one reply fault four calls in a row, drawn so that a
    turn meets the loop's bounds on runs of it (LOOP-7, LOOP-8), which a tight bound
    would cut short."""
    kinds = {r.call: r.kind for r in plan.replies}
    return any(all(kinds.get(call + k) is kind for k in range(1, 4))
               for call, kind in kinds.items() if kind in BURST_FAULTS)


def _aliases(seed: int, plan: WorldPlan, steps: list[Step], taken: set[str]) -> dict[str, str]:
    """Turns that read a file and rewrite it under another name of it ("aliases")."""
    rng = _rng(seed, "aliases")
    files = sorted(plan.files)
    if not files or rng.random() >= 0.35:
        return {}
    links: dict[str, str] = {}
    for k in range(rng.randint(1, 2)):
        session, name = rng.choice(sorted(plan.sessions)), rng.choice(files)
        how = rng.choice(("same", "absolute", "link", "dot"))
        alias = {"same": name, "absolute": f"{SIM_ROOT}/{name}", "dot": f"./{name}",
                 "link": f"link-{name}"}[how]
        if how == "link":
            links[alias] = name
        _turn(rng, plan, steps, taken, session, rng.uniform(0.0, 120.0),
              f"Read {name} and rewrite it as note {70 + k} at {alias}.")
    return links


def _folders(seed: int, plan: WorldPlan, steps: list[Step], taken: set[str]) -> bool:
    """A turn that writes a note into a folder and searches that folder in the same round
    ("folders"); True when it added one."""
    return _one_more_turn(seed, "folders", plan, steps, taken, 80,
                          "Write note {note} to drafts/{session}-{note}.txt and search drafts "
                          "for it.")


def _retries(seed: int, plan: WorldPlan, steps: list[Step], taken: set[str]) -> bool:
    """A turn whose patch of a missing file fails and whose write of it, under the other
    spelling of its path, succeeds ("retries"); True when it added one."""
    return _one_more_turn(seed, "retries", plan, steps, taken, 90,
                          "Patch note {note} into drafts/{session}-{note}.txt, or write it there.")


def _one_more_turn(seed: int, part: str, plan: WorldPlan, steps: list[Step], taken: set[str],
                   first_note: int, text: str) -> bool:
    """In a world in five, one more turn of ``part``'s text in a session drawn from the
    part's own sub-stream, its note numbered ``first_note`` to ``first_note + 9``."""
    rng = _rng(seed, part)
    if not plan.sessions or rng.random() >= 0.2:
        return False
    session = rng.choice(sorted(plan.sessions))
    note = first_note + rng.randint(0, 9)
    _turn(rng, plan, steps, taken, session, rng.uniform(0.0, 120.0),
          text.format(note=note, session=session))
    return True


def _steers(seed: int, plan: WorldPlan, steps: list[Step], taken: set[str]) -> bool:
    """In a world in three with a member bound to a session, that member asks to steer the
    session, which only its owner or an operator may: the door refuses it (ADM-2)
    ("steers"); True when it added one."""
    rng = _rng(seed, "steers")
    if not plan.members or rng.random() >= 1 / 3:
        return False
    member = rng.choice(sorted(plan.members))
    steps.append(Submit(at_s=round(rng.uniform(0.0, 120.0), 1),
                        process=rng.randrange(plan.processes), principal=member,
                        session=plan.members[member], request_id=seeded_id(rng, "r-", taken),
                        text=f"Say hello {rng.randint(10, 99)} from {member}, now.",
                        intent="steer"))
    return True


INTERNAL_KINDS = ("background", "cron", "subagent")


def _internal(seed: int, plan: WorldPlan, steps: list[Step]) -> bool:
    """In a world in eight, a session's owner, bound as a user, hands the door an internal
    event (a background completion, a cron tick or a subagent report) under that kind:
    only a principal bound as that kind may, so the door refuses it (ADM-2) ("internal");
    True when it added one."""
    rng = _rng(seed, "internal")
    if not plan.sessions or rng.random() >= 0.125:
        return False
    session = rng.choice(sorted(plan.sessions))
    kind = rng.choice(INTERNAL_KINDS)
    event = seeded_id(rng, "e-", set())
    steps.append(Submit(at_s=round(rng.uniform(0.0, 120.0), 1),
                        process=rng.randrange(plan.processes), principal=plan.sessions[session],
                        session=session, request_id=f"{kind}:{event}",
                        text=f"Say hello {rng.randint(10, 99)}: the {kind} job is done.",
                        kind=kind))
    return True


def _stops(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan,
           steps: list[Step]) -> float | None:
    """In a world in four with a small window, every summary arrives 30, 90 or 180 s late
    and the user stops one to three running turns, at times in the first 400 s, so a stop
    may land while a turn's preflight waits on its summary: the turn sent nothing and must
    get back the budget unit the loop spent for the iteration (CTX-1, LOOP-2) ("stops").
    Returns the summaries' delay."""
    rng = _rng(seed, "stops")
    if plan.context_window is None or FaultKind.INTERRUPT not in kinds or rng.random() >= 0.25:
        return None
    delay = float(rng.choice((30, 90, 180)))
    sessions = sorted(plan.sessions) + list(plan.terminals)
    for _ in range(rng.randint(1, 3)):
        steps.append(Interrupt(at_s=round(rng.uniform(0.0, 400.0), 1),
                               session=rng.choice(sessions)))
    return delay


def _timeouts(seed: int, kinds: frozenset[FaultKind], window: int | None,
              failures: tuple[int, ...]) -> tuple[int, ...]:
    """In a world in three with a small window, the first or second summary request that
    does not fail with a 503 times out instead: a timeout starts the cooldown as a failure
    does (CMP-4) ("timeouts")."""
    rng = _rng(seed, "timeouts")
    if window is None or FaultKind.SUMMARY_FAILURE not in kinds or rng.random() >= 1 / 3:
        return ()
    free = [n for n in range(1, 5) if n not in failures]
    return (free[rng.randint(0, 1)],)


def _spills(seed: int, kinds: frozenset[FaultKind],
            replies: tuple[ReplyFault, ...]) -> tuple[tuple[ReplyFault, ...], bool]:
    """In a world in ten, two reads of the huge log, at calls 1-6 and 2-12 calls later, under
    one call id, as a provider that numbers calls per request sends them: each output is
    spilled to a file of its own, the later one never finding its name taken (TOOL-7)
    ("spills"). Returns the replies and whether the huge reads share their id."""
    rng = _rng(seed, "spills")
    if FaultKind.HUGE_READ not in kinds or rng.random() >= 0.1:
        return replies, False
    taken = {r.call for r in replies}
    first = rng.randint(1, 6)
    later = first + rng.randint(2, 12)
    more = [ReplyFault(call=c, kind=FaultKind.HUGE_READ) for c in (first, later) if c not in taken]
    return tuple(sorted((*replies, *more), key=lambda r: r.call)), bool(more)


def _admits(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan) -> dict[str, Any]:
    """In a world in eight, the store refuses the door's first admission write: the door
    must refuse the submission, never acknowledge it (ADM-1) ("admits"). Returns the plan
    fields it sets."""
    rng = _rng(seed, "admits")
    if FaultKind.WRITE_FAILURE not in kinds or not plan.sessions or rng.random() >= 0.125:
        return {}
    return {"write_failures": {**plan.write_failures, Site.ADMIT: 1}}


def _returns(seed: int, plan: WorldPlan, steps: list[Step], taken: set[str]) -> None:
    """A user comes back after the workload, soon or after a pause, and half the time
    asks again what they asked first ("returns")."""
    rng = _rng(seed, "returns")
    for session in sorted(plan.sessions):
        if rng.random() >= 0.4:
            continue
        mine = sorted((s for s in steps if isinstance(s, Submit) and s.session == session
                       and s.principal == plan.sessions[session]), key=lambda s: s.at_s)
        if not mine:
            continue
        pause = rng.uniform(5.0, 60.0) if rng.random() < 0.5 else rng.uniform(300.0, 1500.0)
        again = rng.random() < 0.5
        text = mine[0].text if again else f"Say hello {rng.randint(30, 69)}."
        _turn(rng, plan, steps, taken, session, mine[-1].at_s + 30.0 + pause, text)


def _chores(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan, steps: list[Step],
            taken: set[str]) -> tuple[dict[str, str], int | None]:
    """In a world in four, a session opens with a long chore, one read a round, and half
    the time its user asks for the same chore again later ("chores"); a one-process world
    without a small window then gets one of 500-700 tokens, which a chore fills halfway
    through. Returns the files and the window."""
    rng = _rng(seed, "chores")
    if rng.random() >= 0.25:
        return dict(plan.files), plan.context_window
    session, parts = rng.choice(sorted(plan.sessions)), rng.randint(6, 10)
    text = f"Go through part-1.txt to part-{parts}.txt in order."
    mine = [s.at_s for s in steps if isinstance(s, Submit) and s.session == session]
    _turn(rng, plan, steps, taken, session, rng.uniform(0.0, min(mine, default=10.0)), text)
    if rng.random() < 0.5:
        _turn(rng, plan, steps, taken, session, max(mine, default=0.0) + rng.uniform(5.0, 90.0),
              text)
    window = plan.context_window
    if window is None and plan.processes == 1 and FaultKind.SMALL_WINDOW in kinds:
        window = rng.choice((500, 600, 700))
    return {**plan.files, **{f"part-{k}.txt": f"part {k} of seed {seed}: in order"
                             for k in range(1, parts + 1)}}, window


def _contention(seed: int, kinds: frozenset[FaultKind], plan: WorldPlan, steps: list[Step],
                window: int | None) -> tuple[int | None, float | None, float | None]:
    """In a world in four of several processes with a terminal that waits the whole lease
    wait, the terminal's user types on (4-8 more turns, 0.2-10 s apart, from any process)
    into a window of 400, 500 or 600 tokens, so the session compacts while turns wait in
    line for it; the first holder granted its compression lock freezes right after, for 400
    or 600 s, and the lock lasts 900 s. The frozen holder's lease lapses meanwhile, the next
    turn in line takes the session and compacts too, and must find the lock still held
    (CMP-6) ("contention"). Returns the window, the freeze and the lock's ttl."""
    rng = _rng(seed, "contention")
    if not {FaultKind.LOCK_STALL, FaultKind.SMALL_WINDOW} <= kinds or plan.processes < 2 \
            or not plan.terminals \
            or plan.lease_wait_s is not None or window is not None or rng.random() >= 0.25:
        return window, None, None
    session = plan.terminals[0]
    mine = [s for s in steps if isinstance(s, Direct) and s.session == session]
    at = max(s.at_s for s in mine)
    for n in range(len(mine) + 1, len(mine) + 1 + rng.randint(4, 8)):
        at = round(at + rng.uniform(0.2, 10.0), 1)
        steps.append(Direct(at_s=at, process=rng.randrange(plan.processes), session=session,
                            text=turn_text(rng, session, n, sorted(plan.files))))
    return rng.choice((400, 500, 600)), float(rng.choice((400, 600))), LOCK_TTL_S


def _handover(seed: int, plan: WorldPlan, steps: list[Step]) -> None:
    """In a world in four, a conversation brought in from elsewhere: a caller hands a
    process a turn of a session of its own (``h-1``, nobody bound to it) with its history,
    and later hands it one or two more turns with that history grown ("handover")."""
    rng = _rng(seed, "handover")
    if rng.random() >= 0.25:
        return
    at, exchanges = rng.uniform(0.0, 120.0), rng.randint(1, 4)
    for k in range(rng.randint(1, 3)):
        steps.append(Handover(at_s=round(at, 1), process=rng.randrange(plan.processes),
                              into="h-1", text=f"Say hello {80 + k}.", history=exchanges + k))
        at += rng.uniform(5.0, 60.0)


def handed_history(exchanges: int) -> list[Message]:
    """The history a caller hands over: ``exchanges`` questions and answers, a new list."""
    rows: list[Message] = []
    for k in range(1, exchanges + 1):
        rows += [Message(role=Role.USER, content=f"Earlier question {k}."),
                 Message(role=Role.ASSISTANT, content=f"Earlier answer {k}.")]
    return rows


def _pressure(seed: int, kinds: frozenset[FaultKind],
              plan: WorldPlan) -> tuple[float | None, tuple[int, ...]]:
    """Idle compaction and failed summaries, in worlds with a small window ("pressure")."""
    rng = _rng(seed, "pressure")
    if plan.context_window is None:
        return None, ()
    idle = rng.choice(LATER) if rng.random() < 0.5 else None
    failures: tuple[int, ...] = ()
    if FaultKind.SUMMARY_FAILURE in kinds and rng.random() < 0.6:
        failures = tuple(sorted(rng.sample(range(1, 4), rng.choice((1, 2)))))
    return idle, failures


def _refused_writes(seed: int, kinds: frozenset[FaultKind],
                    plan: WorldPlan) -> tuple[ReplyFault, ...]:
    """A write the tool refuses, at one model call of the faulty phase ("writes")."""
    rng = _rng(seed, "writes")
    turns = sum(1 for s in plan.steps if isinstance(s, Submit))
    if FaultKind.REFUSED_WRITE not in kinds or rng.random() >= 0.25 or not turns:
        return plan.replies
    call = rng.randint(1, 2 * turns)
    if any(r.call == call for r in plan.replies):
        return plan.replies
    fault = ReplyFault(call=call, kind=FaultKind.REFUSED_WRITE)
    return tuple(sorted((*plan.replies, fault), key=lambda r: r.call))


# ---- the model's side ------------------------------------------------------------------------


def rewrite_round(asked: str) -> tuple[tuple[str, dict[str, Any]], ...] | None:
    """The round a rewrite request asks for: the read, then the write under the alias."""
    found = REWRITE.match(asked)
    if found is None:
        return None
    return (("read_file", {"path": found.group(1)}),
            ("write_file", {"path": found.group(3), "content": f"note {found.group(2)}"}))


def folder_round(asked: str) -> tuple[tuple[str, dict[str, Any]], ...] | None:
    """The round a folder request asks for: the write into the folder, then the search of
    the folder (the writer first, its path inside the reader's)."""
    found = FOLDER.match(asked)
    if found is None:
        return None
    note, folder, name, searched = found.groups()
    return (("write_file", {"path": f"{folder}/{name}", "content": f"note {note}"}),
            ("search_files", {"pattern": f"note {note}", "path": searched}))


def retry_round(asked: str, since: tuple[Message, ...]) -> tuple[str, dict[str, Any]] | None:
    """The next call of a retry request: the patch (through ``./``, of a file that is not
    there: it fails), then the write under the plain path; None when both were made."""
    found = RETRY.match(asked)
    if found is None:
        return None
    note, path = found.groups()
    made = {call.name for message in since for call in message.tool_calls}
    if "patch" not in made:
        return ("patch", {"path": f"./{path}", "old_string": "note 0", "new_string": f"note {note}"})
    if "write_file" not in made:
        return ("write_file", {"path": path, "content": f"note {note}"})
    return None


def chore_round(asked: str, since: tuple[Message, ...]) -> tuple[str, dict[str, Any]] | None:
    """The next read of a chore: the part after the highest one read since it was asked
    (a compaction may have summarized earlier rounds, never the latest), or None when done."""
    found = CHORE.match(asked)
    if found is None:
        return None
    read = [int(m.group(1)) for message in since for call in message.tool_calls
            if (m := PART.search(call.arguments)) is not None]
    after = max(read, default=0)
    return None if after >= int(found.group(1)) else ("read_file", {"path": f"part-{after + 1}.txt"})


def check_round(messages: tuple[Message, ...]) -> tuple[str, dict[str, Any]] | None:
    """Asked by the verification gate to check its work, the model reads the file it last
    wrote; None when the request is no such ask."""
    if not messages or messages[-1].content != PRE_VERIFY_NUDGE:
        return None
    written = [PATH.search(c.arguments) for m in messages for c in m.tool_calls
               if c.name == "write_file"]
    paths = [w.group(1) for w in written if w is not None]
    return ("read_file", {"path": paths[-1]}) if paths else None


def refused_write() -> tuple[str, dict[str, Any]]:
    return ("write_file", {"path": REFUSED_PATH, "content": "draft"})


class FlakySummarizer(Summarizer):
    """The world's summarizer, but the n-th summary requests of the faulty phase fail (503),
    or, those of ``timing_out``, time out.

    Given the world's clock as ``stumble_on``, it also fails (503) a request asked in the
    very instant its last late summary arrived (``delay_s``): the pass that follows a slow
    pass in one preflight (``sim/explore/cooldown.py``)."""

    def __init__(self, failing: tuple[int, ...], model: object,
                 timing_out: tuple[int, ...] = (), *, stumble_on: Clock | None = None) -> None:
        super().__init__()
        self._failing = set(failing)
        self._timing_out = set(timing_out)
        self._model = model  # its ``calm`` flag disarms the failures
        self._clock = stumble_on
        self._late_at: float | None = None  # when the last late summary arrives
        self.asked = 0
        self.failed = 0
        self.stumbled = 0

    def complete(self, request: ProviderRequest) -> ProviderReply:
        self.asked += 1
        calm = getattr(self._model, "calm", False)
        if self._clock is not None and self._clock.now() == self._late_at and not calm:
            self.stumbled += 1  # apart from ``failed``: the numbered failures' coverage
            self.requests.append(request)
            raise ProviderServerError(f"503 at summary request {self.asked}: the summarizer "
                                      "fell over after its slow answer", status=503)
        if self.asked in self._failing and not calm:
            self.failed += 1
            self.requests.append(request)
            raise ProviderServerError(f"503 at summary request {self.asked}: summarizer "
                                      "unavailable", status=503)
        if self.asked in self._timing_out and not calm:
            self.failed += 1
            self.requests.append(request)
            raise ProviderTimeout(f"summary request {self.asked} timed out")
        reply = super().complete(request)
        if self._clock is not None and self.delay_s > 0:
            self._late_at = self._clock.now() + self.delay_s  # as the scheduler wakes the caller
        return reply


# ---- staging, firing, rendering, shrinking ---------------------------------------------------


def stage(story: Story, plan: WorldPlan) -> None:
    """The limits, symlinks and summarizer of these parts, as ``render_options`` writes them."""
    limits = _limits(plan)
    if limits:
        story.limits(**limits)
    if plan.symlinks:
        story.symlinks(dict(plan.symlinks))
    if plan.summary_failures or plan.summary_timeouts or plan.summary_stumbles:
        model = story.world.provider
        model.summarizer = FlakySummarizer(  # type: ignore[attr-defined]
            plan.summary_failures, model, plan.summary_timeouts,
            stumble_on=story.world.clock if plan.summary_stumbles else None)
    if plan.summary_delay_s is not None:
        story.world.provider.summarizer.delay_s = plan.summary_delay_s  # type: ignore[attr-defined]
    if plan.lock_stall_s is not None and plan.terminals:
        story.world.lock_stalls[plan.terminals[0]] = plan.lock_stall_s


def _limits(plan: WorldPlan) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if plan.iteration_budget is not None:
        limits["iteration_budget"] = plan.iteration_budget
    if not plan.grace_call:
        limits["grace_call_enabled"] = False
    if plan.idle_compact_after_s is not None:
        limits["idle_compact_after_s"] = plan.idle_compact_after_s
    if plan.compression_lock_ttl_s is not None:
        limits["compression_lock_ttl_s"] = plan.compression_lock_ttl_s
    if plan.errors_max is not None:
        limits["outer_loop_errors_max"] = plan.errors_max
    return limits


def fired(world: World, plan: WorldPlan) -> set[FaultKind]:
    """A summary request that failed in the faulty phase; a holder that froze holding the
    terminal's compression lock. What the faulty phase did not reach is disarmed."""
    out = set()
    summarizer = getattr(world.provider, "summarizer", None)
    if (plan.summary_failures or plan.summary_timeouts) \
            and isinstance(summarizer, FlakySummarizer) and summarizer.failed:
        out.add(FaultKind.SUMMARY_FAILURE)
    if plan.lock_stall_s is not None and plan.terminals \
            and plan.terminals[0] not in world.lock_stalls:
        out.add(FaultKind.LOCK_STALL)
    world.lock_stalls.clear()  # a freeze the faulty phase did not reach is no fault of the calm
    return out


def render_imports(plan: WorldPlan) -> list[str]:
    flaky = plan.summary_failures or plan.summary_timeouts or plan.summary_stumbles
    names = (["FlakySummarizer"] if flaky else []) + (
        ["handed_history"] if any(isinstance(s, Handover) for s in plan.steps) else [])
    return [f"from sim.explore.edges import {', '.join(names)}"] if names else []


def render_options(plan: WorldPlan) -> list[str]:
    """``stage``'s calls as scenario lines."""
    lines = []
    limits = _limits(plan)
    if limits:
        lines.append("s.limits(" + ", ".join(f"{k}={v!r}" for k, v in limits.items()) + ")")
    if plan.symlinks:
        lines.append(f"s.symlinks({dict(plan.symlinks)!r})")
    if plan.summary_stumbles:
        lines.append(f"model.summarizer = FlakySummarizer({plan.summary_failures!r}, model, "
                     f"{plan.summary_timeouts!r}, stumble_on=s.world.clock)"
                     "  # and a summary asked as a late one arrives fails")
    elif plan.summary_timeouts:
        lines.append(f"model.summarizer = FlakySummarizer({plan.summary_failures!r}, model, "
                     f"{plan.summary_timeouts!r})  # these summary requests fail, time out")
    elif plan.summary_failures:
        lines.append(f"model.summarizer = FlakySummarizer({plan.summary_failures!r}, model)"
                     "  # these summary requests fail")
    if plan.summary_delay_s is not None:
        lines.append(f"model.summarizer.delay_s = {plan.summary_delay_s!r}"
                     "  # every summary arrives this late")
    if plan.lock_stall_s is not None and plan.terminals:
        lines.append(f"s.world.lock_stalls[{plan.terminals[0]!r}] = {plan.lock_stall_s!r}"
                     "  # its lock's first holder freezes")
    return lines


def simpler(plan: WorldPlan) -> Iterator[WorldPlan]:
    """The shrinker's edits of these parts: each option off, one failed summary fewer."""
    for option, off in (("iteration_budget", None), ("grace_call", True),
                        ("idle_compact_after_s", None), ("symlinks", {}),
                        ("huge_reads_share_id", False), ("summary_delay_s", None)):
        if getattr(plan, option) != off:
            yield plan.model_copy(update={option: off})
    for n in plan.summary_failures:
        yield plan.model_copy(update={"summary_failures": tuple(
            f for f in plan.summary_failures if f != n)})
    if plan.summary_timeouts:
        yield plan.model_copy(update={"summary_timeouts": ()})
    if plan.grace_outages:
        yield plan.model_copy(update={"grace_outages": ()})
    for option in ("lock_stall_s", "compression_lock_ttl_s", "errors_max"):
        if getattr(plan, option) is not None:
            yield plan.model_copy(update={option: None})
