"""Checkers of the turn lease: who may act for a session, for how long, and in what order.

Theory of operation
-------------------
The store keeps every grant (``DurableRecord.lease_grants``: token, holder, span, how it
ended); the provider's call log and the tool ledger say when each turn called out; the
world's lease log (``Observation.lease_log``) says when each holder's refresher started,
refreshed, stopped, and when a lease was asked for and refused. From those, and never
from what the engine says of itself:

* LEASE-1: a turn calls the model or runs a tool only after it was granted its session's
  lease (a turn that goes ahead without it is the "fail open" bug); grants of one session
  never overlap.
* LEASE-2: every grant's holder names pid, pid namespace, turn and platform; while a turn
  holds its lease, refreshes come at least every ``lease_refresh_s`` (across a rotation
  too: the child's grant goes on from the parent's last refresh), and each grant or
  refresh runs ``lease_ttl_s``; a turn gives up waiting only after ``lease_wait_s_max``.
* LEASE-3: a lease is taken only when it is free, expired or its holder is dead; a dead
  holder's lease is not left standing in a waiter's way.
* LEASE-4: nothing a turn does happens after its grant stopped being live.
* LEASE-6: a holder's refresher is stopped before its lease is released, and no refresh
  follows the release.
* CTX-9: a turn that starts while the previous turn of its session has not made its final
  persist records a warning naming both turns.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise

from hermes_ref.models import EventKind, Message, Role
from hermes_ref.ports import LeaseGrantRow
from sim.checkers import lineage
from sim.checkers.base import EPSILON_S, Observation, Violation, checker
from sim.checkers.rules import holder_fields
from sim.world import LeaseStep

HOLDER_FIELDS = ("pid", "pidns", "turn", "platform")


@dataclass(frozen=True)
class Activity:
    """One thing a turn did outside itself: a model call or a tool run, and when."""

    session_id: str
    turn_id: str
    at: float
    what: str


@lru_cache(maxsize=4096)  # a holder string's fields never change; every step reads them again
def _turn_of(holder: str) -> str | None:
    return holder_fields(holder).get("turn")


def grants_by_turn(obs: Observation) -> dict[tuple[str, str], list[LeaseGrantRow]]:
    found: dict[tuple[str, str], list[LeaseGrantRow]] = defaultdict(list)
    for grant in obs.record.lease_grants:
        turn = _turn_of(grant.holder)
        if turn is not None:
            found[(grant.session_id, turn)].append(grant)
    return found


def activities(obs: Observation) -> list[Activity]:
    """Every model call (the provider's log) and tool run (the ledger) with its turn (read
    once per observation: three checkers ask)."""
    found: list[Activity] = obs.reading("lease activities", lambda: _activities(obs))
    return list(found)


def _activities(obs: Observation) -> list[Activity]:
    found = [Activity(c.session_id, c.turn_id, c.at, f"model call at effect {c.seq}")
             for c in obs.calls if c.turn_id]
    # call ids repeat across turns: a run belongs to the latest row of its id that was
    # committed when it ran (the ledger records the committed high-water mark)
    owners: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for stored in obs.record.messages:
        message = stored.message
        for call in message.tool_calls:
            if message.turn_id is not None:
                owners[call.id].append((message.row_id or 0, stored.session_id, message.turn_id))
    for entry in obs.ledger:
        rows = [o for o in owners.get(entry.call_id, []) if o[0] <= entry.watermark]
        if rows:
            _, session_id, turn_id = max(rows)
            found.append(Activity(session_id, turn_id, entry.at, f"tool {entry.name} "
                                  f"({entry.call_id})"))
    return found


def lost_leases(obs: Observation) -> set[tuple[str, str]]:
    """(session, turn) of every turn whose lease the world saw go: a refresh that failed,
    or a grant that ended by expiry or a dead holder's reclaim instead of its release. A
    lease of a rotated child names the turn under the lineage's root too, as ``obs.turns``
    keys it.

    Four checkers ask after every step, so the answer is kept with the observation (as its
    cached properties are)."""
    cached: set[tuple[str, str]] | None = obs.__dict__.get("_lost_leases")
    if cached is not None:
        return cached
    lost: set[tuple[str, str]] = set()
    for step in obs.lease_log or ():
        turn = _turn_of(step.holder)
        if step.what in ("refresh_failed", "interrupted") and turn is not None:
            lost.add((step.session_id, turn))
    for grant in obs.record.lease_grants:
        turn = _turn_of(grant.holder)
        if turn is not None and grant.end_reason in ("expired", "holder_dead"):
            lost.add((grant.session_id, turn))
    root = lineage.roots(obs.record)  # a rotated turn is one turn, named by its root (CMP-5)
    lost |= {(root[s], t) for s, t in lost if s in root}
    obs.__dict__["_lost_leases"] = lost
    return lost


def _grant_at(grants: list[LeaseGrantRow], at: float) -> LeaseGrantRow | None:
    """The turn's latest grant acquired no later than ``at``."""
    held = [g for g in grants if g.acquired_at <= at + EPSILON_S]
    return max(held, key=lambda g: g.acquired_at) if held else None


