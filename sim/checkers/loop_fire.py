"""Checkers of the loop under fire, each judged from the world's call log and the record.

Theory of operation
-------------------
Which decision the loop took is visible in what followed it: the request after an empty
reply ends on a nudge, on the model's reasoning handed back as a prefill, repeats the
same messages, or goes to another model; the turn's completion holds the streamed or
the earlier text, or the ``(empty)`` sentinel. ``empty_ladder_in_order`` reads that
*observed* rung from the recorded bodies, derives the rung the ladder's order demands
from the same record with counters of its own, and requires the two to agree, for every
empty reply (a reply that nothing explains is a finding: silence never passes).

The others read the same way: the models the world was asked (LOOP-6), the world's
own log of credential renewals and of what the user did to a running turn
(``World.interventions``: LOOP-5, LOOP-4, FIN-4), the stored rows of interrupted and
redirected turns, and the number of calls each turn made against a bound derived from
the limits (liveness).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from hermes_ref.closure import NOT_RUN_TEXT
from hermes_ref.finalizer import HELD_BACK_NOTE, MUTATION_FOOTER
from hermes_ref.limits import Limits
from hermes_ref.models import ProviderReply, Role
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS, ExitLine, ExitReason
from hermes_ref.scaffolding import (
    DROPPED_TOOLCALL_NUDGE,
    EMPTY_AFTER_TOOLS_NUDGE,
    EMPTY_SENTINEL,
    PRE_VERIFY_NUDGE,
)
from sim.checkers import lineage
from sim.checkers.base import (
    Observation,
    TurnKey,
    TurnView,
    Violation,
    all_invalid,
    bound_spent,
    charged_requests,
    checker,
    is_grace,
    ran_in,
    refunded_rounds,
    round_landed,
    route_chain,
    window_tokens,
    wrote_in,
)
from sim.checkers.intake import taken_in_text
from sim.checkers.lease import lost_leases
from sim.checkers.measure import wire_tokens
from sim.checkers.thoughts import inline_thought, thought_of, visible_text
from sim.checkers.wire import sent_messages
from sim.interventions import raw_partial
from sim.world import CallRecord

# ---- shared readings ----------------------------------------------------------------------


def user_interrupted(obs: Observation) -> set[TurnKey]:
    """(session, turn) of every turn the user interrupted while it ran (the world's log)."""
    return {(i.session_id, i.turn_id) for i in obs.interventions
            if i.what == "interrupt" and i.turn_id is not None}


def interrupted(obs: Observation) -> set[TurnKey]:
    """Turns something outside stopped: the user, or the loss of their lease (LEASE-4)."""
    return user_interrupted(obs) | {(s, t) for s, t in lost_leases(obs)}


def _drained(obs: Observation, view: TurnView) -> list[str]:
    return [i.text for i in obs.interventions
            if i.what == "drained" and (i.session_id, i.turn_id) == (view.session_id, view.turn_id)]


def took_in_after(obs: Observation, view: TurnView, seq: int, before: int | None = None) -> bool:
    """Whether the turn took a correction in after the effect ``seq`` (and before the
    effect ``before``, when given): its user row then stands after whatever that effect
    left (LOOP-4)."""
    return any(i.what == "drained" and i.seq > seq and (before is None or i.seq < before)
               and (i.session_id, i.turn_id) == (view.session_id, view.turn_id)
               for i in obs.interventions)


def _is_empty(reply: ProviderReply | None) -> bool:
    return reply is not None and not reply.tool_calls and not visible_text(reply.content)


def _messages(call: CallRecord) -> list[dict[str, Any]]:
    sent = sent_messages(call)
    return sent if isinstance(sent, list) else []


def model_of(call: CallRecord) -> str:
    try:
        body = call.sent
    except ValueError:
        return ""
    return str(body.get("model", "")) if isinstance(body, dict) else ""


def _budgeted(view: TurnView) -> list[CallRecord]:
    return [c for c in view.calls if not is_grace(c) and c.cut is None]


def withheld_answers(view: TurnView, obs: Observation | None = None, *,
                     standing: bool = False) -> list[str]:
    """Texts the turn's replies gave that the next request held back for verification
    (FIN-1's gate): that request ends on the pre-verify nudge after the text. Given the
    observation, also the answer the gate held when the budget left no next request.

    ``standing``: only those still the turn's to deliver, none that a correction the turn
    took in after it overruled (it answered what the user asked before: LOOP-4). What the
    model said is all of them; what the budget's end or a failed check owes the user is
    the standing ones (FIN-1, FIN-6)."""
    return [text for call, text in held_calls(view, obs)
            if not standing or obs is None or not took_in_after(obs, view, call.seq)]


def held_calls(view: TurnView, obs: Observation | None = None) -> list[tuple[CallRecord, str]]:
    """The calls whose answers the gate held back, each with the text held
    (``withheld_answers``, which reads them)."""
    held: list[tuple[CallRecord, str]] = []
    calls = view.calls
    for call, nxt in pairwise(calls):
        sent = _messages(nxt)
        text = _answer_text(call)
        if text and len(sent) >= 2 and sent[-1].get("content") == PRE_VERIFY_NUDGE \
                and (sent[-2].get("content") or "").strip() == text.strip():
            held.append((call, text))
    last = _held_at_the_end(obs, view) if obs is not None and not held else None
    if last is not None:
        held.append((calls[-1], last))
    return held


def delivers_held(answer: str | None, held: list[str]) -> bool:
    """``answer`` is one of the ``held`` answers as delivered: the very text, or that text
    with the engine's note of the file changes that did not apply, which TOOL-9 adds to
    whatever answer the turn delivers. Whitespace at the edges is no difference: an answer
    is delivered as it came (FIN-7 counts it so), and a held text is read stripped."""
    if answer is None:
        return False
    given = answer.strip()
    return any(given == text.strip() or (given.startswith(text.strip()) and given[
        len(text.strip()):].lstrip().startswith(MUTATION_FOOTER)) for text in held)


def _budget_ended(obs: Observation, view: TurnView) -> bool:
    """The turn's budget or call cap ended it: its exit reason says so, or says it stopped
    on a tool result (FIN-8 overrules the budget's reason) with the bound spent, as the
    provider's log counts it."""
    line = view.exit
    if line is None:
        return False
    return line.reason in (ExitReason.MAX_ITERATIONS, ExitReason.BUDGET_EXHAUSTED) or (
        line.reason is ExitReason.PENDING_TOOL_RESULT and bound_spent(obs, view))


PRESSURE_EXITS = (ExitReason.COMPRESSION_TIMEOUT, ExitReason.COMPRESSION_EXHAUSTED)

# The failures of the check the gate asked for, after which the answer it held back must
# still stand (FIN-6): the request could not be sent or relieved (context pressure), the
# provider refused it or failed past its retries, the model's replies to it ran the empty
# ladder out, could not be processed, cut a tool call off, or named tools that do not
# exist round after round. Not an interrupt or a lost lease (the turn ends
# ``interrupted``: LEASE-4 overrules), nor a failed write, which is the store's failure.
CHECK_FAILURES = frozenset({*PRESSURE_EXITS, ExitReason.TERMINAL_PROVIDER_ERROR,
                            ExitReason.EMPTY_RESPONSE_EXHAUSTED,
                            ExitReason.LOCAL_PROCESSING_ERROR, ExitReason.TRUNCATED_TOOL_CALL,
                            ExitReason.INVALID_TOOL_CALLS})


def held_answer_stood(obs: Observation, view: TurnView) -> bool:
    """FIN-6 when the check failed: the gate held an answer back, the check it asked for
    failed (``CHECK_FAILURES``), and the held answer stood, as at the budget's end (FIN-1).
    The record shows all of it: the exit says the answer was held back, the completion
    delivers, not failed, an answer the turn's calls show held back. Such a turn is the
    one exit of those reasons that is not a failure."""
    line, done = view.exit, view.completion
    return line is not None and line.reason in CHECK_FAILURES \
        and line.detail.endswith(HELD_BACK_NOTE) and done is not None and not done.failed \
        and delivers_held(done.final_response, withheld_answers(view, obs, standing=True))


def stood_row_ids(obs: Observation, view: TurnView) -> set[int]:
    """The row the finalizer wrote for a held answer that stood (``held_answer_stood``): the
    turn's last row, written after the preflight that refused the turn's request, so no
    row of the list that preflight measured (the answer rode there in the gate's pair)."""
    if not held_answer_stood(obs, view) or not view.rows or view.completion is None:
        return set()
    last = view.rows[-1]
    answer = last.role is Role.ASSISTANT and not last.tool_calls \
        and last.content == view.completion.final_response
    return {last.row_id or 0} if answer else set()


def _held_at_the_end(obs: Observation, view: TurnView) -> str | None:
    """The gate's hold with no request after it: the turn's last call answered in text
    after a landed round that wrote, and the budget or the call cap ended the turn there,
    or context pressure did, refusing the request that would have asked for the check."""
    calls = _budgeted(view)
    ended = _budget_ended(obs, view) or (view.exit is not None
                                         and view.exit.reason in PRESSURE_EXITS)
    if not obs.limits.verify_before_answer or not calls or not ended:
        return None
    wrote = wrote_in(obs, calls[:-1])
    text = _answer_text(calls[-1])
    if text is None or calls[-1] is not view.calls[-1] or not wrote \
            or _reprompt_due(obs.limits, calls[-1]):
        return None
    return text


def _answer_text(call: CallRecord) -> str | None:
    """The visible text a call answered with and no tool call: its reply's, or the whole
    answer its failed stream had delivered, which the engine takes as a reply (FIN-2), and
    so may hold back for verification like any. The text as the engine took it in: a lone
    surrogate the provider sent is U+FFFD in the held answer (``intake.taken_in_text``)."""
    from sim.checkers.streaming import whole_answer  # streaming reads this module

    reply = call.reply
    if reply is not None:
        return None if reply.tool_calls else visible_text(taken_in_text(reply.content)) or None
    whole = whole_answer(call)
    return visible_text(taken_in_text(whole)) or None if whole is not None else None


def _reprompt_due(limits: Limits, call: CallRecord) -> bool:
    """The call was a dropped call (``finish_reason=tool_calls``, no call) with re-prompts
    left: its narration is no answer, and the re-prompt is due (LOOP-7), so the gate held
    nothing back. Past the re-prompts' bound the engine takes the text as it is."""
    reply = call.reply
    if reply is None or reply.finish_reason != "tool_calls" or reply.tool_calls:
        return False
    nudges = 0
    for message in reversed(_messages(call)):
        if message.get("role") == Role.TOOL.value:
            break
        nudges += message.get("role") == Role.USER.value and message.get("content") == DROPPED_TOOLCALL_NUDGE
    return nudges < limits.dropped_toolcall_retries_max


def recovered_answer(obs: Observation, view: TurnView) -> str | None:
    """The answer the ladder's first two rungs take from the record: the visible text the
    last reply streamed, or the text of the housekeeping round before it (LOOP-8)."""
    calls = _budgeted(view)
    if not calls or not _is_empty(calls[-1].reply):
        return None
    last = calls[-1].reply
    assert last is not None
    streamed = visible_text(last.streamed_text)
    if streamed:
        return streamed
    return _prior_text(calls, len(calls) - 1, _landed(obs, calls))


def _landed(obs: Observation, calls: list[CallRecord]) -> set[int]:
    """The calls whose tool round the turn recorded, results and all (by ``id``): a reply
    with malformed arguments that was asked again never became a round (LOOP-9)."""
    return {id(c) for c in calls if c.reply is not None and c.reply.tool_calls
            and round_landed(obs, c)}


# LOOP-8's housekeeping tools, as the source notes name them (memory, todo, todo_list,
# skill_manage, session_search): a round of only these whose reply had text lets the
# ladder reuse that text (the engine's own list is not read here)
HOUSEKEEPING = frozenset({"memory", "todo", "todo_list", "skill_manage", "session_search"})


def _prior_text(calls: list[CallRecord], index: int, landed: set[int]) -> str | None:
    for earlier in reversed(calls[:index]):
        reply = earlier.reply
        if reply is not None and reply.tool_calls and id(earlier) in landed:
            text = visible_text(reply.content)
            names = {c.name for c in reply.tool_calls}
            return text if text and names <= HOUSEKEEPING else None
    return None


# ---- LOOP-8: the empty-reply ladder ----------------------------------------------------------


class _Walk:
    """The ladder's counters, as the record shows them so far in one turn."""

    def __init__(self) -> None:
        self.tool_rounds = 0
        self.nudged_round = -1  # the tool round the last nudge answered
        self.corrected_round = -1  # the tool round the last correction came after (LOOP-4)
        self.prefills = 0
        self.retries = 0
        self.switches = 0

    def expected(self, limits: Limits, calls: list[CallRecord], index: int,
                 landed: set[int]) -> str:
        reply = calls[index].reply
        assert reply is not None
        if visible_text(reply.streamed_text):
            return "streamed"
        if self.tool_rounds and self.corrected_round != self.tool_rounds \
                and _prior_text(calls, index, landed) is not None:
            return "prior_text"  # the round's text, unless the user has spoken since
        if self.tool_rounds and self.nudged_round != self.tool_rounds \
                and not inline_thought(reply.content):
            return "nudge"
        if thought_of(reply) and self.prefills < limits.thinking_prefill_retries_max:
            return "prefill"
        if self.retries < limits.empty_retries_max:
            return "retry"
        if self.switches < len(limits.fallback_providers):
            return "fallback"
        return "sentinel"

    def corrected(self) -> None:
        """The turn took a correction in: the round before it is no longer the last thing
        the reply follows, so its text is no answer; the other counters count per turn."""
        self.corrected_round = self.tool_rounds

    def took(self, rung: str) -> None:
        if rung == "nudge":
            self.nudged_round = self.tool_rounds
        elif rung == "prefill":
            self.prefills += 1
        elif rung == "retry":
            self.retries += 1
        elif rung == "fallback":
            self.switches += 1
            self.retries = 0


def rung_due_last(obs: Observation, view: TurnView,
                  to_the_ladder: Callable[[CallRecord], bool]) -> str | None:
    """The rung the ladder demands after the turn's last budgeted reply, when that reply
    went to the ladder (``to_the_ladder``: an empty reply, not one LOOP-7 re-prompts); None
    otherwise. The replies before it are walked as the ladder demands (a turn that strayed
    from it is ``empty_ladder_in_order``'s finding). Only the ``fallback`` rung moves the
    turn to another route; the nudge after a tool round, a prefill and a retry ask the same
    route again (LOOP-8)."""
    calls = _budgeted(view)
    if not calls or not to_the_ladder(calls[-1]):
        return None
    landed, walk = _landed(obs, calls), _Walk()
    want: str | None = None
    for index, call in enumerate(calls):
        if index and took_in_after(obs, view, calls[index - 1].seq, before=call.seq):
            walk.corrected()
        if id(call) in landed and not all_invalid(call):  # a round the tools ran
            walk.tool_rounds += 1
        if to_the_ladder(call):
            want = walk.expected(obs.limits, calls, index, landed)
            walk.took(want)
    return want


REFUSED = "refused by preflight"
PREFILL_OR_RETRY = "prefill or retry"  # the same request again, ending on the same prefill
# rungs whose next request differs from the one just sent, so preflight may refuse it (a
# retry resends a request that fitted)
SENDING_RUNGS = frozenset({"nudge", "prefill", "fallback"})
# what ``_observed`` reads off a next model call of the turn (the rest: no call followed)
_NEXT_CALL = frozenset({"fallback", "nudge", "prefill", "retry", PREFILL_OR_RETRY, "unexplained"})


def _held_over_the_sentinel(view: TurnView) -> bool:
    """The ladder ran out while the gate held an answer back: the sentinel ended the turn,
    and the held answer stood in its place (FIN-6), not failed, the detail saying so. The
    empty replies answered the request that asked for the check, so the hold is read from
    that request (``withheld_answers``)."""
    line, done = view.exit, view.completion
    return line is not None and line.detail.endswith(HELD_BACK_NOTE) and done is not None \
        and not done.failed and delivers_held(done.final_response, withheld_answers(view))


def _no_rung_could_follow(line: ExitLine, at_bound: bool) -> bool:
    """The turn was out of budget before the next rung, or stopped from outside. A budget
    exit that rests on a tool result is named ``pending_tool_result`` (FIN-8 overrules the
    budget's reason), so that reason counts too when the bound was reached at the reply."""
    if line.reason in (ExitReason.MAX_ITERATIONS, ExitReason.BUDGET_EXHAUSTED,
                       ExitReason.INTERRUPTED):
        return True
    return at_bound and line.reason is ExitReason.PENDING_TOOL_RESULT


def _observed(view: TurnView, calls: list[CallRecord], index: int,
              landed: set[int], at_bound: bool = True) -> str | None:
    """The rung the record shows after the empty reply at ``index`` (None: not judged)."""
    call, reply = calls[index], calls[index].reply
    assert reply is not None
    following = [c for c in view.calls[view.calls.index(call) + 1:] if c.cut is None]
    nxt = following[0] if following else None
    line, done = view.exit, view.completion
    if nxt is not None and is_grace(nxt) and at_bound:
        return None  # the loop reached its bound: FIN-1's grace call comes instead of a rung
    if nxt is None or is_grace(nxt):
        if line is None or _no_rung_could_follow(line, at_bound):
            return None
        if nxt is None and refused_by_preflight(view):
            return REFUSED  # preflight refused the request the rung built (CMP-7 judges it)
        answer = done.final_response if done is not None else None
        if line.reason is ExitReason.TEXT_RESPONSE and answer:
            if answer == visible_text(reply.streamed_text):
                return "streamed"
            if answer == _prior_text(calls, index, landed):
                return "prior_text"
        if line.reason is ExitReason.EMPTY_RESPONSE_EXHAUSTED and (
                answer == EMPTY_SENTINEL or _held_over_the_sentinel(view)):
            return "sentinel"
        return "unexplained"
    if model_of(nxt) != model_of(call):
        return "fallback"
    sent, before = _messages(nxt), _messages(call)
    if sent == before:  # the very request again (a nudged request retried stays nudged)
        return _again(sent, thought_of(reply))
    if len(sent) >= 2 and sent[-1].get("content") == EMPTY_AFTER_TOOLS_NUDGE \
            and sent[-2].get("content") == EMPTY_SENTINEL:
        return "nudge"
    thought = thought_of(reply)
    if sent and thought and sent[-1].get("role") == Role.ASSISTANT.value \
            and sent[-1].get("content") == thought:
        return "prefill"
    return "unexplained"


def _again(sent: list[dict[str, Any]], thought: str) -> str:
    """The rung a request sent again unchanged shows: a retry, unless it ends on a prefill
    of the very reasoning the reply carried. A prefill takes the place of the one before
    it, so a model that reasons the same words twice is prefilled into the same request a
    retry would send, and the record cannot tell the two rungs apart."""
    if sent and thought and sent[-1].get("role") == Role.ASSISTANT.value \
            and sent[-1].get("content") == thought:
        return PREFILL_OR_RETRY
    return "retry"


def _resolved(seen: str, want: str) -> str:
    """The observed rung, an ambiguous one read as the rung due when it is either."""
    if seen == PREFILL_OR_RETRY:
        return want if want in ("prefill", "retry") else "retry"
    return seen


@checker("empty_ladder_in_order", ("LOOP-8",),
         "after every empty (or reasoning-only) reply the record shows the rung the ladder's "
         "order demands: streamed text, earlier text, nudge, prefill, retry, fallback, sentinel")
def empty_ladder_in_order(obs: Observation) -> list[Violation]:
    out = []
    for view in obs.ended_turns():
        if any(c.reply is not None and c.reply.finish_reason == "tool_calls"
               and not c.reply.tool_calls for c in view.calls):
            continue  # a dropped-call re-prompt (LOOP-7) steers these turns
        calls = _budgeted(view)
        landed = _landed(obs, calls)
        walk = _Walk()
        for index, call in enumerate(calls):
            reply = call.reply
            if index and took_in_after(obs, view, calls[index - 1].seq, before=call.seq):
                walk.corrected()
            if id(call) in landed and not all_invalid(call):  # a round the tools ran
                walk.tool_rounds += 1
            if not _is_empty(reply):
                continue
            # a call a correction cut was sent and paid for too (LOOP-2)
            spent = charged_requests(view.calls[:view.calls.index(call) + 1])
            at_bound = spent >= obs.limits.max_iterations or \
                spent - refunded_rounds(view) >= obs.limits.iteration_budget
            seen = _observed(view, calls, index, landed, at_bound)
            if seen is None:
                break
            want = walk.expected(obs.limits, calls, index, landed)
            nxt = calls[index + 1].seq if index + 1 < len(calls) else None
            if took_in_after(obs, view, call.seq, before=nxt):
                # a correction taken in before the next call dropped the rung's scaffolding
                # and added its own rows (LOOP-4), so the next request cannot show a nudge,
                # a prefill or a retry; a fallback it still shows, as the next call's route.
                # The counters move as the ladder demands: they count per turn
                if seen in _NEXT_CALL and (seen == "fallback") != (want == "fallback"):
                    went = "to another route" if seen == "fallback" else "to the same route"
                    out.append(Violation("empty_ladder_in_order", "LOOP-8",
                                         f"turn {view.key}: after the empty reply at effect "
                                         f"{call.seq} and a correction the next call went "
                                         f"{went}, the ladder demands {want}"))
                    break
                walk.took(want)
                continue
            seen = _resolved(seen, want)
            if seen == REFUSED and want in SENDING_RUNGS:
                break  # the rung due builds a request, and that request is what preflight refused
            if seen != want:
                out.append(Violation("empty_ladder_in_order", "LOOP-8",
                                     f"turn {view.key}: after the empty reply at effect {call.seq} "
                                     f"the record shows {seen}, the ladder demands {want}"))
                break
            walk.took(seen)
    return out


# ---- LOOP-6: fallback providers ------------------------------------------------------------


@checker("fallback_routes", ("LOOP-6",),
         "a turn starts on the primary, moves down the fallback chain only, and every request "
         "to a fallback fits that fallback's window by its own token count")
def fallback_routes(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    chain = route_chain(obs.limits)
    routes = {r.model: r for r in obs.limits.fallback_providers}
    for view in obs.ended_turns():
        tag = f"turn {view.key}"
        position = 0
        for n, call in enumerate(view.calls):
            model = model_of(call)
            where = chain.index(model) if model in chain else -1
            if n == 0 and where != 0:
                out.append(_v6(f"{tag} began on {model!r}, not the primary {chain[0]!r}"))
                break
            if where < position or where > position + 1:
                out.append(_v6(f"{tag} went from {chain[position]!r} to {model!r} at effect "
                               f"{call.seq}: not the next route of the chain"))
                break
            position = where
            route = routes.get(model)
            if route is not None:
                tokens = wire_tokens(_messages(call)) * route.token_ratio
                if tokens > route.context_window_tokens:
                    out.append(_v6(f"{tag} sent {tokens:.0f} tokens to {model!r} at effect "
                                   f"{call.seq}, past its {route.context_window_tokens}-token window"))
        out.extend(_v6(f"{tag}: {p}") for p in _spent_without_switch(obs, view, chain))
    return out


_TRANSIENT = ("ProviderServerError", "ProviderTimeout", "RateLimited")


def _spent_without_switch(obs: Observation, view: TurnView, chain: list[str]) -> list[str]:
    """A route whose retries were spent must hand over to the next one, if there is one.

    Only the transient failures of a request spend its ``transient_retries_max`` retries
    (LOOP-5): an auth error before them is answered by a credential renewal, which is no
    retry, so the request still has all its retries after it."""
    from sim.checkers.streaming import failed_calls  # streaming reads this module

    limits = obs.limits
    calls = view.calls
    for n, call in enumerate(calls):
        if call.error not in _TRANSIENT:
            continue
        same = [c for c in calls[:n + 1] if c.request is call.request and c.error in _TRANSIENT]
        if len(same) <= limits.transient_retries_max:
            continue
        model = model_of(call)
        has_next = model in chain and chain.index(model) + 1 < len(chain)
        if not has_next or failed_calls(calls[:n + 1]) >= limits.outer_loop_errors_max:
            continue
        nxt = calls[n + 1] if n + 1 < len(calls) else None
        following = chain[chain.index(model) + 1]
        if nxt is None and (refused_by_preflight(view) or _stopped_before_sending(view) or
                            _grace_refused_on(obs, view, call, following)):
            continue  # switched, and preflight refused the rebuilt request for the fallback
        if nxt is None or model_of(nxt) == model:
            return [f"{model!r} failed {len(same)} times on one request (retries spent) and "
                    f"the next call did not go to {following!r}"]
    return []


def _grace_refused_on(obs: Observation, view: TurnView, call: CallRecord, model: str) -> bool:
    """The spent request was the grace call, the turn's exit line says a grace call was not
    sent, and that request is over the window of ``model`` (the next route) in the engine's
    estimate: the grace call is asked again of the fallback as it was, so the turn switched
    and preflight refused it there (CMP-7 judges every request that was sent)."""
    line = view.exit
    if call.request.purpose != "grace" or line is None or "grace call not sent" not in line.detail:
        return False
    return wire_tokens(_messages(call)) > window_tokens(obs.limits, model)


def _stopped_before_sending(view: TurnView) -> bool:
    """The turn was interrupted (its lease lost, or the user stopped it) and sent nothing
    more: a switch made at once after the spent call leaves no trace then, and a request
    never sent goes to no route (LEASE-4, FIN-4)."""
    line = view.exit
    return line is not None and line.reason is ExitReason.INTERRUPTED


def refused_by_preflight(view: TurnView) -> bool:
    """The turn ended because preflight would not send its next request (CMP-7)."""
    line = view.exit
    return line is not None and (line.reason in CONTEXT_PRESSURE_EXITS
                                 or line.detail.startswith("context_overflow"))


def _v6(message: str) -> Violation:
    return Violation("fallback_routes", "LOOP-6", message)


# ---- LOOP-5: auth refresh, the local bug, the error cap -----------------------------------


def _renewals(obs: Observation) -> dict[TurnKey, list[int]]:
    """The effect of every credential renewal, by the turn it was made for. A renewal names
    the session the turn ran on then, which after a rotation is a child (CMP-5): it is
    filed under the lineage root, as the turn and its calls are."""
    root = lineage.roots(obs.record)
    out: dict[TurnKey, list[int]] = {}
    for i in obs.interventions:
        if i.what == "credentials" and i.turn_id is not None:
            key = (root.get(i.session_id, i.session_id), i.turn_id)
            out.setdefault(key, []).append(i.seq)
    return out


@checker("credentials_renewed_once", ("LOOP-5",),
         "an auth error is tried again only after the world renewed the credentials, once "
         "per request, and never more often than auth_refreshes_max")
def credentials_renewed_once(obs: Observation) -> list[Violation]:
    out = []
    renewed = _renewals(obs)
    for view in obs.ended_turns():
        renewals = renewed.get((view.session_id, view.turn_id), [])
        calls = view.calls
        for n, call in enumerate(calls):
            if call.error != "ProviderAuthError":
                continue
            # the next call to the same route, whatever request it carries: a rebuilt
            # request (the iteration started over) still goes out on those credentials
            nxt = next((c for c in calls[n + 1:] if model_of(c) == model_of(call)), None)
            if nxt is None:
                continue
            between = [s for s in renewals if call.seq <= s < nxt.seq]
            if len(between) != 1:
                out.append(Violation("credentials_renewed_once", "LOOP-5",
                                     f"turn {view.key} called {model_of(call)!r} again at effect "
                                     f"{nxt.seq} after an auth error at effect {call.seq} with "
                                     f"{len(between)} credential renewals between"))
        per_request: dict[int, int] = {}
        for call in calls:
            if call.error == "ProviderAuthError":
                per_request[id(call.request)] = per_request.get(id(call.request), 0) + 1
        if any(n > obs.limits.auth_refreshes_max + 1 for n in per_request.values()):
            out.append(Violation("credentials_renewed_once", "LOOP-5",
                                 f"turn {view.key} retried an auth error past auth_refreshes_max"))
    return out


def unprocessable(reply: ProviderReply | None) -> bool:
    """A reply no retry can make processable: arguments nested past the parser's limit."""
    for call in reply.tool_calls if reply is not None else ():
        try:
            json.loads(call.arguments)
        except RecursionError:
            return True
        except ValueError:
            continue
    return False


@checker("local_bug_stops_at_once", ("LOOP-5",),
         "a reply the engine cannot process ends the turn local_processing_error at once: "
         "no later call, no tool run; and that exit names such a reply")
def local_bug_stops_at_once(obs: Observation) -> list[Violation]:
    out = []
    for view in obs.ended_turns():
        # a reply a correction cut never reached the loop, which got the correction (LOOP-4)
        bad = [c for c in view.calls if c.cut is None and unprocessable(c.reply)]
        line = view.exit
        reason = line.reason if line is not None else None
        if bad and bad[0] is view.calls[-1] and reason is ExitReason.INTERRUPTED \
                and bad[0].stopped is not None:
            continue  # the user or a lost lease cut that very call: nothing after it (FIN-4)
        if bad and (bad[0] is not view.calls[-1] or reason is not ExitReason.LOCAL_PROCESSING_ERROR):
            later = len(view.calls) - view.calls.index(bad[0]) - 1
            shown = reason.value if reason is not None else None
            out.append(Violation("local_bug_stops_at_once", "LOOP-5",
                                 f"turn {view.key} got an unprocessable reply at effect "
                                 f"{bad[0].seq}, then made {later} more calls and ended {shown}"))
        elif not bad and reason is ExitReason.LOCAL_PROCESSING_ERROR:
            out.append(Violation("local_bug_stops_at_once", "LOOP-5",
                                 f"turn {view.key} ended local_processing_error on no such reply"))
    return out


# ---- FIN-4: interrupted turns close their tool sequence ------------------------------------


@checker("interrupted_turns_closed", ("FIN-4",),
         "a turn the user interrupted ends interrupted, and its durable rows give every call "
         "exactly one result and end on no dangling call")
def interrupted_turns_closed(obs: Observation) -> list[Violation]:
    out = []
    stopped = user_interrupted(obs)
    lost = lost_leases(obs)
    for view in obs.ended_turns():
        key = (view.session_id, view.turn_id)
        line = view.exit
        if key in stopped and line is not None and line.reason is not ExitReason.INTERRUPTED \
                and not (view.calls and is_grace(view.calls[-1])):
            out.append(_v4f(f"turn {view.key} was interrupted by the user but ended "
                            f"{line.reason.value}"))
        if line is None or line.reason is not ExitReason.INTERRUPTED or key in lost:
            continue  # a lost lease writes nothing more (LEASE-4): its closure is the next turn's
        problem = _open_sequence(view)
        if problem is not None:
            out.append(_v4f(f"interrupted turn {view.key}: {problem}"))
    return out


def _open_sequence(view: TurnView) -> str | None:
    """What leaves the turn's tool sequence open, or None.

    A provider that numbers its calls per request may send one id in two rounds of a turn
    (TOOL-3 lets ids repeat across rounds), so each call is answered by the results that
    follow its own row, up to the next row that makes a call under the same id.
    """
    for i, row in enumerate(view.rows):
        for call in row.tool_calls:
            results = 0
            for later in view.rows[i + 1:]:
                if any(c.id == call.id for c in later.tool_calls):
                    break  # the id's next round: what follows answers that call
                if later.role is Role.TOOL and later.tool_call_id == call.id:
                    results += 1
            if results != 1:
                return f"call {call.id} has {results} results"
    tail = view.rows[-1] if view.rows else None
    if tail is not None and tail.tool_calls:
        return f"it ends on the dangling call row #{tail.row_id}"
    return None


def _v4f(message: str) -> Violation:
    return Violation("interrupted_turns_closed", "FIN-4", message)


@checker("interrupted_calls_told_truly", ("TOOL-3",),
         "in a turn the user interrupted, a call the tool world started never gets a result "
         "saying it was not run: its effect may have happened")
def interrupted_calls_told_truly(obs: Observation) -> list[Violation]:
    out = []
    stopped = user_interrupted(obs)
    for view in obs.ended_turns():
        key = (view.session_id, view.turn_id)
        if key not in stopped:
            continue
        started = {e.call_id for e in obs.ledger if ran_in(obs, e) == key}
        for row in view.rows:
            if row.role is Role.TOOL and row.tool_call_id in started \
                    and (row.content or "").startswith(NOT_RUN_TEXT.split(":")[0]):
                out.append(Violation("interrupted_calls_told_truly", "TOOL-3",
                                     f"turn {view.key}: call {row.tool_call_id} ran in the tool "
                                     f"world, but its result row #{row.row_id} says it was not run"))
    return out


# ---- LOOP-4: corrections and reasoning ----------------------------------------------------


@checker("corrections_taken_in", ("LOOP-4",),
         "a correction the turn took in is a user row of it; a reply a correction cut is "
         "stored as its visible text, or hidden; no stored row carries a reply's reasoning")
def corrections_taken_in(obs: Observation) -> list[Violation]:
    out = []
    lost = lost_leases(obs)
    for view in obs.ended_turns():
        rows = view.rows
        users = [m.content for m in rows if m.role is Role.USER]
        fenced = (view.session_id, view.turn_id) in lost  # LEASE-4: it writes nothing more
        for text in () if fenced else _drained(obs, view):
            if not any(u is not None and text in u for u in users):
                out.append(_v4(f"turn {view.key} took in the correction {text[:30]!r} and "
                               "stored no user row holding it"))
        for call in view.calls:
            if call.cut is not None and not _drained(obs, view) and view.exit is not None \
                    and view.exit.reason is not ExitReason.INTERRUPTED:
                out.append(_v4(f"turn {view.key}: a correction cut the call at effect "
                               f"{call.seq} and the turn never took it in"))
        if not fenced and view.exit is not None and view.exit.reason is not ExitReason.INTERRUPTED:
            out.extend(_v4(f"turn {view.key}: {p}") for p in _skipped_corrections(obs, view))
        out.extend(_v4(f"turn {view.key}: {p}") for p in _reasoning_stored(view))
        out.extend(_v4(f"turn {view.key}: {p}") for p in _cut_work_rows(view))
    out.extend(_v4(p) for p in _hidden_rows_sent(obs))
    return out


def _hidden_rows_sent(obs: Observation) -> list[str]:
    """A hidden row marks where a correction cut a reply that showed nothing; it is never
    replayed, so no request carries it. On the wire it would be an assistant message with
    no text and no call right before the correction's user row: that pair is looked for in
    every recorded body, for each correction the record holds after a hidden row."""
    after_hidden: set[str] = set()
    previous = None
    for stored in lineage.written(obs.record):
        row = stored.message
        if previous is not None and previous.hidden and row.role is Role.USER and row.content:
            after_hidden.add(row.content)
        previous = row
    if not after_hidden:
        return []
    out = []
    for call in obs.calls:
        sent = _messages(call)
        for message, nxt in pairwise(sent):
            if message.get("role") == Role.ASSISTANT.value and not message.get("content") \
                    and not message.get("tool_calls") and nxt.get("role") == Role.USER.value \
                    and nxt.get("content") in after_hidden:
                out.append(f"call at effect {call.seq} (turn {call.turn_id}) sends the hidden row "
                           f"before the correction {str(nxt.get('content'))[:30]!r}")
                break
    return out


def _cut_work_rows(view: TurnView) -> list[str]:
    """The work a correction cut gets an assistant row of its own, before the correction's
    user row: the visible part of the reply the call was streaming when it was cut (as the
    world streamed it: ``raw_partial``), or, when nothing of it was visible, a hidden row
    with no text. Work that was not a call (a tool round the correction waited on) gets
    an assistant row too, so a correction row never follows a user or tool row.

    Each user row of the turn after its first is a correction it took in (the turn's own
    message opens it; rows a compaction copied are not the turn's). A cut call's
    correction is the first of them written after the call was made (its watermark):
    the turn drains the queue before its next call. A record without such a row says
    nothing here: whether the correction had to be taken in is judged above."""
    rows = view.rows
    corrections = [i for i, m in enumerate(rows) if m.role is Role.USER][1:]
    out = []
    for i in corrections:
        before = rows[i - 1]
        if before.role is not Role.ASSISTANT or before.tool_calls:
            out.append(f"its correction row #{rows[i].row_id} follows the {before.role.value} "
                       f"row #{before.row_id}: the work the correction cut got no assistant row")
    for call in view.calls:
        if call.cut is None:
            continue
        taken = next((i for i in corrections if (rows[i].row_id or 0) > call.watermark), None)
        if taken is None or rows[taken - 1].role is not Role.ASSISTANT:
            continue
        kept, shown = rows[taken - 1], visible_text(raw_partial(call.reply))
        if shown and (kept.hidden or kept.content != shown):
            out.append(f"the call at effect {call.seq} was cut after it showed {shown[:30]!r}, "
                       f"but row #{kept.row_id} before the correction holds "
                       f"{(kept.content or '')[:30]!r}{' hidden' if kept.hidden else ''}")
        elif not shown and not (kept.hidden and not kept.content):
            out.append(f"the call at effect {call.seq} was cut before it showed any text, but "
                       f"row #{kept.row_id} before the correction is not a hidden row without text")
    return out


def _skipped_corrections(obs: Observation, view: TurnView) -> list[str]:
    """A correction sent to the turn before one of its later model calls: the top of that
    call's iteration drains the queue (a grace call counts as an iteration, LOOP-1), so a
    turn that made the call and never took the correction in skipped it. Nor may a turn
    that its budget ended leave one untaken that was sent after the gate held an answer
    back: leaving the loop takes it in, since it overrules the held answer."""
    drained = _drained(obs, view)
    holds = [c.seq for c, _ in held_calls(view, obs)]
    out = []
    for sent in obs.interventions:
        if sent.what != "redirect" or sent.turn_id != view.turn_id or sent.text in drained:
            continue
        later = [c.seq for c in view.calls if c.seq > sent.seq]
        held = [seq for seq in holds if seq < sent.seq]
        if later:
            out.append(f"the correction {sent.text[:30]!r} was sent before the call at effect "
                       f"{later[0]} and never taken in")
        elif held and _budget_ended(obs, view):  # it overrules the held answer, so leaving
            # the loop at its bound takes it in (FIN-1)
            out.append(f"the correction {sent.text[:30]!r} was sent while the gate held the "
                       f"answer of the call at effect {held[-1]} and never taken in")
    return out


def _reasoning_stored(view: TurnView) -> list[str]:
    thoughts = {thought_of(c.reply) for c in view.calls if c.reply is not None}
    thoughts = {t for t in thoughts if len(t) >= 6}
    for row in view.rows:
        for stored in (row.content or "", row.api_content or ""):
            for thought in thoughts:
                if thought in stored:
                    return [f"row #{row.row_id} stores the reasoning {thought[:30]!r}"]
            if "<think>" in stored.lower():
                return [f"row #{row.row_id} stores a think block"]
    return []


def _v4(message: str) -> Violation:
    return Violation("corrections_taken_in", "LOOP-4", message)


# ---- FIN-1: an answer held back for verification -------------------------------------------


@checker("withheld_answer_reused", ("FIN-1",),
         "a turn that ran out of budget after its answer was held back for verification "
         "delivers that answer, with no summary call")
def withheld_answer_reused(obs: Observation) -> list[Violation]:
    out = []
    for view in obs.ended_turns():
        held = withheld_answers(view, obs, standing=True)
        if not held:
            continue
        done = view.completion
        graces = [c for c in view.calls if is_grace(c)]  # the held answer stands in for one
        answer = done.final_response if done is not None else None
        if graces or (_budget_ended(obs, view) and not delivers_held(answer, held[-1:])):
            out.append(Violation("withheld_answer_reused", "FIN-1",
                                 f"turn {view.key} ran out of budget with the answer "
                                 f"{held[-1][:30]!r} held back, and delivered {answer!r} after "
                                 f"{len(graces)} summary calls"))
    return out


@checker("overruled_answer_not_delivered", ("FIN-1",),
         "an answer the verification gate held back is not delivered once a correction the "
         "turn took in after it overruled it, unless the model gave it again since")
def overruled_answer_not_delivered(obs: Observation) -> list[Violation]:
    """The held answer answered what the user asked before the correction (LOOP-4): at the
    budget's end the turn owes a summary instead, and a failed check leaves no answer to
    stand. Read from the provider's log (the hold, the calls after the correction) and
    the world's log of corrections taken in."""
    out = []
    for view in obs.ended_turns():
        done = view.completion
        if done is None or done.failed or view.exit is None:
            continue
        overruled = [text for call, text in held_calls(view, obs)
                     if took_in_after(obs, view, call.seq)]
        if not overruled or not delivers_held(done.final_response, overruled):
            continue
        since = _taken_in_at(obs, view)
        again = [t for c in view.calls if c.seq > since and (t := _answer_text(c)) is not None]
        if not delivers_held(done.final_response, again):
            out.append(Violation("overruled_answer_not_delivered", "FIN-1",
                                 f"turn {view.key} ended {view.exit.reason.value} delivering "
                                 f"the held answer {overruled[-1][:30]!r}, which a correction "
                                 "it took in had overruled"))
    return out


def _taken_in_at(obs: Observation, view: TurnView) -> int:
    """The effect at which the turn last took a correction in (0: never)."""
    return max((i.seq for i in obs.interventions if i.what == "drained"
                and (i.session_id, i.turn_id) == (view.session_id, view.turn_id)), default=0)


# ---- liveness: every turn ends within a bound the limits give --------------------------------


def call_bound(limits: Limits, tool_rounds: int) -> tuple[int, int, int]:
    """(answered calls, failed calls, empty replies) one turn may make at most.

    Each iteration sends at most one request that gets a reply, plus one grace call; failed
    calls stop at ``outer_loop_errors_max`` (an overflow is compaction's to bound, CMP-7, and
    not counted here); the ladder answers at most one nudge per tool round, the prefills,
    and per route its retries and one switch or the sentinel.
    """
    answered = limits.max_iterations + 1
    failed = limits.outer_loop_errors_max
    routes = 1 + len(limits.fallback_providers)
    empties = tool_rounds + limits.thinking_prefill_retries_max + routes * (limits.empty_retries_max + 1)
    return answered, failed, empties


@checker("turns_end_within_bound", ("LOOP-5", "LOOP-8"),
         "every turn that ended made no more calls than its limits allow: answered calls, "
         "failed calls and empty replies each within a bound derived from the limits")
def turns_end_within_bound(obs: Observation) -> list[Violation]:
    from sim.checkers.streaming import failed_calls  # streaming reads this module

    out = []
    for view in obs.ended_turns():
        if _drained(obs, view):
            continue  # a correction starts the ladder over
        calls = [c for c in view.calls if c.cut is None]
        rounds = sum(1 for c in calls if c.reply is not None and c.reply.tool_calls)
        answered_max, failed_max, empties_max = call_bound(obs.limits, rounds)
        failed = failed_calls(calls)
        answered = len(calls) - failed
        empties = sum(1 for c in calls if _is_empty(c.reply) and not is_grace(c)
                      and c.reply is not None and c.reply.finish_reason != "tool_calls")
        tag = f"turn {view.key}"
        if failed > failed_max:
            out.append(Violation("turns_end_within_bound", "LOOP-5",
                                 f"{tag} made {failed} failed calls, past the bound {failed_max}"))
        if empties > empties_max or answered > answered_max:
            out.append(Violation("turns_end_within_bound", "LOOP-8",
                                 f"{tag} got {empties} empty replies in {answered} answered calls, "
                                 f"past the bounds {empties_max} and {answered_max}"))
    return out
