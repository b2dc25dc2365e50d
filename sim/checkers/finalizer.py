"""Checkers of the finalizer: the grace summary, the failure boundary, no silent stop, the
answer delivered, the exit line."""

from __future__ import annotations

from collections import defaultdict

from hermes_ref.finalizer import MUTATION_FOOTER
from hermes_ref.limits import Limits
from hermes_ref.models import Event, Role, ToolCall
from hermes_ref.outcomes import CONTEXT_PRESSURE_EXITS, FAILED_EXITS, ExitReason
from hermes_ref.tool_specs import scoped_path
from sim.checkers.base import (
    Observation,
    Violation,
    call_rows,
    calls_by_turn,
    checker,
    distinct_requests,
    is_grace,
    round_landed,
    tool_replies,
)
from sim.world import CallRecord

# ---- finalizer ---------------------------------------------------------------------------


@checker("grace_summary", ("FIN-1",),
         "a turn that ran out of budget without an answer makes exactly one grace call, "
         "tool-less, as its last call")
def grace_summary(obs: Observation) -> list[Violation]:
    if not obs.limits.grace_call_enabled:
        return []
    by_turn = calls_by_turn(obs)
    out = []
    for event in obs.events("turn.exit"):
        records = by_turn.get(event.turn_id, [])
        if not _ran_out(obs.limits, event, records):
            continue
        graces = distinct_requests([r for r in records if is_grace(r)])
        if len(graces) != 1:
            problem = f"made {len(graces)} grace calls"
        elif graces[0].tools:
            problem = f"offered {len(graces[0].tools)} tools to its grace call"
        elif not is_grace(records[-1]):
            problem = f"called the model again at effect {records[-1].seq} after its grace call"
        else:
            continue
        out.append(Violation("grace_summary", "FIN-1",
                             f"turn {event.turn_id} ran out of budget without an answer and {problem}"))
    return out


BUDGET_END_REASONS = frozenset({ExitReason.MAX_ITERATIONS.value, ExitReason.BUDGET_EXHAUSTED.value,
                                ExitReason.PENDING_TOOL_RESULT.value})


def _ran_out(limits: Limits, event: Event, records: list[CallRecord]) -> bool:
    """The loop stopped at its bound (calls or budget), not on an answer or a failure of its own."""
    if event.data.get("reason") not in BUDGET_END_REASONS:
        return False
    regular = len(distinct_requests([r for r in records if not is_grace(r)]))
    used, budget = event.data.get("budget_used"), event.data.get("budget_max")
    at_budget = isinstance(used, int) and isinstance(budget, int) and used >= budget
    return regular >= limits.max_iterations or at_budget


@checker("failure_boundary", ("FIN-5",),
         "a failed turn whose exit reports no cleanup errors ends on an assistant row "
         "(context-pressure failures excepted)")
def failure_boundary(obs: Observation) -> list[Violation]:
    exits = {e.turn_id: e.data for e in obs.events("turn.exit")}
    pressure = {r.value for r in CONTEXT_PRESSURE_EXITS}
    out = []
    for done in obs.events("turn.completed"):
        data = exits.get(done.turn_id)
        if not done.data.get("failed") or data is None or data.get("reason") in pressure:
            continue
        rows = obs.rows_of_turn(done.turn_id)
        if data.get("cleanup_errors", 0) == 0 and rows and rows[-1].role is not Role.ASSISTANT:
            out.append(Violation("failure_boundary", "FIN-5",
                                 f"failed turn {done.turn_id} ({data.get('reason')}) left an open "
                                 f"tail: its last row #{rows[-1].row_id} is a {rows[-1].role.value} row"))
    return out


@checker("no_silent_stop", ("FIN-8",),
         "a turn that stops on the landed tool round of its last reply, with no grace call, fails "
         "pending_tool_result with an explanatory answer (unless the loop already failed it)")
def no_silent_stop(obs: Observation) -> list[Violation]:
    exits = {e.turn_id: e.data.get("reason") for e in obs.events("turn.exit")}
    loud = {r.value for r in FAILED_EXITS} - {ExitReason.PENDING_TOOL_RESULT.value}
    by_turn = calls_by_turn(obs)
    out = []
    for done in obs.events("turn.completed"):
        records = by_turn.get(done.turn_id, [])
        last = records[-1] if records else None
        if last is None or not tool_replies([last]) or any(is_grace(r) for r in records):
            continue
        reason, failed = exits.get(done.turn_id), bool(done.data.get("failed"))
        if not round_landed(obs, last) or (failed and reason in loud):
            continue
        final = done.data.get("final_response")
        explained = isinstance(final, str) and bool(final.strip())
        if reason != ExitReason.PENDING_TOOL_RESULT.value or not failed or not explained:
            out.append(Violation("no_silent_stop", "FIN-8",
                                 f"turn {done.turn_id} stopped on the tool results of its reply at "
                                 f"effect {last.seq} as {reason} (failed={failed}, "
                                 f"answer {final!r})"))
    return out


