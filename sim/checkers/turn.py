"""Checkers of the prologue and the main loop: session row first, user row before the first
call, budget accounting, exit reasons, error classification, dropped-call re-prompts, refusals."""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from itertools import pairwise

from hermes_ref.errors import (
    ContextOverflow,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    ProviderTimeout,
    RateLimited,
    StreamCut,
)
from hermes_ref.limits import Limits
from hermes_ref.models import Role
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS, ExitReason
from sim.checkers import loop_fire
from sim.checkers.base import (
    EPSILON_S,
    Observation,
    TurnView,
    Violation,
    call_row_of,
    calls_by_turn,
    charged_requests,
    checker,
    distinct_requests,
    exit_reasons,
    grace_calls,
    is_grace,
    refunded_rounds,
    route_chain,
    stopped_at_the_bound,
)
from sim.checkers.reasons import bad_calls, cut_off, dropped_call, nudges_since_tool, reason_problem
from sim.checkers.rules import holder_fields
from sim.checkers.streaming import failed_calls, whole_answer  # FIN-2: a recovered stream answered
from sim.checkers.thoughts import visible_text
from sim.checkers.wire import sent_messages
from sim.world import CallRecord


@checker("refusal_is_not_loss", ("LEASE-5",),
         "a turn whose message never became durable hands back the user's own text, and its "
         "caller is told it may retry; a refused turn writes nothing")
def refusal_is_not_loss(obs: Observation) -> list[Violation]:
    out = []
    for view in obs.ended_turns():
        line, done = view.exit, view.completion
        if line is not None and line.reason is ExitReason.LEASE_TIMEOUT and view.rows:
            out.append(_v5(f"turn {view.key} was refused but wrote rows"))
        if any(r.role is Role.USER for r in view.rows):
            continue  # the message is in the record: nothing to hand back
        carried = done.carried_input if done is not None else None
        wanted = view.run.text if view.run is not None else None
        if carried is None or (wanted is not None and carried != wanted):
            out.append(_v5(f"turn {view.key} did not record the user's message and handed back "
                           f"{carried!r} instead of it"))
        elif view.run is not None and view.run.retryable is False:
            out.append(_v5(f"turn {view.key} handed the user's message back, but its caller "
                           "was told not to retry it"))
    return out


def _v5(message: str) -> Violation:
    return Violation("refusal_is_not_loss", "LEASE-5", message)


# ---- prologue ----------------------------------------------------------------------------


@checker("session_row_first", ("CTX-4", "CTX-3"),
         "a session row always holds a system prompt (CTX-4), which every request of the "
         "session replays byte for byte (CTX-3)")
def session_row_first(obs: Observation) -> list[Violation]:
    out = []
    prompts = {s.id: s.system_prompt for s in obs.record.sessions}
    for session_id, prompt in prompts.items():
        if not prompt or not prompt.strip():
            out.append(Violation("session_row_first", "CTX-4",
                                 f"session {session_id} was written with an empty system prompt"))
    for call in obs.calls:
        stored = prompts.get(call.session_id)
        if stored is None:
            out.append(Violation("session_row_first", "CTX-4",
                                 f"call at effect {call.seq} for {call.session_id} "
                                 "was made before its session row existed"))
            continue
        problem = _prompt_problem(call, stored)
        if problem is not None:
            out.append(Violation("session_row_first", "CTX-3",
                                 f"call at effect {call.seq} (turn {call.turn_id}) sent a system "
                                 f"prompt that differs from the row of session {call.session_id}"
                                 f": {problem}"))
    return out


def _prompt_problem(call: CallRecord, stored: str) -> str | None:
    """How the request's system prompt, as sent on the wire, departs from the stored one.

    The request must open with one system message whose wire bytes are the row's prompt,
    and carry no other: a second system message would change the prompt as surely. It is
    read from the recorded body, the bytes that went out.
    """
    sent = sent_messages(call)
    if isinstance(sent, str):
        return sent
    system = Role.SYSTEM.value  # read once: an enum's value is a property
    systems = [i for i, m in enumerate(sent) if m["role"] == system]
    if systems != [0]:
        return f"system messages at positions {systems}, not one at the start"
    text = sent[0].get("content")
    if text == stored:
        return None
    text = text if isinstance(text, str) else ""
    at = next((i for i, (a, b) in enumerate(zip(text, stored, strict=False)) if a != b),
              min(len(text), len(stored)))
    return f"{len(text)} characters sent for {len(stored)} stored, the first difference at {at}"


