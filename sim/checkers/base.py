"""The checkers' shared ground: violations, the observation, the registry and common readings."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import pairwise
from operator import is_
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from hermes_ref.limits import Limits
from hermes_ref.models import Event, EventKind, Message, Role, ToolCall, ToolKind
from hermes_ref.outcomes import Completion, ExitLine
from hermes_ref.ports import DurableRecord, LedgerEntry, StoredMessage
from hermes_ref.scaffolding import GRACE_SUMMARY_PROMPT
from hermes_ref.tool_specs import TOOLS_BY_NAME
from hermes_ref.wire import ProviderRequest
from sim.checkers import lineage  # CMP-5: a rotated turn is one turn
from sim.checkers.measure import message_tokens, route_window_tokens
from sim.checkers.rules import holder_fields
from sim.tools import SimLedgerEntry
from sim.world import CallRecord, FailedWrite, Intervention, LaneEffect, LeaseStep, RewriteRun, TurnRun


@dataclass(frozen=True, slots=True)
class Violation:
    checker: str
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"{self.invariant} [{self.checker}] {self.message}"


@dataclass(frozen=True)
class TurnView:
    """One turn as the record shows it, keyed by session and turn (never by call id alone).

    ``exits`` and ``completions`` hold every such event of the turn, read back through the
    engine's typed records; an event that does not parse is kept as its error text, so a
    malformed exit line is a finding, not a skip.
    """

    session_id: str
    turn_id: str
    run: TurnRun | None
    events: list[Event] = field(default_factory=list)
    rows: list[Message] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    exits: list[ExitLine | str] = field(default_factory=list)
    completions: list[Completion | str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.session_id}/{self.turn_id}"

    @property
    def exit(self) -> ExitLine | None:
        """The turn's one well-formed exit line, or None (absent, repeated or malformed)."""
        line = self.exits[0] if len(self.exits) == 1 else None
        return line if isinstance(line, ExitLine) else None

    @property
    def completion(self) -> Completion | None:
        done = self.completions[0] if len(self.completions) == 1 else None
        return done if isinstance(done, Completion) else None


T = TypeVar("T")


class Memo:
    """Readings of the record kept from one check of a world to the next.

    A reading is a pure function of the values it reads. The memo keeps each one with the
    very objects it was read from (so none of them is freed and its id reused while kept)
    and hands it back only when every one of them is the same object again, and ``extra``
    is equal; otherwise it reads again. The record's values are frozen, so the same
    objects mean the same answer: a kept reading equals the one a full check would make.
    """

    __slots__ = ("_kept", "_views")

    def __init__(self) -> None:
        self._kept: dict[tuple[str, int, Any], tuple[tuple[object, ...], Any]] = {}
        self._views: dict[tuple[str, str], TurnView] = {}

    def same_views(self, fresh: dict[tuple[str, str], TurnView]) -> dict[tuple[str, str], TurnView]:
        """``fresh``, each view that holds the very same run, rows, calls and events as the
        last check's view of its turn replaced by that one (its exits and completions are
        read from those events alike), so a reading keyed by a view finds what it read."""
        kept = self._views
        for key, view in fresh.items():
            old = kept.get(key)
            if old is not None and old.run is view.run and _same_items(old.rows, view.rows) \
                    and _same_items(old.calls, view.calls) and _same_items(old.events, view.events):
                fresh[key] = old
        self._views = dict(fresh)
        return fresh

    def get(self, name: str, sources: tuple[object, ...], read: Callable[[], T],
            extra: Any = None) -> T:
        if not sources:
            return read()
        key = (name, id(sources[0]), extra)
        kept = self._kept.get(key)
        if kept is not None and _same_items(kept[0], sources):
            return cast(T, kept[1])
        value = read()
        self._kept[key] = (sources, value)
        return value


def _same_items(a: Sequence[object], b: Sequence[object]) -> bool:
    """The same objects, in the same places."""
    return len(a) == len(b) and all(map(is_, a, b))


@lru_cache(maxsize=4096)  # a holder string's fields never change; readings ask again and again
def holder_turn(holder: str) -> str | None:
    """The turn a lease holder string names (``turn=...``), or None."""
    return holder_fields(holder).get("turn")


def remembered(obs: Observation, name: str, sources: tuple[object, ...],
               read: Callable[[], T], extra: Any = None) -> T:
    """``read()``, or what it gave for the same ``sources`` at an earlier check of the world."""
    return read() if obs.memo is None else obs.memo.get(name, sources, read, extra)