def successive_grants(obs: Observation) -> list[tuple[str, LeaseGrantRow, LeaseGrantRow]]:
    """(session, grant, the grant that replaced it) for every session, in token order."""
    by_session: dict[str, list[LeaseGrantRow]] = defaultdict(list)
    for grant in obs.record.lease_grants:
        by_session[grant.session_id].append(grant)
    return [(session_id, before, after) for session_id, rows in by_session.items()
            for before, after in pairwise(sorted(rows, key=lambda g: g.token))]


@dataclass(frozen=True)
class Asks:
    """Each asker's asks (and grant) and last ask of each line, from the lease log, with
    what ends a place in line: leaving it, the asker's death, two polls unasked.

    A line is a lineage's (LEASE-1 per compression lineage root): the steps are filed
    under the root of the session they name, so a turn that asked for a rotated parent
    and one that asked for its child wait in one line, as the lease they wait for is one
    (CMP-5: a rotation carries the lease and its waiters to the child)."""

    steps: list[LeaseStep]  # each filed under its line: ``session_id`` is the lineage root
    asked: dict[tuple[str, str], list[LeaseStep]]
    last: dict[tuple[str, str], int]
    left: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # seqs it gave up at
    died: dict[int, int] = field(default_factory=dict)  # pid -> effect count at its death
    lapse_s: float = 0.0
    root: dict[str, str] = field(default_factory=dict)  # a rotated session -> its lineage root

    @classmethod
    def of(cls, obs: Observation) -> Asks:
        root = lineage.roots(obs.record)
        steps = [_in_line(s, root) for s in obs.lease_log or () if s.what in ("busy", "granted")]
        asked: dict[tuple[str, str], list[LeaseStep]] = defaultdict(list)
        last: dict[tuple[str, str], int] = {}
        for step in steps:
            asked[(step.session_id, step.holder)].append(step)
            last[(step.session_id, step.holder)] = step.seq
        left: dict[tuple[str, str], list[int]] = defaultdict(list)
        for step in _steps(obs, "left"):
            left[(root.get(step.session_id, step.session_id), step.holder)].append(step.seq)
        return cls(steps, dict(asked), last, dict(left), dict(obs.death_seqs),
                   2 * obs.limits.lease_poll_s, root)

    def line(self, session_id: str) -> str:
        """The line an ask for ``session_id`` waits in: its lineage root's."""
        return self.root.get(session_id, session_id)

    def someone_ahead(self, ask: LeaseStep) -> bool:
        """Was another turn still waiting for the session whose present place in line came
        before that of ``ask``'s asker? Places are ranked as LEASE-1's checker ranks them
        (see ``_place``): an asker that went two polls without asking lost its place and
        rejoined at the end, so a turn that first asked after it may be ahead of it now.
        The other had not given up: it asks again after this one, or it was still in line
        when this one asked (see ``_still_in_line``)."""
        line = self.line(ask.session_id)
        mine = self.place(line, ask.holder, ask.seq)
        return any(self.place(*key, ask.seq) < mine
                   and (self.last[key] > ask.seq or self._still_in_line(key, ask))
                   for key in self.asked
                   if key[0] == line and key[1] != ask.holder)

    def place(self, line: str, holder: str, seq: int) -> int:
        """The effect count of the ask that gave ``holder`` its place in line at ``seq``."""
        return _place(self.asked[(line, holder)], seq, self.lapse_s).seq

    def _still_in_line(self, key: tuple[str, str], ask: LeaseStep) -> bool:
        """A waiter that never asked again may still have held its place when ``ask`` was
        refused, as the store keeps it: its last ask before was refused within two polls, it
        had not left the line since, and its process had not died before ``ask`` (a process
        killed right after ``ask`` never asks again, yet was first in line)."""
        before = [s for s in self.steps if (s.session_id, s.holder) == key and s.seq < ask.seq]
        if not before or before[-1].what != "busy" or ask.at - before[-1].at >= self.lapse_s:
            return False
        if any(before[-1].seq < seq < ask.seq for seq in self.left.get(key, ())):
            return False
        pid = holder_fields(key[1]).get("pid", "")
        died = self.died.get(int(pid)) if pid.isdigit() else None
        return died is None or died > ask.seq


