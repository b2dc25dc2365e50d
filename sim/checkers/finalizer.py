"""Checkers of the finalizer: the grace summary, the failure boundary, no silent stop, the
answer delivered, the exit line."""

from __future__ import annotations

from collections import defaultdict
from functools import partial

from hermes_ref.finalizer import MUTATION_FOOTER
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role, ToolCall, ToolKind
from hermes_ref.outcomes import FAILED_EXITS, ExitLine, ExitReason
from hermes_ref.ports import LedgerEntry
from hermes_ref.tool_specs import TOOLS_BY_NAME
from sim.checkers import lineage, loop_fire, thoughts
from sim.checkers.base import (
    Observation,
    TurnKey,
    Violation,
    call_row_of,
    charged_requests,
    checker,
    distinct_requests,
    grace_calls,
    grace_would_not_fit,
    is_grace,
    remembered,
    round_landed,
    tool_replies,
)
from sim.checkers.intake import taken_in_text
from sim.checkers.reasons import dropped_call, grace_texts, nudges_since_tool
from sim.checkers.rules import scoped_path
from sim.world import CallRecord, RaisedRun

# ---- finalizer ---------------------------------------------------------------------------


@checker("grace_summary", ("FIN-1",),
         "a turn that ran out of budget without an answer makes exactly one grace call, "
         "tool-less, as its last call")
def grace_summary(obs: Observation) -> list[Violation]:
    if not obs.limits.grace_call_enabled:
        return []
    out = []
    for view in obs.ended_turns():
        records = view.calls
        if view.exit is None or not _ran_out(obs.limits, view.exit, records):
            continue
        if loop_fire.withheld_answers(view, obs, standing=True):
            continue  # an answer held back for verification stands in for it (withheld_answer_reused)
        graces = distinct_requests([r for r in records if is_grace(r)])
        if not graces and grace_would_not_fit(obs, view):
            continue  # preflight refused the grace request: it did not fit the window (CMP-7)
        if grace_calls(records) != 1:  # sent again on the fallback after a hop: still one
            problem = f"made {grace_calls(records)} grace calls"
        elif any(g.tools for g in graces):
            problem = f"offered {len(graces[0].tools)} tools to its grace call"
        elif not is_grace(records[-1]):
            problem = f"called the model again at effect {records[-1].seq} after its grace call"
        else:
            continue
        out.append(Violation("grace_summary", "FIN-1",
                             f"turn {view.key} ran out of budget without an answer and {problem}"))
    return out


BUDGET_END_REASONS = frozenset({ExitReason.MAX_ITERATIONS, ExitReason.BUDGET_EXHAUSTED,
                                ExitReason.PENDING_TOOL_RESULT})


def _ran_out(limits: Limits, line: ExitLine, records: list[CallRecord]) -> bool:
    """The loop stopped at its bound (calls or budget), not on an answer or a failure of its own."""
    if line.reason not in BUDGET_END_REASONS:
        return False
    regular = charged_requests(records)
    return regular >= limits.max_iterations or line.budget_used >= line.budget_max


# FIN-5's exception, as the catalog names it: the failures caused by context pressure. Kept
# here rather than read from the engine (``outcomes.CONTEXT_PRESSURE_EXITS``), so an engine
# that widened its own list to skip a boundary row it owes is judged, not excused.
PRESSURE_FAILURES = frozenset({ExitReason.COMPRESSION_TIMEOUT, ExitReason.COMPRESSION_EXHAUSTED})


@checker("failure_boundary", ("FIN-5",),
         "a failed turn whose exit reports no cleanup errors ends on an assistant row "
         "(context-pressure failures excepted)")
def failure_boundary(obs: Observation) -> list[Violation]:
    out = []
    for view in obs.ended_turns():
        done, line = view.completion, view.exit
        if done is None or line is None or not done.failed \
                or line.reason in PRESSURE_FAILURES:
            continue
        rows = view.rows
        if line.cleanup_errors == 0 and rows and rows[-1].role is not Role.ASSISTANT:
            out.append(Violation("failure_boundary", "FIN-5",
                                 f"failed turn {view.key} ({line.reason.value}) left an open "
                                 f"tail: its last row #{rows[-1].row_id} is a {rows[-1].role.value} row"))
    return out