@checker("answer_delivered", ("FIN-6",),
         "a turn whose model gave a final text completes with that text, whatever failed after")
def answer_delivered(obs: Observation) -> list[Violation]:
    out = []
    completions = {e.turn_id: e for e in obs.events("turn.completed")}
    last_call: dict[str, CallRecord] = {}
    for call in obs.calls:
        last_call[call.turn_id] = call
    for turn_id, call in last_call.items():
        reply = call.reply
        if reply is None or reply.tool_calls or not (reply.content or "").strip():
            continue
        if any(seq > call.seq for seq in obs.crash_seqs):
            continue  # the process died after this call; a later turn owns the repair
        done = completions.get(turn_id)
        if done is None:
            out.append(Violation("answer_delivered", "FIN-6",
                                 f"turn {turn_id} got a final answer but never completed"))
        elif not _same_answer(done.data.get("final_response"), reply.content):
            out.append(Violation("answer_delivered", "FIN-6",
                                 f"turn {turn_id} completed with a different answer than the "
                                 "model gave"))
    return out


def _same_answer(delivered: object, given: str | None) -> bool:
    """The model's text, possibly followed by the engine's bracketed notes (TOOL-9 footer)."""
    return isinstance(delivered, str) and given is not None and (
        delivered == given or delivered.startswith(given + "\n\n["))


@checker("exit_line", ("FIN-7",),
         "one exit line per turn; WARNING exactly when it ends on an uninterrupted tool result")
def exit_line(obs: Observation) -> list[Violation]:
    out = []
    required = {"level", "reason", "api_calls", "budget_used", "last_role", "response_len"}
    exits = obs.events("turn.exit")
    seen: set[str] = set()
    for event in exits:
        data = event.data
        if event.turn_id in seen:
            out.append(Violation("exit_line", "FIN-7", f"turn {event.turn_id} logged two exits"))
        seen.add(event.turn_id)
        missing = required - set(data)
        if missing:
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {event.turn_id} exit line lacks {sorted(missing)}"))
            continue
        tool_tail = data["last_role"] == Role.TOOL.value and not data.get("interrupted", False)
        want = "WARNING" if tool_tail else "INFO"
        if data["level"] != want:
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {event.turn_id} ended on {data['last_role']} but logged "
                                 f"{data['level']}"))
        tail = _durable_tail_of_turn(obs, event)
        if tail is not None and tail != data["last_role"]:
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {event.turn_id} logged last_role={data['last_role']} "
                                 f"but its durable tail is {tail}"))
    return out


def _durable_tail_of_turn(obs: Observation, event: Event) -> str | None:
    """The role of the session's last row among rows written up to this turn's end."""
    last: str | None = None
    for stored in obs.record.messages:
        if stored.session_id != event.session_id:
            continue
        if stored.message.turn_id == event.turn_id:
            last = stored.message.role.value
    return last


@checker("failed_writes_reported", ("TOOL-9",),
         "a delivered answer lists the writes of its turn that failed and were not redone")
def failed_writes_reported(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    turn_of = {c.id: m.turn_id for m in call_rows(obs) for c in m.tool_calls}
    last: dict[str, dict[str, str]] = defaultdict(dict)  # turn -> path -> last outcome
    for entry in obs.ledger:
        path = scoped_path(ToolCall(id=entry.call_id, name=entry.name, arguments=entry.arguments))
        turn_id = turn_of.get(entry.call_id)
        if entry.name in ("write_file", "patch") and path is not None and turn_id is not None:
            last[turn_id][path] = entry.outcome
    for event in obs.events("turn.completed"):
        final = event.data.get("final_response")
        if event.data.get("failed") or not isinstance(final, str):
            continue
        failed = sorted(p for p, outcome in last.get(event.turn_id, {}).items() if outcome == "error")
        footer = final.rsplit(MUTATION_FOOTER, 1)[1] if MUTATION_FOOTER in final else None
        if failed and (footer is None or any(p not in footer for p in failed)):
            out.append(Violation("failed_writes_reported", "TOOL-9",
                                 f"turn {event.turn_id} answered without reporting failed "
                                 f"writes to {', '.join(failed)}"))
        elif not failed and footer is not None:
            out.append(Violation("failed_writes_reported", "TOOL-9",
                                 f"turn {event.turn_id} reports failed writes that did not fail"))
    return out