@checker("user_row_before_call", ("CTX-8",),
         "the turn's user row is durable, once, before the turn's first model call")
def user_row_before_call(obs: Observation) -> list[Violation]:
    out = []
    first_call: dict[str, CallRecord] = {}
    for call in obs.calls:
        first_call.setdefault(call.turn_id, call)
    for turn_id, call in first_call.items():
        corrections = _correction_rows(obs, turn_id)  # LOOP-4: a correction is a later user row
        users = [m for m in obs.rows_of_turn(turn_id) if m.role is Role.USER
                 and not (m.content in corrections and (m.row_id or 0) > call.watermark)]
        if len(users) != 1:
            out.append(Violation("user_row_before_call", "CTX-8",
                                 f"turn {turn_id} has {len(users)} user rows"))
        elif (users[0].row_id or 0) > call.watermark:
            out.append(Violation("user_row_before_call", "CTX-8",
                                 f"turn {turn_id} called the model before its user row "
                                 f"#{users[0].row_id} was committed"))
    return out


def _correction_rows(obs: Observation, turn_id: str) -> set[str]:
    """The texts of the user rows the turn's corrections became: the corrections one drain
    took in are one row, their texts joined (``redirect.take_redirects``)."""
    drains: dict[int, list[str]] = defaultdict(list)
    for i in obs.interventions:
        if i.what == "drained" and i.turn_id == turn_id:
            drains[i.seq].append(i.text)
    return {text for texts in drains.values() for text in (*texts, "\n\n".join(texts))}


# ---- loop accounting ---------------------------------------------------------------------


@checker("budget_accounting", ("LOOP-1", "LOOP-2", "CTX-1"),
         "calls, budget units and refunds of each turn add up against the provider's log; "
         "a request that was never sent costs nothing")
def budget_accounting(obs: Observation) -> list[Violation]:
    out = []
    for view in obs.ended_turns():
        line = view.exit
        if line is None:
            continue  # the exit line's absence is FIN-7's finding
        requests = distinct_requests(view.calls)
        sent_graces = sum(1 for r in requests if r.purpose == "grace")
        grace = grace_calls(view.calls)  # one grace call, sent again after a hop counted once
        # a fallback hop's call is refunded (LOOP-2), a hop whose request preflight refused too
        regular = charged_requests(view.calls) - _refused_hop(obs, view)
        hops = len(requests) - sent_graces - regular
        refunds = refunded_rounds(view)
        tag = f"turn {view.key}"
        if line.api_calls != len(requests):
            out.append(Violation("budget_accounting", "LOOP-1",
                                 f"{tag} reports {line.api_calls} calls, the provider "
                                 f"saw {len(requests)} (of them {hops} fallback hops)"))
        if regular - refunds > obs.limits.iteration_budget:
            out.append(Violation("budget_accounting", "LOOP-1",
                                 f"{tag} spent {regular - refunds} budget units, past its budget "
                                 f"of {obs.limits.iteration_budget}"))
        if regular > obs.limits.max_iterations or grace > 1:
            out.append(Violation("budget_accounting", "LOOP-1",
                                 f"{tag} made {regular} budgeted calls and {grace} grace calls "
                                 f"with max_iterations={obs.limits.max_iterations}"))
        if line.budget_used != regular - refunds:
            out.append(_units_violation(tag, line.budget_used, regular, refunds,
                                        unsent=line.api_calls - len(requests),
                                        earlier=_others_called_before(obs, view),
                                        occasions=refunds + hops + _compactions_of(obs, view)
                                        + _refused_last(view) + _stopped_unsent(obs, view)))
        if line.budget_max != obs.limits.iteration_budget:
            out.append(Violation("budget_accounting", "CTX-1",
                                 f"{tag} ran with a budget of {line.budget_max}, "
                                 f"not a fresh {obs.limits.iteration_budget}"))
    return out


# errors whose retries, once spent, send a turn to its fallback (LOOP-5, LOOP-6)
_HOPPING_ERRORS = frozenset(t.__name__ for t in (RateLimited, ProviderServerError, StreamCut,
                                                 ProviderTimeout, ProviderAuthError))