@checker("next_turn_opens_on_a_closed_tail", ("FIN-5",),
         "a turn's user row never follows an open tail: what an earlier turn left open (its "
         "user row after a context-pressure failure or a crash, a call without its result) "
         "is closed, boundary row included, before the next turn's own row")
def next_turn_opens_on_a_closed_tail(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    copied = obs.copied_row_ids
    for session_id in obs.record.session_ids():
        previous: Message | None = None
        opened: set[str] = set()
        for row in obs.record.transcript(session_id):
            opener = row.role is Role.USER and row.turn_id is not None \
                and row.turn_id not in opened and row.row_id not in copied
            if row.role is Role.USER and row.turn_id is not None:
                opened.add(row.turn_id)
            if opener and previous is not None \
                    and (previous.role is not Role.ASSISTANT or previous.tool_calls):
                out.append(Violation(
                    "next_turn_opens_on_a_closed_tail", "FIN-5",
                    f"{session_id}: turn {row.turn_id}'s user row #{row.row_id} follows the "
                    f"open {previous.role.value} row #{previous.row_id} of "
                    f"{previous.turn_id or 'the seed'}: the tail was never closed"))
            previous = row
    return out


LOUD_FAILURES = FAILED_EXITS - {ExitReason.PENDING_TOOL_RESULT}


@checker("no_silent_stop", ("FIN-8",),
         "a turn whose last budgeted reply was a landed tool round and that got no text after it "
         "(no grace summary either) and took no correction in after it fails "
         "pending_tool_result with an explanatory answer, unless the loop already failed it")
def no_silent_stop(obs: Observation) -> list[Violation]:
    out = []
    lost = loop_fire.interrupted(obs)  # FIN-8 spares an interrupted turn: a lost lease, the user
    for view in obs.ended_turns():
        line = view.exit
        if line is not None and line.reason is ExitReason.INTERRUPTED \
                and (view.session_id, view.turn_id) in lost:
            continue
        if view.completion is not None and loop_fire.delivers_held(
                view.completion.final_response, loop_fire.withheld_answers(view, obs)):
            continue  # FIN-1: the answer held back for verification was delivered
        budgeted = [r for r in view.calls if not is_grace(r)]
        last = budgeted[-1] if budgeted else None
        if last is None or not tool_replies([last]) or not round_landed(obs, last):
            continue
        if grace_texts(view):
            continue  # the grace summary answered (FIN-2: a whole streamed one too): not silent
        if loop_fire.took_in_after(obs, view, last.seq):
            continue  # a correction taken in after the round: the tail is the user's word
        done, line = view.completion, view.exit
        reason = line.reason if line is not None else None
        failed = done is not None and done.failed
        if failed and reason in LOUD_FAILURES:
            continue
        final = done.final_response if done is not None else None
        explained = bool(final and final.strip())
        if reason is not ExitReason.PENDING_TOOL_RESULT or not failed or not explained:
            shown = reason.value if reason is not None else None
            out.append(Violation("no_silent_stop", "FIN-8",
                                 f"turn {view.key} stopped on the tool results of its reply at "
                                 f"effect {last.seq} as {shown} (failed={failed}, "
                                 f"answer {final!r})"))
    return out


@checker("answer_delivered", ("FIN-6",),
         "a turn whose model gave a final text completes with that text, whatever failed after")
def answer_delivered(obs: Observation) -> list[Violation]:
    out = []
    # a turn fenced off after its lease went delivers nothing (LEASE-4), nor one the user
    # stopped (FIN-4): the reply that came too late is not the answer
    lost = loop_fire.interrupted(obs)
    raised = [v for v in obs.turns.values() if isinstance(v.run, RaisedRun)]  # their answer is lost too
    for view in [*obs.ended_turns(), *raised]:
        if (view.session_id, view.turn_id) in lost:
            continue
        call = view.calls[-1] if view.calls else None
        reply = call.reply if call is not None and call.cut is None else None  # cut: no answer (LOOP-4)
        if call is None or reply is None or reply.tool_calls or not thoughts.visible_text(reply.content):
            continue  # no call, or a reply that only reasoned (a think block): no answer
        if _narrated_with_reprompts_left(obs, call):
            continue  # it narrated a dropped call with re-prompts left (LOOP-7): no answer
        if any(seq > call.seq for seq in obs.crash_seqs) and view.run is None:
            continue  # the process died after this call; a later turn owns the repair
        done = view.completion
        if done is None:
            how = ", then the engine raised out of it" if isinstance(view.run, RaisedRun) else ""
            out.append(Violation("answer_delivered", "FIN-6",
                                 f"turn {view.key} got a final answer{how} but never completed"))
        elif not _same_answer(done.final_response,  # think blocks are never delivered (LOOP-4)
                              taken_in_text(thoughts.as_stored(reply.content))):
            out.append(Violation("answer_delivered", "FIN-6",
                                 f"turn {view.key} completed with a different answer than the "
                                 "model gave"))
    out.extend(_held_answers_kept(obs, lost))
    return out


def _held_answers_kept(obs: Observation, lost: set[tuple[str, str | None]]) -> list[Violation]:
    """The answer the gate held back is the model's answer too: a turn whose check failed
    before the model answered again (context pressure refused the request, the provider
    refused it, the empty ladder ran out...: ``loop_fire.CHECK_FAILURES``) delivers it, not
    failed, even when the model had gone on to check its work with a tool round first (its
    last call is then no answer, and the reading above passes it by). Which texts were
    held is read from the provider's log (``loop_fire.withheld_answers``)."""
    out = []
    for view in obs.ended_turns():
        line, done = view.exit, view.completion
        if line is None or line.reason not in loop_fire.CHECK_FAILURES or done is None \
                or (view.session_id, view.turn_id) in lost:
            continue
        held = loop_fire.withheld_answers(view, obs, standing=True)
        if held and (done.failed or not loop_fire.delivers_held(done.final_response, held)):
            out.append(Violation("answer_delivered", "FIN-6",
                                 f"turn {view.key} ended {line.reason.value} while the gate "
                                 f"held the answer {held[-1]!r:.40}, and lost it"))
    return out


@checker("result_carries_the_answer", ("FIN-6",),
         "the result a turn hands its caller holds the answer its completion carries, "
         "whatever cleanup failed")
def result_carries_the_answer(obs: Observation) -> list[Violation]:
    """Read from the world's log of what each run returned (``TurnRun.answer``) against
    the turn's completion event: the two are the same ending, told twice."""
    out = []
    for view in obs.ended_turns():
        run, done = view.run, view.completion
        if run is None or not run.returned or done is None or run.answer == done.final_response:
            continue
        out.append(Violation("result_carries_the_answer", "FIN-6",
                             f"turn {view.key} completed with {done.final_response!r:.40} but "
                             f"handed its caller {run.answer!r:.40}"))
    return out


@checker("store_errors_stay_in_the_result", ("FIN-6",),
         "a store error never escapes a turn: it goes into the turn's result")
def store_errors_stay_in_the_result(obs: Observation) -> list[Violation]:
    return [Violation("store_errors_stay_in_the_result", "FIN-6",
                      f"turn {run.session_id}/{run.turn_id} raised {run.raised} out of the engine "
                      "instead of ending with it in its result")
            for run in obs.runs or () if isinstance(run, RaisedRun) and run.store_error]


def _narrated_with_reprompts_left(obs: Observation, call: CallRecord) -> bool:
    """The reply promised tool calls, carried none, and dropped-call re-prompts were left:
    its text is no answer (LOOP-7), even when the budget then ends the turn. (A reply a
    correction cut is none either: the turn takes the correction in, LOOP-4.)"""
    return dropped_call(call.reply) \
        and nudges_since_tool(call) < obs.limits.dropped_toolcall_retries_max


def _same_answer(delivered: object, given: str | None) -> bool:
    """The model's text, possibly followed by the engine's bracketed notes (TOOL-9 footer)."""
    return isinstance(delivered, str) and given is not None and (
        delivered == given or delivered.startswith(given + "\n\n["))


@checker("exit_line", ("FIN-7",),
         "every turn that ended logged exactly one exit line; WARNING exactly when the durable "
         "tail it left is a tool result and the turn was not interrupted")
def exit_line(obs: Observation) -> list[Violation]:
    """Interrupted means stopped from outside, as the world logged it (the user's interrupt,
    a lost lease), and ended ``interrupted``: such a turn is not silent about its tool tail."""
    out = []
    stopped = loop_fire.interrupted(obs)
    for view in obs.ended_turns():
        line = view.exit
        if line is None:
            shown = [e for e in view.exits if isinstance(e, str)] or len(view.exits)
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {view.key} ended without exactly one exit line ({shown})"))
            continue
        interrupted = line.reason is ExitReason.INTERRUPTED \
            and (view.session_id, view.turn_id) in stopped
        want = "WARNING" if line.last_role == Role.TOOL.value and not interrupted else "INFO"
        if line.level != want:
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {view.key} ended on {line.last_role} but logged "
                                 f"{line.level}"))
        tail = view.rows[-1].role.value if view.rows else None
        if tail is not None and tail != line.last_role:
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {view.key} logged last_role={line.last_role} "
                                 f"but its durable tail is {tail}"))
        done = view.completion
        if done is not None and line.response_len != len(done.final_response or ""):
            out.append(Violation("exit_line", "FIN-7",
                                 f"turn {view.key} logged response_len={line.response_len} for "
                                 f"an answer of {len(done.final_response or '')} characters"))
    return out