@dataclass(frozen=True)
class Observation:
    record: DurableRecord
    ledger: tuple[LedgerEntry, ...]
    calls: tuple[CallRecord, ...]
    crash_seqs: tuple[int, ...]
    limits: Limits
    # call ids the tool world ran together, batch by batch (empty where nobody recorded it)
    batches: tuple[tuple[str, ...], ...] = ()
    # the turns the harness ran, as the world saw them; None where nobody recorded them
    # (the real-crash journals), and then only the record says which turns were opened
    runs: tuple[TurnRun, ...] | None = None
    # LEASE: the world's own log of what each lease holder did (None where nobody kept one)
    lease_log: tuple[LeaseStep, ...] | None = None
    # LEASE-3: simulated processes that died, as (pid, virtual time of death)
    deaths: tuple[tuple[int, float], ...] = ()
    death_seqs: tuple[tuple[int, int], ...] = ()  # (pid, world effect count at its death)
    # LEASE-2: stretches when a simulated process was stalled, as (pid, from, until)
    stalls: tuple[tuple[int, float, float], ...] = ()
    # TOOL-5, TOOL-8: the store writes the world failed on purpose, each with its site and time
    failed_writes: tuple[FailedWrite, ...] = ()
    # LOOP-4/5, FIN-4: interrupts, corrections and credential renewals, as the world saw them
    interventions: tuple[Intervention, ...] = ()
    # SES-7: starts, route reads and route writes in effect order (None: nobody logged them)
    lane_effects: tuple[LaneEffect, ...] | None = None
    # DEL-2: the simulated clients of the event stream (``sim.stream_client.SimClient``)
    clients: tuple[Any, ...] = ()
    # CMP: compaction's summary requests, apart from the turn's calls (None: nobody logged them)
    summary_calls: tuple[CallRecord, ...] | None = None
    manual_compactions: tuple[tuple[str, int], ...] = ()  # CMP-4: (session, effect count)
    # readings kept between checks of one world (``Memo``); never part of what is judged
    memo: Memo | None = field(default=None, compare=False, repr=False)

    @cached_property
    def turns(self) -> dict[tuple[str, str], TurnView]:
        """Every turn the world ran or the record mentions, in first-seen order."""
        views: dict[tuple[str, str], TurnView] = {}
        by_id: dict[str, tuple[str, str]] = {}
        root, copied = lineage.roots(self.record), self.copied_row_ids  # CMP-5: one turn

        def view(session_id: str, turn_id: str, run: TurnRun | None = None) -> TurnView:
            session_id = root.get(session_id, session_id)
            key = (session_id, turn_id)
            if key not in views:
                views[key] = TurnView(session_id, turn_id, run)
                by_id.setdefault(turn_id, key)
            return views[key]

        for run in self.runs or ():
            if run.turn_id is not None:
                view(run.session_id, run.turn_id, run)
        for stored in lineage.written(self.record):  # live and archived rows, in row order
            if stored.message.turn_id is not None and stored.message.row_id not in copied:
                view(stored.session_id, stored.message.turn_id).rows.append(stored.message)
        for call in self.calls:
            view(call.session_id, call.turn_id).calls.append(call)
        for event in self.record.events:
            _file_event(self, view(event.session_id, event.turn_id), event)
        return views if self.memo is None else self.memo.same_views(views)

    def ended_turns(self) -> list[TurnView]:
        """The turns that must show an ending: every one whose process did not die in it.

        With the runs known, a turn is excused only when the world saw its process crash;
        without them, only when the record shows a crash at all.
        """
        return list(self._ended_turns)

    @cached_property
    def _ended_turns(self) -> list[TurnView]:
        if self.runs is None:
            return list(self.turns.values()) if not self.crash_seqs else [
                v for v in self.turns.values() if v.exits or v.completions]
        return [v for v in self.turns.values() if v.run is None or not v.run.crashed]

    @cached_property
    def rows_by_id(self) -> dict[int, StoredMessage]:
        """Every committed row by its row id (ids are unique across sessions)."""
        return {m.message.row_id or 0: m for m in self.record.messages}

    def at_rest(self, session_id: str) -> bool:
        holder = self._lease_holders.get(session_id, _NO_LEASE)
        return holder is _NO_LEASE or holder is None

    @cached_property
    def _lease_holders(self) -> dict[str, str | None]:
        """Each session's holder, as its first lease row names it."""
        holders: dict[str, str | None] = {}
        for lease in self.record.leases:
            holders.setdefault(lease.session_id, lease.holder)
        return holders

    def events(self, kind: str) -> list[Event]:
        return list(self._events_by_kind.get(kind, ()))

    @cached_property
    def _events_by_kind(self) -> dict[str, list[Event]]:
        grouped: dict[str, list[Event]] = defaultdict(list)
        for event in self.record.events:
            grouped[event.kind].append(event)
        return grouped

    @cached_property
    def copied_row_ids(self) -> frozenset[int]:
        """CMP-5: rows a compaction copied in (not written again by their turns)."""
        return lineage.copied_row_ids(self.record)

    def rows_of_turn(self, turn_id: str) -> list[Message]:
        return list(self._rows_by_turn.get(turn_id, ()))

    @cached_property
    def _rows_by_turn(self) -> dict[str | None, list[Message]]:
        copied = self.copied_row_ids
        grouped: dict[str | None, list[Message]] = defaultdict(list)
        for stored in lineage.written(self.record):
            if stored.message.row_id not in copied:
                grouped[stored.message.turn_id].append(stored.message)
        return grouped

    def calls_of_turn(self, turn_id: str) -> list[CallRecord]:
        return list(self._calls_by_turn.get(turn_id, ()))

    @cached_property
    def _calls_by_turn(self) -> dict[str, list[CallRecord]]:
        grouped: dict[str, list[CallRecord]] = defaultdict(list)
        for call in self.calls:
            grouped[call.turn_id].append(call)
        return grouped

    @cached_property
    def call_rows_by_turn(self) -> dict[tuple[str, str | None], list[Message]]:
        """The rows that carry tool calls, by (session, turn), in row order."""
        grouped: dict[tuple[str, str | None], list[Message]] = defaultdict(list)
        for stored in self.record.messages:
            if stored.message.tool_calls:
                grouped[(stored.session_id, stored.message.turn_id)].append(stored.message)
        return grouped

    def reading(self, name: str, read: Callable[[], Any]) -> Any:
        """``read()``, made once per observation and shared by every checker that asks."""
        readings = self._readings
        if name not in readings:
            readings[name] = read()
        return readings[name]

    @cached_property
    def _readings(self) -> dict[str, Any]:
        return {}

    def written_rows(self, session_id: str) -> list[Message]:
        """``session_id``'s rows, live or archived, in row order (``lineage.written``)."""
        return self._written_by_session.get(session_id, [])

    @cached_property
    def _written_by_session(self) -> dict[str, list[Message]]:
        grouped: dict[str, list[Message]] = defaultdict(list)
        for stored in lineage.written(self.record):
            grouped[stored.session_id].append(stored.message)
        return grouped