def _refused_hop(obs: Observation, view: TurnView) -> int:
    """1 when the turn fell back and its fallback's first request was never sent: its last
    request went unanswered on a route with a fallback after it, and the turn ended without
    calling again (the hop refunded that call). Either preflight refused the rebuilt
    request (a context-pressure exit), or the turn was interrupted before sending it (its
    lease lost while the fallback's preflight compacted, say) after retries the record
    shows spent, with no call counted that the provider did not see.

    An empty reply falls back only when the ladder's rung due is the fallback (LOOP-8):
    after a tool round the nudge comes first, then the prefills and the retries, all on
    the same route, and a refused nudge is no hop: that reply's unit stands (seed 4850)."""
    limits, line = obs.limits, view.exit
    budgeted = [c for c in view.calls if c.request.purpose != "grace"]
    if line is None or not budgeted or len(budgeted) < len(view.calls):
        return 0
    last = budgeted[-1].request
    attempts = [c for c in budgeted if c.request is last]
    chain = route_chain(limits)
    has_next = last.model in chain and chain.index(last.model) < len(chain) - 1
    if line.reason is ExitReason.INTERRUPTED:
        return int(has_next and _retries_spent(limits, attempts)
                   and failed_calls(view.calls) < limits.outer_loop_errors_max
                   and line.api_calls == len(distinct_requests(view.calls)))
    if line.reason not in CONTEXT_PRESSURE_EXITS:
        return 0
    spent = all(c.error in _HOPPING_ERRORS for c in attempts) or (
        all(_walked_the_ladder(limits, c) for c in attempts)
        and loop_fire.rung_due_last(obs, view, partial(_walked_the_ladder, limits)) == "fallback")
    return int(spent and has_next)


_TRANSIENT_ERRORS = _HOPPING_ERRORS - {ProviderAuthError.__name__}


def _retries_spent(limits: Limits, attempts: list[CallRecord]) -> bool:
    """The attempts of one request failed, and the last of them left the engine no retry
    (LOOP-5: ``auth_refreshes_max`` renewals for auth errors, ``transient_retries_max``
    retries for transient ones), so the turn falls back at once, with no effect between."""
    retries = renewals = 0
    for n, call in enumerate(attempts):
        if call.error == ProviderAuthError.__name__ and renewals < limits.auth_refreshes_max:
            renewals += 1
        elif call.error in _TRANSIENT_ERRORS and retries < limits.transient_retries_max:
            retries += 1
        else:
            return n == len(attempts) - 1 and call.error in _HOPPING_ERRORS
    return False


def _walked_the_ladder(limits: Limits, call: CallRecord) -> bool:
    """The reply was empty and went to the empty ladder (LOOP-8), whose last rungs fall
    back. Not a dropped call with re-prompts left: that one is re-prompted on the same
    route (LOOP-7), and a refusal of the re-prompt is no refused hop."""
    reply = call.reply
    if reply is None or reply.tool_calls or visible_text(reply.content):
        return False
    return not (dropped_call(reply) and nudges_since_tool(call) < limits.dropped_toolcall_retries_max)


def _units_violation(tag: str, used: int, regular: int, refunds: int, *, unsent: int,
                     earlier: bool, occasions: int) -> Violation:
    """Name the rule a wrong unit count breaks, by what explains the difference.

    Extra units matched by as many calls the turn counted but the provider never saw were
    charged for requests that were never sent (a preflight refusal, say): LOOP-2. Extra
    units no more than the turn's own occasions for a unit wrongly kept (its refundable
    rounds and fallback hops, whose units come back; a request preflight refused, or one a
    stop from outside cut off before it went out, whose unit comes back; the compactions
    it committed, whose passes spend none) are a refund
    withheld or a pass charged: LOOP-2. Beyond those, units carried in from earlier turns
    (CTX-1) are the likelier reading, if another turn called the model before; a carry no
    larger than the turn's occasions reads as LOOP-2 (a budget carried across turns grows
    with every turn, so its later turns still show CTX-1), and passes that committed
    nothing are not counted, so a pass charged there reads as CTX-1. Any other
    difference (a refund given where none was due) is LOOP-2.
    """
    extra = used - (regular - refunds)
    detail = f"{tag} used {used} budget units for {regular} calls and {refunds} refundable rounds"
    if extra > 0 and extra == unsent:
        return Violation("budget_accounting", "LOOP-2",
                         f"{detail}; the provider never saw {unsent} of the requests it counted")
    if 0 < extra <= occasions:
        return Violation("budget_accounting", "LOOP-2",
                         f"{detail}; {extra} unit(s) kept of its {occasions} occasion(s) for a "
                         "refund (refundable rounds, fallback hops, compactions, a refused request)")
    carried = used > regular and earlier
    return Violation("budget_accounting", "CTX-1" if carried else "LOOP-2", detail)