def _scoped_path(entry: LedgerEntry) -> str | None:
    """The path a ledger entry's call names, as the tool scopes it (kept per entry value)."""
    return scoped_path(ToolCall(id=entry.call_id, name=entry.name, arguments=entry.arguments))


@checker("failed_writes_reported", ("TOOL-9",),
         "a delivered answer lists the writes of its turn that failed and were not redone, "
         "and none that a later write redid")
def failed_writes_reported(obs: Observation) -> list[Violation]:
    """Each write is placed in the turn it ran in by the record (``call_row_of``), never
    by its call id alone, which may repeat across turns. That reading names the session
    the call row is in, which after a rotation is a child (CMP-5): the write is filed
    under the lineage root, as the turn is."""
    out: list[Violation] = []
    root = lineage.roots(obs.record)
    last: dict[TurnKey, dict[str, str]] = defaultdict(dict)  # turn -> path -> last outcome
    for entry in obs.ledger:
        path = remembered(obs, "scoped path", (entry,), partial(_scoped_path, entry))
        found = call_row_of(obs, entry)
        spec = TOOLS_BY_NAME.get(entry.name)
        writer = spec is not None and spec.kind is ToolKind.WRITER
        if writer and path is not None and found is not None:
            session_id, turn_id = found[0]
            last[(root.get(session_id, session_id), turn_id)][path] = entry.outcome
    for key, view in obs.turns.items():
        done = view.completion
        final = done.final_response if done is not None else None
        if done is None or done.failed or final is None:
            continue
        failed = sorted(p for p, outcome in last.get(key, {}).items() if outcome == "error")
        footer = final.rsplit(MUTATION_FOOTER, 1)[1] if MUTATION_FOOTER in final else None
        if failed and (footer is None or any(p not in footer for p in failed)):
            out.append(Violation("failed_writes_reported", "TOOL-9",
                                 f"turn {view.key} answered without reporting failed "
                                 f"writes to {', '.join(failed)}"))
        elif not failed and footer is not None:
            out.append(Violation("failed_writes_reported", "TOOL-9",
                                 f"turn {view.key} reports failed writes that did not fail"))
        elif footer is not None and (redone := sorted(
                p for p, outcome in last.get(key, {}).items()
                if outcome == "applied" and _listed(p, footer))):
            out.append(Violation("failed_writes_reported", "TOOL-9",
                                 f"turn {view.key} reports failed writes to "
                                 f"{', '.join(redone)}, which a later write of the turn redid"))
    return out


def _listed(path: str, footer: str) -> bool:
    """Does the footer (`` p (tool), q (tool)]``) name ``path`` as one of its entries?"""
    return f" {path} (" in footer
