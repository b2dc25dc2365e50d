"""What each exit reason stands for, read from the record (LOOP-3).

Theory of operation
-------------------
An exit reason is a claim about the turn. Membership in the closed set proves little: an
engine that logs every turn as ``text_response`` would pass it. So each reason is judged
against what the world itself recorded: the provider's call log, the durable rows of the
turn, the store writes the world failed, and the turn's completion. ``reason_problem``
returns why the record contradicts the claim, or None.

Two reasons have weaker evidence, said where they are judged: a preflight refusal sends
no request, so its ``terminal_provider_error`` can only be matched against its own detail
text; and where the runs are unknown (the real-crash journals), a persistence failure
cannot be matched against the faults the world injected.
"""

from __future__ import annotations

from collections.abc import Callable

from hermes_ref.models import ProviderReply, Role, ToolCall
from hermes_ref.outcomes import FAILED_EXITS, ExitLine, ExitReason
from hermes_ref.scaffolding import DROPPED_TOOLCALL_NUDGE
from sim.checkers import loop_fire, thoughts
from sim.checkers.base import (
    Observation,
    TurnView,
    charged_requests,
    invalid_streak_at_end,
    is_grace,
    refunded_rounds,
)
from sim.checkers.intake import taken_in_text
from sim.checkers.streaming import whole_answer  # FIN-2: a recovered stream answered
from sim.checkers.wire import sent_messages
from sim.world import CallRecord


def bad_calls(reply: ProviderReply | None) -> list[ToolCall]:
    """The reply's calls whose arguments are not a JSON object."""
    return [c for c in (reply.tool_calls if reply else ()) if c.parsed_arguments() is None]


def cut_off(reply: ProviderReply, bad: list[ToolCall]) -> bool:
    """Arguments cut off by the output limit, not merely malformed."""
    return reply.finish_reason == "length" or any(
        c.arguments.rstrip() and c.arguments.rstrip()[-1] not in "}]" for c in bad)


def _budgeted(view: TurnView) -> list[CallRecord]:
    return [c for c in view.calls if not is_grace(c)]


def _last_reply(view: TurnView) -> CallRecord | None:
    budgeted = _budgeted(view)
    return budgeted[-1] if budgeted else None


def _text(reply: ProviderReply | None) -> bool:
    """A reply in text and no call: text shown to the reader, not only a think block."""
    return reply is not None and not reply.tool_calls and bool(thoughts.visible_text(reply.content))


def nudges_since_tool(call: CallRecord) -> int:
    """Dropped-call re-prompts the call's recorded body sent after its last tool result."""
    sent = sent_messages(call)
    count = 0
    tool, user = Role.TOOL.value, Role.USER.value  # read once: an enum's value is a property
    for message in reversed(sent if isinstance(sent, list) else []):
        if message.get("role") == tool:
            break
        if message.get("role") == user and message.get("content") == DROPPED_TOOLCALL_NUDGE:
            count += 1
    return count


def dropped_call(reply: ProviderReply | None) -> bool:
    """A reply that promised tool calls and carried none, whatever text it narrated."""
    return reply is not None and reply.finish_reason == "tool_calls" and not reply.tool_calls


def _could_answer(obs: Observation, call: CallRecord) -> bool:
    """The call gave text the engine takes as the turn's answer: a reply in text and no call,
    or a whole answer its failed stream delivered (FIN-2). Not a reply a correction cut
    (LOOP-4: the iteration starts over without it), nor a dropped call with re-prompts
    left (LOOP-7: its narration is scaffolding and the re-prompt is due)."""
    if call.cut is not None:
        return False
    if whole_answer(call) is not None:
        return True
    if not _text(call.reply):
        return False
    return not (dropped_call(call.reply)
                and nudges_since_tool(call) < obs.limits.dropped_toolcall_retries_max)