def _refused_last(view: TurnView) -> int:
    """1 when the turn failed closed for context pressure on a request it never sent: its
    preflight refused the last request and gave its unit back. Not when the last call was
    sent and overflowed (the fail-closed path after an overflow): that unit was spent."""
    line = view.exit
    if line is None or line.reason not in CONTEXT_PRESSURE_EXITS:
        return 0
    last = view.calls[-1] if view.calls else None
    return int(last is None or last.error != ContextOverflow.__name__)


def _stopped_unsent(obs: Observation, view: TurnView) -> int:
    """1 when the user or a lost lease stopped the turn (the world's logs say so) and it
    ended interrupted: its last iteration may have been stopped before its request went
    out (in preflight, say), and that unit comes back."""
    line = view.exit
    if line is None or line.reason is not ExitReason.INTERRUPTED:
        return 0
    return int((view.session_id, view.turn_id) in loop_fire.interrupted(obs))


def _compactions_of(obs: Observation, view: TurnView) -> int:
    """The compactions committed under ``view``'s turn (its holder names the turn)."""
    return sum(1 for c in obs.record.compactions
               if holder_fields(c.holder).get("turn") == view.turn_id)


def _others_called_before(obs: Observation, view: TurnView) -> bool:
    """Another turn called the model before this turn's first call (or, with none, at all).

    The call log is in call order; effect counters restart with each process, so only
    the position in the log orders calls of different turns.
    """
    if not obs.calls:
        return False
    first = obs.calls[0]
    return (first.session_id, first.turn_id) != (view.session_id, view.turn_id)


@checker("exit_reason_recorded", ("LOOP-3",),
         "every turn that ended records one exit reason from the closed set, and the record "
         "shows why: the calls, rows and faults that reason stands for")
def exit_reason_recorded(obs: Observation) -> list[Violation]:
    out = []
    for view in obs.ended_turns():
        if len(view.exits) != 1 or view.exit is None:
            out.append(Violation("exit_reason_recorded", "LOOP-3",
                                 f"turn {view.key} ended with {len(view.exits)} exit lines "
                                 f"{[e for e in view.exits if isinstance(e, str)]}"))
            continue
        problem = reason_problem(obs, view, view.exit)
        if problem is not None:
            out.append(Violation("exit_reason_recorded", "LOOP-3",
                                 f"turn {view.key} exited {view.exit.reason.value}, but {problem}"))
    return out


def _error_classes(base: type[ProviderError]) -> dict[str, type[ProviderError]]:
    found = {base.__name__: base}
    for sub in base.__subclasses__():
        found.update(_error_classes(sub))
    return found


PROVIDER_ERRORS = _error_classes(ProviderError)


def error_kind(name: str) -> str:
    """'transient', 'auth' or 'terminal', by the error class the call log names."""
    cls = PROVIDER_ERRORS.get(name, ProviderError)
    if issubclass(cls, ContextOverflow):
        return "overflow"
    if issubclass(cls, ProviderAuthError):
        return "auth"
    return "transient" if cls.transient else "terminal"


@checker("provider_errors_classified", ("LOOP-5",),
         "transient errors are retried (after any Retry-After), auth once, at most the limits; "
         "any other error ends the turn at once as terminal_provider_error")
def provider_errors_classified(obs: Observation) -> list[Violation]:
    exits = exit_reasons(obs)
    lost = {turn for _, turn in loop_fire.interrupted(obs)}  # an interrupt stops retries (LEASE-4)
    out: list[Violation] = []
    for turn_id, records in calls_by_turn(obs).items():
        reason = exits.get(turn_id)
        if turn_id in lost and reason == ExitReason.INTERRUPTED.value:
            reason = None  # stopped from outside (at the grace call too: FIN-8 defers to it)
        out.extend(Violation("provider_errors_classified", "LOOP-5", f"turn {turn_id}: {problem}")
                   for problem in _retry_problems(obs.limits, records, reason))
    return out