_NO_LEASE = object()  # ``at_rest``: the session has no lease row at all


def _file_event(obs: Observation, view: TurnView, event: Event) -> None:
    view.events.append(event)
    try:  # each event value is parsed once; a malformed one raises again at every check
        if event.kind == EventKind.TURN_EXIT:
            view.exits.append(remembered(obs, "exit line", (event,), lambda: ExitLine.of(event)))
        elif event.kind == EventKind.TURN_COMPLETED:
            view.completions.append(remembered(obs, "completion", (event,),
                                               lambda: Completion.of(event)))
    except ValidationError as error:
        problem = f"malformed {event.kind} event: {error.errors()[0]['msg']}"
        (view.exits if event.kind == EventKind.TURN_EXIT else view.completions).append(problem)


# Two virtual times closer than this are one moment. The simulated clock starts at a
# large epoch, where a float keeps only about 1e-7 s, so a tolerance must be well above
# that; every timing in a world is a whole number of milliseconds or more apart.
EPSILON_S = 1e-6

Check = Callable[[Observation], list[Violation]]


@dataclass(frozen=True)
class Checker:
    name: str
    invariants: tuple[str, ...]
    summary: str
    check: Check


CHECKERS: dict[str, Checker] = {}


def checker(name: str, invariants: tuple[str, ...], summary: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKERS[name] = Checker(name, invariants, summary, fn)
        return fn
    return register


def run_all(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for entry in CHECKERS.values():
        out.extend(entry.check(obs))
    return out


# ---- shared readings of the call log and the record ----------------------------------------


def exit_reasons(obs: Observation) -> dict[str, str | None]:
    """The recorded exit reason of each turn that has one well-formed exit line."""
    return {view.turn_id: view.exit.reason.value for view in obs.turns.values()
            if view.exit is not None}


def stopped_at_the_bound(obs: Observation, turn_id: str) -> bool:
    """The turn's exit line shows every budget unit or ``max_iterations`` call spent, with
    the grace call off, or with a grace request too long for its window: the loop could
    make no further call of any kind (LOOP-1, FIN-1, CMP-7)."""
    views = [v for v in obs.turns.values() if v.turn_id == turn_id and v.exit is not None]
    if obs.limits.grace_call_enabled and not any(grace_would_not_fit(obs, v) for v in views):
        return False
    return any(bound_spent(obs, view) for view in views)


def bound_spent(obs: Observation, view: TurnView) -> bool:
    """Every budget unit or every one of ``max_iterations`` calls spent, counted from the
    provider's log (a fallback hop's call refunded, refundable rounds given back)."""
    charged = charged_requests(view.calls)
    return charged >= obs.limits.max_iterations or \
        charged - refunded_rounds(view) >= obs.limits.iteration_budget


def grace_would_not_fit(obs: Observation, view: TurnView) -> bool:
    """The turn made no grace call, and its grace request rebuilt from the record (the
    prompt of the session it ended in, that session's rows up to the turn's own last one
    but its closing row, each as it read then, the scaffolding its working list held, the
    grace prompt) is over the window of the turn's last route: preflight refused it."""
    if not view.calls or any(c.request.purpose == "grace" for c in view.calls) \
            or view.exit is None or "grace call not sent" not in view.exit.detail:
        return False  # the engine said it refused, and the rebuilt request must agree
    where = ended_in(view)
    then = as_sent_at(obs, view.calls[-1].seq)  # a later redaction had not shortened them yet
    rows = [then(m.message) for m in obs.record.messages if m.session_id == where]
    own = [i for i, row in enumerate(rows) if row.turn_id == view.turn_id]
    rows = rows[:own[-1] + 1] if own else rows  # later turns' rows were not there yet
    if rows and rows[-1].turn_id == view.turn_id and rows[-1].role is Role.ASSISTANT \
            and not rows[-1].tool_calls:
        rows = rows[:-1]  # the boundary or answer row the finalizer wrote after
    tokens = record_tokens(obs, where, rows) + _scaffolding_tokens(obs, view) + \
        message_tokens({"role": "user", "content": GRACE_SUMMARY_PROMPT})
    return tokens > window_tokens(obs.limits, view.calls[-1].request.model)


def _scaffolding_tokens(obs: Observation, view: TurnView) -> int:
    """The tokens of the retry scaffolding the turn's working list holds when its grace
    request is built: what the last call carried and what its reply called for (a dropped
    call's re-prompt, LOOP-7; the nudge after a tool round's empty reply or a reasoning
    prefill, LOOP-8). Scaffolding is never stored (SCAF-1), so a request rebuilt from the
    record lacks it, but the finalizer drops it only after the grace call."""
    from sim.checkers.compaction_record import scaffolding_after, tokens_of  # it reads this module

    return tokens_of(scaffolding_after(obs, view.calls, view.calls[-1]))


def ended_in(view: TurnView) -> str:
    """The session the turn ended in (a view is keyed by its lineage's root, CMP-5)."""
    return next((e.session_id for e in view.events if e.kind == EventKind.TURN_EXIT),
                view.session_id)


def as_written(obs: Observation, first_row_id: int) -> Callable[[Message], Message]:
    """The rows as they were when a compaction whose rows begin at ``first_row_id`` ran:
    a row an operator rewrote after it (WIRE-2, ``RewriteRun``) is judged as the compaction
    wrote or replaced it, not as the later rewrite left it."""
    later: dict[int, Message] = {}
    for r in obs.runs or ():
        if isinstance(r, RewriteRun) and r.was is not None and r.watermark >= first_row_id:
            later.setdefault(r.row_id, r.was)  # the first rewrite since: the row as written

    def then(row: Message) -> Message:
        return later.get(row.row_id or 0) or row
    return then


def as_sent_at(obs: Observation, seq: int) -> Callable[[Message], Message]:
    """The rows as they were at the world's effect ``seq`` (a call made then): a row the
    harness rewrote later (a redaction, WIRE-2, ``RewriteRun``) is read as it was, since a
    request made before the rewrite carried it so."""
    later: dict[int, Message] = {}
    for r in obs.runs or ():
        if isinstance(r, RewriteRun) and r.was is not None and r.seq >= seq:
            later.setdefault(r.row_id, r.was)  # the first rewrite since: the row as it was

    def then(row: Message) -> Message:
        return later.get(row.row_id or 0) or row
    return then


def record_tokens(obs: Observation, session_id: str, rows: Sequence[Message]) -> int:
    """A request rebuilt from the record: the session's stored prompt, then ``rows`` but the
    hidden ones, which no request carries (LOOP-4)."""
    prompt = next((s.system_prompt for s in obs.record.sessions if s.id == session_id), "")
    return message_tokens({"role": "system", "content": prompt}) + \
        sum(message_tokens(m.wire) for m in rows if not m.hidden)


def window_tokens(limits: Limits, model: str | None = None) -> int:
    """The window of the route a request went to (LOOP-6: a fallback has its own)."""
    for route in getattr(limits, "fallback_providers", ()):
        if route.model == model:
            return route_window_tokens(route.context_window_tokens, route.token_ratio)
    return limits.context_window_tokens


def route_chain(limits: Limits) -> list[str]:
    """The models of a turn's routes, the primary first (LOOP-6)."""
    return [limits.model, *(r.model for r in limits.fallback_providers)]


def calls_by_turn(obs: Observation) -> dict[str, list[CallRecord]]:
    """Each turn's provider calls, in call order."""
    grouped: dict[str, list[CallRecord]] = defaultdict(list)
    for call in obs.calls:
        grouped[call.turn_id].append(call)
    return grouped


def distinct_requests(records: list[CallRecord]) -> list[ProviderRequest]:
    """The requests of ``records`` in first-call order; retries share one request object."""
    seen: dict[int, ProviderRequest] = {}
    for record in records:
        seen.setdefault(id(record.request), record.request)
    return list(seen.values())


def charged_requests(records: list[CallRecord]) -> int:
    """The budgeted requests a turn paid for: its distinct requests less the grace call
    and less its fallback hops. A hop is a request to another model than the one before
    it (a grace call on another model than the last request shows one too: only a hop
    changes a turn's model); it replaces that request in the same iteration, which is
    refunded (LOOP-2)."""
    requests = distinct_requests(records)
    budgeted = [r for r in requests if r.purpose != "grace"]
    graces = [r for r in requests if r.purpose == "grace"]
    hops = sum(1 for a, b in pairwise(budgeted) if a.model != b.model)
    if budgeted and graces and graces[0].model != budgeted[-1].model:
        hops += 1
    return len(budgeted) - hops


def grace_calls(records: list[CallRecord]) -> int:
    """The turn's grace calls, a call sent again on the fallback after a hop counted once."""
    graces = [r for r in distinct_requests(records) if r.purpose == "grace"]
    return len(graces) - sum(1 for a, b in pairwise(graces) if a.model != b.model)


def is_grace(record: CallRecord) -> bool:
    return record.request.purpose == "grace"


def offered(request: ProviderRequest) -> frozenset[str]:
    return frozenset(t.name for t in request.tools)


def tool_replies(records: list[CallRecord]) -> list[CallRecord]:
    """The budgeted calls whose reply called tools: the turn's tool rounds, in order."""
    return [r for r in records if r.reply is not None and r.reply.tool_calls and not is_grace(r)]


def all_invalid(record: CallRecord) -> bool:
    """Every call of the reply names a tool the request did not offer."""
    names = offered(record.request)
    return record.reply is not None and all(c.name not in names for c in record.reply.tool_calls)


def round_landed(obs: Observation, record: CallRecord) -> bool:
    """Every call of the reply has a durable result written by the same turn."""
    if record.reply is None:
        return False
    answered = {m.tool_call_id for m in obs.rows_of_turn(record.turn_id) if m.role is Role.TOOL}
    return all(c.id in answered for c in record.reply.tool_calls)


def wrote_in(obs: Observation, records: Sequence[CallRecord]) -> bool:
    """A landed tool round of ``records`` ran a writer tool: the turn changed a file, and
    FIN-1's gate holds the next answer back (``verify_before_answer``)."""
    return any(c.reply is not None and round_landed(obs, c) and any(
        t.name in TOOLS_BY_NAME and TOOLS_BY_NAME[t.name].kind is ToolKind.WRITER
        for t in c.reply.tool_calls) for c in records)


def invalid_streak_at_end(obs: Observation, records: list[CallRecord]) -> int:
    """All-invalid tool rounds in a row that end the turn's calls (0 if its last call is not one)."""
    rounds = tool_replies(records)
    if not rounds or rounds[-1] is not records[-1] or not round_landed(obs, rounds[-1]):
        return 0
    streak = 0
    for record in reversed(rounds):
        if not round_landed(obs, record):
            continue  # asked again unrecorded (malformed arguments, LOOP-9): no round at all
        if not all_invalid(record):
            break
        streak += 1
    return streak


def call_rows(obs: Observation) -> list[Message]:
    """Every durable assistant row that carries tool calls, in row order."""
    rows: list[Message] = obs.reading("call rows", lambda: [
        m.message for m in obs.record.messages if m.message.tool_calls])
    return list(rows)


def durable_call_row(entry: LedgerEntry, rows: list[Message]) -> Message | None:
    """The latest call row, durable when the tool ran, that holds this ledger entry's call."""
    for row in reversed(rows):
        if (row.row_id or 0) <= entry.watermark and any(
                c.id == entry.call_id and c.name == entry.name for c in row.tool_calls):
            return row
    return None


TurnKey = tuple[str, str | None]  # (session id, turn id)


def ran_in(obs: Observation, entry: LedgerEntry) -> TurnKey | None:
    """The (session, turn) a tool call ran in, read from the world's record, not its id.

    The ledger entry carries the store's high-water mark when the call ran and, from a
    batch, the session the batch ran for. A turn writes its user (or recovery) row before
    any tool, and the session's lease keeps every other turn of that session out, so the
    session's last row committed by then belongs to the turn that ran the call. Turns of
    other sessions may commit rows between a turn's call row and its tools (two turns of
    one process starting at one instant), so the high-water row alone decides only for an
    entry that names no session. None when nothing was committed yet. A call id, which a
    provider may repeat from turn to turn, never decides this. The batch's session is the
    one input here the engine names (its ``ExecuteTools`` effect): the simulator runs a
    batch only after the store vouched for that session's lease under the turn's token,
    which a batch named for another session passes only when that session's live lease
    happens to carry the same token number.
    """
    session_id = entry.session_id if isinstance(entry, SimLedgerEntry) else None
    if session_id is None:
        stored = obs.rows_by_id.get(entry.watermark)
        return None if stored is None else (stored.session_id, stored.message.turn_id)
    rows = obs.written_rows(session_id)
    committed = bisect_right(rows, entry.watermark, key=lambda m: m.row_id or 0)
    return None if committed == 0 else (session_id, rows[committed - 1].turn_id)


def call_row_of(obs: Observation, entry: LedgerEntry) -> tuple[TurnKey, Message | None] | None:
    """The turn ``entry`` ran in and that turn's call row naming it, durable when it ran.

    The row is None when the turn committed no such row by then (a TOOL-1 breach); the
    whole answer is None when nothing was committed at all.
    """
    key = ran_in(obs, entry)
    if key is None:
        return None
    for row in reversed(obs.call_rows_by_turn.get(key, ())):  # the turn's call rows only
        if (row.row_id or 0) <= entry.watermark and any(
                c.id == entry.call_id and c.name == entry.name for c in row.tool_calls):
            return key, row
    return key, None


def result_row_of(obs: Observation, entry: LedgerEntry) -> tuple[str, Message] | None:
    """The session and durable result row of the call ``entry`` ran: the tool row with its
    id that follows its own call row in that session (ids may repeat across turns)."""
    found = call_row_of(obs, entry)
    if found is None:
        return None
    (session_id, _), call_row = found
    if call_row is None:
        return None
    seen_call_row = False
    for stored in obs.record.messages:
        if stored.session_id != session_id:
            continue
        row = stored.message
        if row is call_row or row.row_id == call_row.row_id:
            seen_call_row = True
        elif seen_call_row and row.role is Role.TOOL and row.tool_call_id == entry.call_id:
            return session_id, row
        elif seen_call_row and row.role is not Role.TOOL:
            return None  # the call's group ended without its result
    return None


def _call_keys(message_calls: tuple[ToolCall, ...]) -> list[tuple[str, str, str]]:
    return [(c.id, c.name, c.arguments) for c in message_calls]


def refunded_rounds(view: TurnView) -> int:
    """The turn's stored tool rounds that called only refundable tools (LOOP-2)."""
    refundable = {t.name for t in TOOLS_BY_NAME.values() if t.refundable}
    return sum(1 for m in view.rows
               if m.tool_calls and all(c.name in refundable for c in m.tool_calls))