def _text_response(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    last = _last_reply(view)
    recovered = loop_fire.recovered_answer(obs, view)  # LOOP-8's first two rungs answer an empty reply
    if last is None or not (_text(last.reply) or whole_answer(last) is not None  # FIN-2
                            or recovered is not None):
        return "its last model reply was not a text answer"
    done = view.completion
    if done is None or done.failed or not (done.final_response or "").strip():
        return "it did not complete with a delivered answer"
    answers = [m for m in view.rows if m.role is Role.ASSISTANT and m.has_visible_text
               and not m.tool_calls]
    if not answers and line.cleanup_errors == 0:
        return "no assistant row of the turn holds the answer"
    return None


def _max_iterations(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    regular = charged_requests(_budgeted(view))
    if regular != obs.limits.max_iterations:
        return f"it made {regular} budgeted calls, not max_iterations={obs.limits.max_iterations}"
    return _summary_problem(obs, view)


def grace_texts(view: TurnView) -> list[str]:
    """What the turn's grace summary said: its reply's text, or the whole answer its
    stream delivered before it failed, which the engine recovers as it does any (FIN-2)."""
    out = []
    for call in view.calls:
        if not is_grace(call):
            continue
        text = call.reply.content if call.reply is not None else whole_answer(call)
        if (text or "").strip():
            out.append(text or "")
    return out


def _summary_problem(obs: Observation, view: TurnView) -> str | None:
    """A budget exit delivers, as a success, only what its grace summary said (FIN-1)."""
    done = view.completion
    if done is None or done.failed:
        return None
    said = [taken_in_text(text) for text in grace_texts(view)]
    # FIN-1: an answer held back for verification, overruled by a correction or not: LOOP-3
    # asks only that the model said it; whether it was still owed is FIN-1's to judge
    said += loop_fire.withheld_answers(view, obs)
    answer = done.final_response or ""
    given = answer.strip()  # delivered as it came: whitespace at its edges is no difference
    if not any(given == text.strip() or (given.startswith(text.strip())
                                         and given[len(text.strip()):].lstrip().startswith("["))
               for text in said if text):
        return "it delivered as a success an answer no grace summary gave"
    return None


def _budget_exhausted(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    regular = charged_requests(_budgeted(view))
    used = regular - refunded_rounds(view)
    if used < obs.limits.iteration_budget:
        return f"it spent {used} of {obs.limits.iteration_budget} budget units"
    return _summary_problem(obs, view)


def _pending_tool_result(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    """The turn's durable rows end on tool results (then at most the boundary row), and no
    reply of the turn, grace summary included, gave text that could have answered."""
    rows = view.rows
    tools = [i for i, m in enumerate(rows) if m.role is Role.TOOL]
    if not tools:
        return "the turn recorded no tool result"
    after = rows[tools[-1] + 1:]
    if len(after) > 1 or any(m.tool_calls or m.role is not Role.ASSISTANT for m in after):
        return "rows other than a boundary row follow its last tool result"
    if any(_could_answer(obs, c) for c in view.calls):
        return "a model reply of the turn answered in text"
    return None


def _persistence_failed(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    if view.run is not None and view.run.write_failures == 0:
        return "no store write failed during it"
    return None


def _empty_exhausted(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    last = _last_reply(view)
    reply = last.reply if last is not None else None
    if reply is None or reply.tool_calls or (reply.content or "").strip():
        return "its last model reply was not empty"
    return None


def _terminal_provider_error(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    last = view.calls[-1] if view.calls else None
    if last is not None and last.error is not None:
        return None
    if line.detail.startswith("context_overflow"):
        return None  # preflight refused to send: no request exists to show it (weak evidence)
    return "its last model call did not fail"


def _invalid_tool_calls(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    streak = invalid_streak_at_end(obs, view.calls)
    if streak < obs.limits.invalid_tool_rounds_max:
        return f"only {streak} all-invalid rounds end it (limit {obs.limits.invalid_tool_rounds_max})"
    return None


def _truncated(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    last = _last_reply(view)
    reply = last.reply if last is not None else None
    bad = bad_calls(reply)
    if reply is None or not bad or not cut_off(reply, bad):
        return "its last reply had no cut-off tool call"
    return None


def _lease_timeout(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    if view.rows or view.calls:
        return "it wrote rows or called the model, so it held the lease"
    return None


def _interrupted(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    """A lost lease (LEASE-4) or the user (FIN-4): the world must have seen one of them."""
    if (view.session_id, view.turn_id) not in loop_fire.interrupted(obs):
        return "nobody interrupted it: its lease was never lost and the user did not stop it"
    return None


def _local_processing_error(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    last = view.calls[-1] if view.calls else None
    if last is None or not loop_fire.unprocessable(last.reply):
        return "its last model reply was one this engine can process"
    return None


def _compression_exhausted(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    """CMP-7: failed closed. Its last call was refused as too long, or the request it never
    sent did not fit (then only its detail says so: weak evidence, as for a refusal)."""
    last = view.calls[-1] if view.calls else None
    if last is not None and last.error == "ContextOverflow":
        return None
    if line.detail.startswith("context_overflow"):
        return None
    return "no provider overflow and no over-window request stopped it"


def _compression_timeout(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    """CMP-7: a summary call of the turn timed out, and the request did not fit without it."""
    timed_out = [c for c in obs.summary_calls or () if c.turn_id == view.turn_id
                 and c.error == "ProviderTimeout"]
    if not timed_out:
        return "no summary call of the turn timed out"
    return _compression_exhausted(obs, view, line)


Judge = Callable[[Observation, TurnView, ExitLine], str | None]

JUDGES: dict[ExitReason, Judge] = {
    ExitReason.TEXT_RESPONSE: _text_response,
    ExitReason.MAX_ITERATIONS: _max_iterations,
    ExitReason.BUDGET_EXHAUSTED: _budget_exhausted,
    ExitReason.PENDING_TOOL_RESULT: _pending_tool_result,
    ExitReason.PERSISTENCE_FAILED: _persistence_failed,
    ExitReason.EMPTY_RESPONSE_EXHAUSTED: _empty_exhausted,
    ExitReason.TERMINAL_PROVIDER_ERROR: _terminal_provider_error,
    ExitReason.INVALID_TOOL_CALLS: _invalid_tool_calls,
    ExitReason.TRUNCATED_TOOL_CALL: _truncated,
    ExitReason.LEASE_TIMEOUT: _lease_timeout,
    ExitReason.INTERRUPTED: _interrupted,
    ExitReason.LOCAL_PROCESSING_ERROR: _local_processing_error,
    ExitReason.COMPRESSION_EXHAUSTED: _compression_exhausted,  # CMP-7
    ExitReason.COMPRESSION_TIMEOUT: _compression_timeout,
}


def reason_problem(obs: Observation, view: TurnView, line: ExitLine) -> str | None:
    """Why the record contradicts the turn's exit reason, or None when it bears it out."""
    judge = JUDGES.get(line.reason)
    if judge is None:
        return "this engine has no path to that exit"
    problem = judge(obs, view, line)
    done = view.completion
    if problem is None and done is not None and line.reason in FAILED_EXITS and not done.failed \
            and not loop_fire.held_answer_stood(obs, view):  # FIN-6: the held answer stood
        problem = "its completion does not say it failed"
    return problem