def _in_line(step: LeaseStep, root: dict[str, str]) -> LeaseStep:
    """``step`` filed under its line: the lineage root of the session it names."""
    line = root.get(step.session_id)
    return step if line is None else dataclasses.replace(step, session_id=line)


@checker("turns_hold_their_lease", ("LEASE-1",),
         "a turn calls out only after it was granted its session's lease; grants never overlap")
def turns_hold_their_lease(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    grants = grants_by_turn(obs)
    for act in activities(obs):
        if _grant_at(grants.get((act.session_id, act.turn_id), []), act.at) is None:
            out.append(Violation("turns_hold_their_lease", "LEASE-1",
                                 f"turn {act.turn_id} of {act.session_id} made a {act.what} "
                                 "without ever being granted the session's lease"))
    owned = {(g.session_id, g.token, _turn_of(g.holder)) for g in obs.record.lease_grants}
    for event in obs.events(EventKind.TURN_STARTED):
        token = event.data.get("lease_token")
        if (event.session_id, token, event.turn_id) not in owned:
            out.append(Violation("turns_hold_their_lease", "LEASE-1",
                                 f"turn {event.turn_id} of {event.session_id} started under lease "
                                 f"token {token}, which was never granted to it"))
    for session_id, before, after in successive_grants(obs):
        if after.acquired_at + EPSILON_S < before.live_until():
            out.append(Violation("turns_hold_their_lease", "LEASE-1",
                                 f"{session_id}: token {after.token} was granted at "
                                 f"{after.acquired_at:g} while token {before.token} was "
                                 f"live until {before.live_until():g}"))
    return out


@checker("nothing_after_the_lease_is_lost", ("LEASE-4",),
         "a turn does nothing outside itself once its grant has expired or been replaced")
def nothing_after_the_lease_is_lost(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    grants = grants_by_turn(obs)
    for act in activities(obs):
        grant = _grant_at(grants.get((act.session_id, act.turn_id), []), act.at)
        if grant is not None and _after_loss(grant, act.at):
            ended = grant.end_reason or "expired"
            out.append(Violation("nothing_after_the_lease_is_lost", "LEASE-4",
                                 f"turn {act.turn_id} of {act.session_id} made a {act.what} at "
                                 f"{act.at - grant.acquired_at:g} s into token {grant.token}, "
                                 f"whose grant was live only until "
                                 f"{grant.live_until() - grant.acquired_at:g} s ({ended})"))
    return out


@checker("turn_stops_at_the_loss", ("LEASE-4",),
         "a turn whose refresh failed ends then and there: the loss cuts whatever it waits on "
         "(a model call, a tool batch, a sleep), so its exit line is stamped at the loss")
def turn_stops_at_the_loss(obs: Observation) -> list[Violation]:
    """Judged from the world's lease log (the refresh the store refused, and when) and the
    turn's exit event as logged: a hard interrupt leaves no time between the two. A turn
    with no exit event (its process died) is not judged here."""
    exits = {e.turn_id: e.at for e in obs.events(EventKind.TURN_EXIT) if e.at is not None}
    out: list[Violation] = []
    for step in obs.lease_log or ():
        turn = _turn_of(step.holder)
        if step.what != "refresh_failed" or turn is None or turn not in exits:
            continue
        late = exits[turn] - step.at
        if late > EPSILON_S:
            out.append(Violation("turn_stops_at_the_loss", "LEASE-4",
                                 f"turn {turn} of {step.session_id} lost its lease (token "
                                 f"{step.token}) at {step.at - obs_start(obs):g} s but went on "
                                 f"for {late:g} s before its exit line"))
    return out


def obs_start(obs: Observation) -> float:
    """The earliest time the record shows, so messages give times as the timeline does."""
    times = [g.acquired_at for g in obs.record.lease_grants]
    return min(times, default=0.0)


def _after_loss(grant: LeaseGrantRow, at: float) -> bool:
    """Is ``at`` past the grant's live span? A release ends it after the holder's last act
    (at the same instant is still in time); an expiry ends it at ``expires_at`` itself,
    as the store's fence does."""
    if grant.ended_at is not None and at > grant.ended_at + EPSILON_S:
        return True
    return grant.end_reason != "released" and at >= grant.expires_at - EPSILON_S


def close_of_turn(rows: list[Message]) -> bool:
    """A turn's rows end in its final persist: an assistant row that calls no tool."""
    return bool(rows) and rows[-1].role is Role.ASSISTANT and not rows[-1].tool_calls


@checker("late_start_is_warned", ("CTX-9",),
         "a turn that starts before its predecessor's final persist warns, naming both turns")
def late_start_is_warned(obs: Observation) -> list[Violation]:
    warned = {(e.turn_id, str(e.data.get("previous_turn_id")))
              for e in obs.events(EventKind.TURN_OVERLAP)}
    out: list[Violation] = []
    copied = obs.copied_row_ids  # a compaction's copies: their turns wrote them elsewhere
    root = lineage.roots(obs.record)
    by_lineage: dict[str, list[Message]] = defaultdict(list)
    for stored in lineage.written(obs.record):  # a lineage is one conversation (CMP-5)
        by_lineage[root.get(stored.session_id, stored.session_id)].append(stored.message)
    for session_id, lineage_rows in by_lineage.items():
        order: list[str] = []
        rows: dict[str, list[Message]] = defaultdict(list)
        for message in lineage_rows:
            if message.turn_id is None or message.row_id in copied:
                continue
            if message.turn_id not in rows:
                order.append(message.turn_id)
            if not order or order[-1] == message.turn_id:
                rows[message.turn_id].append(message)
        for previous, turn in pairwise(order):
            if not close_of_turn(rows[previous]) and (turn, previous) not in warned:
                out.append(Violation("late_start_is_warned", "CTX-9",
                                     f"{session_id}: turn {turn} started before turn "
                                     f"{previous} made its final persist, and no warning "
                                     "names both"))
    return out


def _died_first(died_at_seq: int | None, granted_at_seq: int | None) -> bool:
    """Did the death come before the grant, by the world's effect count? With either count
    unknown, the times alone decide (the caller has already compared them)."""
    return died_at_seq is None or granted_at_seq is None or died_at_seq < granted_at_seq


def _carried_to(obs: Observation) -> dict[tuple[str, int], LeaseGrantRow]:
    """For each grant a rotation ended, the grant its lease lives on in at the end of the
    chain: the child's grant of the same holder and token (a child may rotate again).
    Read once per observation (two checkers ask); readers only look it up."""
    found: dict[tuple[str, int], LeaseGrantRow] = obs.reading("carried grants",
                                                              lambda: _read_carried(obs))
    return found


def _read_carried(obs: Observation) -> dict[tuple[str, int], LeaseGrantRow]:
    by_lease: dict[tuple[str, int], list[LeaseGrantRow]] = defaultdict(list)
    for grant in obs.record.lease_grants:
        by_lease[(grant.holder, grant.token)].append(grant)
    out: dict[tuple[str, int], LeaseGrantRow] = {}
    for chain in by_lease.values():
        if len(chain) > 1:
            for grant in chain[:-1]:
                if grant.end_reason == "rotated":
                    out[(grant.session_id, grant.token)] = chain[-1]
    return out


def _death_of(holder: str, deaths: dict[int, float]) -> tuple[str, float | None]:
    """The pid a holder names, and when that simulated process died (None: it did not)."""
    pid = _pid_of(holder)
    return pid, deaths.get(int(pid)) if pid.isdigit() else None


@lru_cache(maxsize=4096)  # a holder string's fields never change (as ``_turn_of``)
def _pid_of(holder: str) -> str:
    return holder_fields(holder).get("pid", "")


def _steps(obs: Observation, what: str) -> list[LeaseStep]:
    """The lease log's steps of one kind, in log order."""
    return list(_steps_by_what(obs).get(what, ()))


def _steps_by_what(obs: Observation) -> dict[str, list[LeaseStep]]:
    """The lease log grouped by kind, in log order: read once per observation and shared
    (the lease checkers ask for one kind or another a dozen times a check)."""
    def read() -> dict[str, list[LeaseStep]]:
        grouped: dict[str, list[LeaseStep]] = defaultdict(list)
        for step in obs.lease_log or ():
            grouped[step.what].append(step)
        return grouped
    found: dict[str, list[LeaseStep]] = obs.reading("lease steps by kind", read)
    return found


@checker("lease_kept_alive", ("LEASE-2",),
         "every holder names pid, pid namespace, turn and platform; a held lease is "
         "refreshed at least every lease_refresh_s until its refresher stops, each grant and "
         "refresh for lease_ttl_s; a turn gives up on a busy lease only after lease_wait_s_max")
def lease_kept_alive(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for grant in obs.record.lease_grants:
        fields = holder_fields(grant.holder)
        missing = [f for f in HOLDER_FIELDS if not fields.get(f)]
        if missing:
            out.append(Violation("lease_kept_alive", "LEASE-2",
                                 f"{grant.session_id} token {grant.token}: holder "
                                 f"{grant.holder!r} does not name {', '.join(missing)}"))
    if obs.lease_log is None:
        return out
    interval = obs.limits.lease_refresh_s
    deaths = dict(obs.deaths)
    started = {(s.session_id, s.token) for s in _steps(obs, "refresher_started")}
    acting = {(a.session_id, a.turn_id) for a in activities(obs)}
    stopped_at, refreshed_at = _times_by_lease(obs, "refresher_stopped"), \
        _times_by_lease(obs, "refreshed")
    carried_beat = _carried_beats(obs, refreshed_at)
    for grant in obs.record.lease_grants:
        key = (grant.session_id, grant.token)
        if key not in started and (grant.session_id, _turn_of(grant.holder)) not in acting:
            continue  # no turn ran under it (a lease taken by hand): nothing to keep alive
        stops = stopped_at.get(key, [])
        pid, died = _death_of(grant.holder, deaths)
        held_until = min([*stops, grant.live_until(), *([died] if died is not None else [])])
        first = carried_beat.get(key, grant.acquired_at)
        if held_until - first <= interval + EPSILON_S:
            continue  # held no longer than one refresh interval: nothing was due
        beats = [first, *sorted(refreshed_at.get(key, ())), held_until]
        stalled = [(a, b) for p, a, b in obs.stalls if str(p) == pid]
        gaps = [b - a for a, b in pairwise(beats)
                if not any(start < b and a < until for start, until in stalled)]
        gap = max(gaps, default=0.0)  # a gap its process spent stalled is not the engine's
        if gap > interval + EPSILON_S:
            out.append(Violation("lease_kept_alive", "LEASE-2",
                                 f"{grant.session_id} token {grant.token} ({grant.holder}) went "
                                 f"{gap:g} s without a refresh (every {interval:g} s is due)"))
    out.extend(_short_grants(obs))
    out.extend(_waits_cut_short(obs))
    return out


def _carried_beats(obs: Observation,
                   refreshed_at: dict[tuple[str, int], list[float]]) -> dict[tuple[str, int], float]:
    """For each grant a rotation carried the lease into, the last beat (grant or refresh) of
    the grant it came from. A rotation moves the lease whole, expiry included (LEASE-1 per
    lineage, CMP-5): the child's grant goes on with the same lease, so its first refresh is
    due an interval after the parent's last beat, not an interval after the carry."""
    chains: dict[tuple[str, int], list[LeaseGrantRow]] = defaultdict(list)
    for grant in obs.record.lease_grants:
        chains[(grant.holder, grant.token)].append(grant)
    beats: dict[tuple[str, int], float] = {}
    for chain in chains.values():
        for parent, child in pairwise(chain):
            if parent.end_reason == "rotated":
                key = (parent.session_id, parent.token)
                last = max([beats.get(key, parent.acquired_at), *refreshed_at.get(key, ())])
                beats[(child.session_id, child.token)] = last
    return beats


def _times_by_lease(obs: Observation, what: str) -> dict[tuple[str, int], list[float]]:
    """When each lease (session, token) saw a step of kind ``what``, in log order."""
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    for step in _steps(obs, what):
        times[(step.session_id, step.token)].append(step.at)
    return times


def _short_grants(obs: Observation) -> list[Violation]:
    """Each grant and each refresh runs ``lease_ttl_s`` from its own instant: the grant's
    stored expiry is its last beat (its acquisition or the last refresh the world saw)
    plus the TTL. A refresh reads the clock just before it writes, so the expiry may lag
    the logged beat a little, never by a whole refresh interval."""
    out: list[Violation] = []
    ttl, slack = obs.limits.lease_ttl_s, obs.limits.lease_refresh_s
    carried = {(g.session_id, g.token) for g in obs.record.lease_grants
               if g.end_reason == "rotated"}
    children = {c.session_id: c.child_id for c in obs.record.compactions if c.child_id}
    inherited = {(children[s], t) for s, t in carried if s in children}
    refreshed: dict[tuple[str, int], float] = {}
    for step in _steps(obs, "refreshed"):
        key = (step.session_id, step.token)
        refreshed[key] = max(refreshed.get(key, step.at), step.at)
    for grant in obs.record.lease_grants:
        key = (grant.session_id, grant.token)
        if key in carried:
            continue  # its expiry went on in the child's grant (CMP-5)
        if key in inherited and key not in refreshed:
            continue  # the child's grant began with the parent's expiry, carried over (CMP-5)
        beat = max(grant.acquired_at, refreshed.get(key, grant.acquired_at))
        if grant.expires_at < beat + ttl - slack - EPSILON_S:
            out.append(Violation("lease_kept_alive", "LEASE-2",
                                 f"{grant.session_id} token {grant.token} was last granted or "
                                 f"refreshed at {beat - grant.acquired_at:g} s and expires "
                                 f"{grant.expires_at - beat:g} s later (the TTL is {ttl:g} s)"))
    return out


def _waits_cut_short(obs: Observation) -> list[Violation]:
    """A turn that gave up on a busy lease (``session_turn_lease_timeout``) waited the whole
    ``lease_wait_s_max`` from its first ask (less one poll: the ask may lag the turn's
    start), as the world's lease log shows: a turn that gives up sooner refuses a user who
    was promised the wait. (How much longer it may wait is not judged here: a clock jump or
    a frozen process stretches any wait.)"""
    out: list[Violation] = []
    first: dict[tuple[str, str], float] = {}
    for step in obs.lease_log or ():
        turn = _turn_of(step.holder)
        if step.what in ("busy", "granted") and turn is not None:
            first.setdefault((step.session_id, turn), step.at)
    wait = obs.limits.lease_wait_s_max - obs.limits.lease_poll_s  # its first ask may lag
    for event in obs.events(EventKind.TURN_EXIT):
        if event.data.get("reason") != "session_turn_lease_timeout" or event.at is None:
            continue
        began = first.get((event.session_id, event.turn_id))
        if began is None:
            continue
        waited = event.at - began
        if waited < wait - EPSILON_S:
            out.append(Violation("lease_kept_alive", "LEASE-2",
                                 f"turn {event.turn_id} of {event.session_id} gave up on the "
                                 f"lease {waited:g} s after it first asked (the wait "
                                 f"is {obs.limits.lease_wait_s_max:g} s)"))
    return out


@checker("dead_holders_do_not_block", ("LEASE-3",),
         "a lease is taken only when released, expired or its holder is dead, and refused "
         "only while its holder is alive and its grant unexpired")
def dead_holders_do_not_block(obs: Observation) -> list[Violation]:
    deaths = dict(obs.deaths)
    out: list[Violation] = []
    granted_at = {(s.session_id, s.token): s.seq for s in _steps(obs, "granted")}
    asks = Asks.of(obs)
    blocked: dict[tuple[str, str], list[str]] = defaultdict(list)
    root = lineage.roots(obs.record)  # CMP-5: an ask for a rotated session waits on its tip
    grants_of: dict[str, list[LeaseGrantRow]] = defaultdict(list)  # by lineage, record order
    for g in obs.record.lease_grants:
        grants_of[root.get(g.session_id, g.session_id)].append(g)
    died_seq = dict(obs.death_seqs)
    for ask in _steps(obs, "busy"):
        asked = root.get(ask.session_id, ask.session_id)
        held = [g for g in grants_of.get(asked, ())
                if g.acquired_at <= ask.at + EPSILON_S
                and granted_at.get((g.session_id, g.token), -1) < ask.seq]
        if not held:
            continue
        grant = max(reversed(held), key=lambda g: g.token)  # a carried grant is the later
        pid, died = _death_of(grant.holder, deaths)
        if _after_loss(grant, ask.at):
            problem = f"its grant (token {grant.token}) had ended"
        elif died is not None and died <= ask.at + EPSILON_S \
                and died_seq.get(int(pid), -1) < ask.seq:
            problem = f"its holder pid={pid} had died {ask.at - died:g} s before"
        else:
            continue
        if asks.someone_ahead(ask):
            continue  # free to take, but another turn had waited longer: its turn comes first
        blocked[(ask.session_id, ask.holder)].append(problem)
    out.extend(_live_leases_taken(obs, deaths))
    for (session_id, asker), problems in blocked.items():
        more = f" (and {len(problems) - 1} later asks)" if len(problems) > 1 else ""
        out.append(Violation("dead_holders_do_not_block", "LEASE-3",
                             f"{asker} was refused the lease of {session_id}, but "
                             f"{problems[0]}{more}"))
    return out


def _live_leases_taken(obs: Observation, deaths: dict[int, float]) -> list[Violation]:
    """The other half of LEASE-3, judged against the world and not the store's own labels:
    a grant replaces its predecessor only once that one was released, had expired, or its
    holder's process had died. Only a simulated world knows when its processes died
    (``lease_log`` is kept there); a record from real processes is not judged here."""
    out: list[Violation] = []
    if obs.lease_log is None:
        return out
    carried = _carried_to(obs)
    granted = {(s.session_id, s.token): s.seq for s in _steps(obs, "granted")}
    died_seq = dict(obs.death_seqs)
    for session_id, before, after in successive_grants(obs):
        at = after.acquired_at
        last = carried.get((before.session_id, before.token), before)  # CMP-5: it lives on in the child
        released = last.end_reason == "released" and (last.ended_at or 0.0) <= at
        before = last
        pid, died = _death_of(before.holder, deaths)
        # a death at the grant's own instant counts only if it came first (effects share instants)
        dead = died is not None and died <= at + EPSILON_S and _died_first(
            died_seq.get(int(pid)), granted.get((after.session_id, after.token)))
        if released or before.expires_at <= at + EPSILON_S or dead:
            continue
        out.append(Violation("dead_holders_do_not_block", "LEASE-3",
                             f"{session_id}: token {after.token} was granted to "
                             f"{after.holder} at {at - before.acquired_at:g} s into token "
                             f"{before.token}, whose live holder {before.holder} had "
                             "neither released it nor let it expire"))
    return out


@checker("release_after_refresher_stops", ("LEASE-6",),
         "a holder's refresher is stopped (and joined) before its lease is released, and no "
         "refresh follows the release")
def release_after_refresher_stops(obs: Observation) -> list[Violation]:
    if obs.lease_log is None:
        return []
    out: list[Violation] = []
    started = {(s.session_id, s.token) for s in _steps(obs, "refresher_started")}
    stopped = {(s.session_id, s.token): s.seq for s in _steps(obs, "refresher_stopped")}
    for release in _steps(obs, "released"):
        key = (release.session_id, release.token)
        if key in started and stopped.get(key, release.seq + 1) > release.seq:
            out.append(Violation("release_after_refresher_stops", "LEASE-6",
                                 f"{release.session_id} token {release.token} was released "
                                 "while its refresher was still running"))
        late = [s for s in _steps(obs, "refreshed") + _steps(obs, "refresh_failed")
                if (s.session_id, s.token) == key and s.seq > release.seq]
        if late:
            out.append(Violation("release_after_refresher_stops", "LEASE-6",
                                 f"{release.session_id} token {release.token} was refreshed "
                                 f"{len(late)} time(s) after its release"))
    out.extend(_refreshers_left_running(obs, started, stopped))
    out.extend(_leases_left_held(obs))
    return out


def _leases_left_held(obs: Observation) -> list[Violation]:
    """Fail on silence: a turn that ended (its process did not die in it) released every
    grant it got, whatever way it ended: the lease log shows the release (or the store's
    refusal of it). A grant the turn had already lost (a refresh failed, or it
    expired or was reclaimed before the turn's exit line) had nothing left to release; a
    grant a rotation carried is released as the child's (CMP-5)."""
    if obs.lease_log is None or obs.runs is None:
        return []
    ended = {run.turn_id for run in obs.runs if run.turn_id and not run.crashed}
    exits = {e.turn_id: e.at for e in obs.events(EventKind.TURN_EXIT) if e.at is not None}
    # a release the store refused leaves the lease to expire, as it must
    released = {(s.session_id, s.token) for s in obs.lease_log
                if s.what in ("released", "release_failed")}
    lost = {(s.session_id, s.token) for s in obs.lease_log
            if s.what in ("refresh_failed", "interrupted")}
    carried = _carried_to(obs)
    out: list[Violation] = []
    for grant in obs.record.lease_grants:
        turn = _turn_of(grant.holder)
        if turn not in ended or turn not in exits or grant.end_reason == "rotated":
            continue
        last = carried.get((grant.session_id, grant.token), grant)
        key = (last.session_id, last.token)
        gone_first = last.ended_at is not None and last.end_reason != "released" \
            and last.ended_at <= exits[turn] + EPSILON_S
        if key in released or key in lost or gone_first:
            continue
        out.append(Violation("release_after_refresher_stops", "LEASE-6",
                             f"{last.session_id} token {last.token}: turn {turn} ended without "
                             "releasing its lease"))
    return out


def _refreshers_left_running(obs: Observation, started: set[tuple[str, int]],
                             stopped: dict[tuple[str, int], int]) -> list[Violation]:
    """Fail on silence: a turn that ended (its process did not die in it) stopped the
    refresher it started, whether or not its release then went through."""
    ended = {run.turn_id for run in obs.runs or () if run.turn_id and not run.crashed}
    holders = {(s.session_id, s.token): s.holder for s in _steps(obs, "refresher_started")}
    return [Violation("release_after_refresher_stops", "LEASE-6",
                      f"{key[0]} token {key[1]}: turn {_turn_of(holders[key])} ended without "
                      "stopping its lease refresher")
            for key in sorted(started) if key not in stopped and _turn_of(holders[key]) in ended]


def _in_line_at(steps: list[LeaseStep], session_id: str, holder: str, grant: LeaseStep,
                lapse_s: float) -> bool:
    """Was ``holder`` still in line when ``grant`` was made: had it asked less than the
    lapse before it? (A waiter silent for two polls has lost its place, as the stores
    say: a place asked at t is gone at t + lapse, ``valid_until <= now``; ``_place``
    reads the lapse the same way.)"""
    before = [s.at for s in steps if s.session_id == session_id and s.holder == holder
              and s.seq < grant.seq]
    return bool(before) and grant.at - before[-1] < lapse_s - EPSILON_S


@checker("waiters_served_in_order", ("LEASE-1",),
         "a free lease goes to the turn that has waited longest, not to a later asker")
def waiters_served_in_order(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    asks = Asks.of(obs)
    steps, last_ask = asks.steps, asks.last
    lapse_s = 2 * obs.limits.lease_poll_s  # a place in line lapses after two polls unasked
    by_asker: dict[tuple[str, str], list[LeaseStep]] = defaultdict(list)
    for step in steps:
        by_asker[(step.session_id, step.holder)].append(step)
    for grant in (s for s in steps if s.what == "granted"):
        mine = _place(by_asker[(grant.session_id, grant.holder)], grant.seq, lapse_s).seq
        places = [_place(asked, grant.seq, lapse_s) for (session_id, holder), asked
                  in by_asker.items() if session_id == grant.session_id
                  and holder != grant.holder and asked[0].seq < grant.seq
                  and last_ask[(session_id, holder)] > grant.seq
                  and _in_line_at(steps, session_id, holder, grant, lapse_s)]
        for ask in places:
            if ask.what == "busy" and ask.seq < mine:
                out.append(Violation("waiters_served_in_order", "LEASE-1",
                                     f"{grant.session_id} went to {grant.holder} (first asked at "
                                     f"effect {mine}) while {ask.holder} had waited since effect "
                                     f"{ask.seq}"))
    return out


def _place(asked: list[LeaseStep], seq: int, lapse_s: float) -> LeaseStep:
    """The ask that gave an asker its present place in line at effect ``seq``: the first
    of its asks up to ``seq`` that followed one another less than ``lapse_s`` apart. A
    waiter that went two polls without asking (its process stalled, say) lost its place,
    and its next ask joined the line again at its end, as the stores keep it."""
    place = asked[0]
    for before, ask in pairwise(asked):
        if ask.seq > seq:
            break
        if ask.at - before.at >= lapse_s - EPSILON_S:
            place = ask
    return place


@checker("turns_write_in_turn", ("LEASE-4",),
         "a session's rows come turn after turn: no turn writes once a later turn has begun")
def turns_write_in_turn(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for session_id in obs.record.session_ids():
        finished: set[str] = set()
        current: str | None = None
        for message in obs.record.transcript(session_id):
            turn = message.turn_id
            if turn is None or turn == current:
                continue
            if turn in finished:
                out.append(Violation("turns_write_in_turn", "LEASE-4",
                                     f"{session_id}: turn {turn} wrote row #{message.row_id} "
                                     f"after turn {current} had begun writing (a holder "
                                     "that had lost its lease was not fenced off)"))
                continue
            if current is not None:
                finished.add(current)
            current = turn
    return out