def _retry_problems(limits: Limits, records: list[CallRecord], reason: object) -> list[str]:
    caps = {"transient": limits.transient_retries_max, "auth": limits.auth_refreshes_max,
            "terminal": -1}
    attempts_max = limits.transient_retries_max + limits.auth_refreshes_max + 1
    tallies: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    out = []
    for index, record in enumerate(records):
        tally = tallies[id(record.request)]
        tally["attempts"] += 1
        if tally["attempts"] == attempts_max + 1:
            out.append(f"the request of effect {record.seq} was attempted more than {attempts_max} times")
        if record.error is None or whole_answer(record) is not None:  # FIN-2: an answer
            continue
        kind = error_kind(record.error)
        if kind == "overflow":
            continue  # back to preflight: overflow_goes_back_to_preflight judges it (CMP-7)
        tally[kind] += 1
        final = tally[kind] > caps[kind] \
            or failed_calls(records[:index + 1]) >= limits.outer_loop_errors_max
        after = records[index + 1] if index + 1 < len(records) else None
        if final and kind != "terminal" and limits.fallback_providers and (
                (after is not None and loop_fire.model_of(after) != loop_fire.model_of(record))
                or (after is None and reason in _PREFLIGHT_REFUSALS)):
            continue  # LOOP-6: retries spent, the turn fell back (judged by fallback_routes)
        out.extend(_after_error(record, after, final, reason))
    return out


# A switch to a fallback runs preflight again; these exits say it refused the request.
_PREFLIGHT_REFUSALS = frozenset(r.value for r in CONTEXT_PRESSURE_EXITS)


def _after_error(record: CallRecord, after: CallRecord | None, final: bool, reason: object) -> list[str]:
    tag = f"{record.error} at effect {record.seq}"
    if final and after is not None:
        return [f"{tag} must end the turn, but another call followed at effect {after.seq}"]
    if final and not is_grace(record) and reason not in (None, ExitReason.TERMINAL_PROVIDER_ERROR.value):
        return [f"{tag} ended the turn as {reason}, not terminal_provider_error"]
    if not final and after is None and reason is not None:
        return [f"{tag} is retryable but the turn ended ({reason}) without retrying"]
    if after is not None and record.retry_after_s is not None and (
            after.at - record.at < record.retry_after_s - EPSILON_S):
        return [f"{tag} asked to wait {record.retry_after_s:g} s but the next call came "
                f"{after.at - record.at:g} s later"]
    return []


# Exits that may follow a dropped call with re-prompts left: the loop was stopped from
# outside the reply (the budget ran out, or preflight refused to send the re-prompt). An
# interrupted exit may too, when the user or a lost lease stopped the turn (the reply may
# never have reached it, or its re-prompt was stopped before it went out).
_STOPPED_FROM_OUTSIDE = frozenset({ExitReason.MAX_ITERATIONS.value,
                                   ExitReason.BUDGET_EXHAUSTED.value,
                                   ExitReason.TERMINAL_PROVIDER_ERROR.value}
                                  | {r.value for r in CONTEXT_PRESSURE_EXITS})


@checker("dropped_call_reprompts", ("LOOP-7",),
         "a reply that promised tool calls and had none, narration included, is re-prompted, "
         "at most [3] times in a row; a landed tool round starts the count over")
def dropped_call_reprompts(obs: Observation) -> list[Violation]:
    limit = obs.limits.dropped_toolcall_retries_max
    exits = exit_reasons(obs)
    stopped = {turn for _, turn in loop_fire.interrupted(obs)}  # the user, a lost lease
    out: list[Violation] = []
    for turn_id, records in calls_by_turn(obs).items():
        problems = [f"the request of effect {after.seq} {problem}" for before, after
                    in pairwise(records)
                    if (problem := _reprompt_problem(before, after, limit)) is not None]
        last, reason = records[-1], exits.get(turn_id)
        if (dropped_call(last.reply) and last.cut is None and not is_grace(last)
                and reason is not None and nudges_since_tool(last) < limit
                and reason not in _STOPPED_FROM_OUTSIDE
                and not (reason == ExitReason.INTERRUPTED.value and turn_id in stopped)
                and not stopped_at_the_bound(obs, turn_id)):
            # silence is a finding: no request followed, and nothing outside the reply stopped it
            problems.append(f"the dropped tool call of effect {last.seq} ended the turn as "
                            f"{reason} instead of being re-prompted")
        out.extend(Violation("dropped_call_reprompts", "LOOP-7", f"turn {turn_id}: {problem}")
                   for problem in problems)
    return out


