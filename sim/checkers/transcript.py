"""Checkers of the transcript's shape: tail closure and no stored scaffolding."""

from __future__ import annotations

from hermes_ref.models import Message, Role
from hermes_ref.scaffolding import (
    DROPPED_TOOLCALL_NUDGE,
    EMPTY_AFTER_TOOLS_NUDGE,
    EMPTY_SENTINEL,
    GRACE_SUMMARY_PROMPT,
    PRE_VERIFY_NUDGE,
)
from sim.checkers.base import (
    Observation,
    Violation,
    checker,
)
from sim.checkers.thoughts import thought_of, visible_text

# ---- transcript shape --------------------------------------------------------------------


@checker("tail_closure", ("FIN-3",),
         "a delivered answer is the visible text of the last durable row of its turn")
def tail_closure(obs: Observation) -> list[Violation]:
    out = []
    for view in obs.turns.values():
        done = view.completion
        final = done.final_response if done is not None else None
        if done is None or done.failed or final is None or not final.strip():
            continue
        tail = view.rows[-1] if view.rows else None
        if tail is None or tail.role is not Role.ASSISTANT or tail.content != final:
            shape = "no rows" if tail is None else f"{tail.role.value} row #{tail.row_id}"
            out.append(Violation("tail_closure", "FIN-3",
                                 f"turn {view.key} delivered {final[:40]!r} but its "
                                 f"durable tail is {shape}"))
    return out


SCAFFOLD_TEXTS = frozenset({DROPPED_TOOLCALL_NUDGE, EMPTY_AFTER_TOOLS_NUDGE, GRACE_SUMMARY_PROMPT,
                            PRE_VERIFY_NUDGE})  # the verification gate's request (FIN-1)


def prefills(obs: Observation) -> set[tuple[str, str]]:
    """(turn, text) of every thinking prefill the ladder may have made: the reasoning of a
    reply that said nothing visible and called nothing, which the next request of its turn
    ends on as a synthetic assistant message (LOOP-8)."""
    return {(call.turn_id, thought_of(call.reply)) for call in obs.calls
            if call.reply is not None and not call.reply.tool_calls
            and not visible_text(call.reply.content) and thought_of(call.reply)}


def _is_prefill(message: Message, made: set[tuple[str, str]]) -> bool:
    return message.role is Role.ASSISTANT and not message.tool_calls \
        and (message.turn_id or "", (message.content or "").strip()) in made


@checker("no_scaffolding_persisted", ("SCAF-1",),
         "no stored row is a synthetic retry message")
def no_scaffolding_persisted(obs: Observation) -> list[Violation]:
    out = []
    made = prefills(obs)
    for stored in obs.record.messages:
        row = stored.message
        text = row.content or ""
        synthetic = text in SCAFFOLD_TEXTS or _is_prefill(row, made) or (
            row.role is Role.ASSISTANT and not row.tool_calls and not row.hidden
            and text.strip() in ("", EMPTY_SENTINEL)
        )
        if synthetic:
            out.append(Violation("no_scaffolding_persisted", "SCAF-1",
                                 f"row #{row.row_id} ({row.role.value}) is scaffolding: "
                                 f"{text[:40]!r}"))
    return out


@checker("no_scaffolding_replayed", ("SCAF-2",),
         "a request never carries an earlier turn's scaffolding (after a crash least of all)")
def no_scaffolding_replayed(obs: Observation) -> list[Violation]:
    out = []
    made = prefills(obs)
    for call in obs.calls:
        for message in call.request.messages:
            if message.role is Role.USER and message.turn_id == call.turn_id \
                    and message.content not in SCAFFOLD_TEXTS:
                break  # this turn's own user row: what follows belongs to the turn
            if (message.content or "") in SCAFFOLD_TEXTS or _is_prefill(message, made):
                out.append(Violation("no_scaffolding_replayed", "SCAF-2",
                                     f"call at effect {call.seq} (turn {call.turn_id}) replays "
                                     f"scaffolding from an earlier turn: {message.content!r:.50}"))
                break
    return out