def _reprompt_problem(before: CallRecord, after: CallRecord, limit: int) -> str | None:
    """What is wrong with the request that followed ``before``, or None."""
    if after.request is before.request:
        return None  # a retry of the same request, after a provider error
    sent, prior = nudges_since_tool(after), nudges_since_tool(before)
    if sent > limit:
        return f"sends {sent} dropped-call re-prompts in a row (limit {limit})"
    if before.cut is not None:  # a correction cut the reply: the loop never read it, and the
        # iteration starts over on the correction (LOOP-4), with no re-prompt for that reply
        return (f"re-prompts the reply of effect {before.seq}, which a correction cut"
                if sent > prior else None)
    if dropped_call(before.reply) and prior < limit and sent != prior + 1:
        return f"does not re-prompt the dropped tool call of effect {before.seq}"
    return None


@checker("arguments_checked_before_run", ("LOOP-9",),
         "calls with unusable JSON never run: cut-off ones end the turn truncated, malformed "
         "ones are asked for again and recorded, with errors, only on the last try")
def arguments_checked_before_run(obs: Observation) -> list[Violation]:
    """Judged per turn: a call id counts as stored or run only within the turn that replied
    with it, since ids repeat across turns and sessions. The tries are counted over the
    replies the loop read: one a correction cut neither counts nor resets the count."""
    out: list[Violation] = []
    ran: dict[str | None, set[str]] = defaultdict(set)
    for entry in obs.ledger:
        found = call_row_of(obs, entry)
        if found is not None:
            ran[found[0][1]].add(entry.call_id)
    exits = exit_reasons(obs)
    limit = obs.limits.invalid_json_retries_max
    for turn_id, records in calls_by_turn(obs).items():
        stored = {c.id for m in obs.rows_of_turn(turn_id) for c in m.tool_calls}
        streak = 0
        for record in records:
            bad = bad_calls(record.reply)
            read = record.cut is None  # a reply a correction cut never reached the loop (LOOP-4)
            if read and bad and record.reply and not cut_off(record.reply, bad):
                streak += 1
            elif read and record.reply is not None and record.reply.tool_calls:
                streak = 0  # a round whose arguments all parse resets the count
            if not bad or record.reply is None:
                continue
            ids = {c.id for c in bad}
            tag = f"turn {turn_id}, reply at effect {record.seq}"
            if ids & ran[turn_id]:
                out.append(_v9(f"{tag}: a call with unusable arguments ran"))
            if record.request.purpose == "grace":
                continue  # the grace summary's tool calls are ignored whatever their JSON
            if loop_fire.unprocessable(record.reply):  # no try at all: the turn stops at once
                if ids & stored:  # (LOOP-5, local_bug_stops_at_once), and records nothing
                    out.append(_v9(f"{tag}: an unprocessable call was recorded"))
                continue
            if record.cut is not None:
                continue  # a correction cut the reply: the iteration starts over without it (LOOP-4)
            if cut_off(record.reply, bad):
                ended = exits.get(turn_id, "truncated_tool_call")
                went_on = ended != "truncated_tool_call" and not (
                    ended == "interrupted" and _stopped_before_the_reply(record, records))
                if ids & stored or went_on:
                    out.append(_v9(f"{tag}: a cut-off call was recorded or the turn went on "
                                   f"(exit {exits.get(turn_id)})"))
            elif streak < limit and ids & stored:
                out.append(_v9(f"{tag}: malformed try {streak} of {limit} was recorded"))
            elif streak >= limit and not ids & stored and not _write_prevented(obs, record, exits):
                out.append(_v9(f"{tag}: malformed try {streak} of {limit} was not recorded"))
    return out


def _stopped_before_the_reply(record: CallRecord, records: list[CallRecord]) -> bool:
    """The user's stop or a lost lease cut this call while the turn waited on it (the
    world marks the call it cut: ``CallRecord.stopped``), so its reply never reached the
    turn, and the turn made no call after it. Such a turn ends interrupted (FIN-4); it had
    no cut-off call to end on. A stop that came after the reply arrived marks nothing."""
    return record is records[-1] and record.stopped is not None


def _write_prevented(obs: Observation, record: CallRecord, exits: dict[str, str | None]) -> bool:
    """The row could not be written: the process died after the reply, or the store refused."""
    crashed = any(seq > record.seq for seq in obs.crash_seqs)
    return crashed or exits.get(record.turn_id) == ExitReason.PERSISTENCE_FAILED.value


def _v9(message: str) -> Violation:
    return Violation("arguments_checked_before_run", "LOOP-9", message)
