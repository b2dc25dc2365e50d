"""LOOP-8: the empty-reply ladder, as one ordered table of rungs.

Theory of operation
-------------------
A reply with no tool call and no visible text is not an answer. That covers a reply
with nothing in it, one that only reasoned (structured ``reasoning``, no content), and
one whose content is a ``<think>`` block with nothing visible after it: raw reasoning is
never an answer and never stored (LOOP-4). The loop hands such a reply to ``walk``,
which takes the first rung of ``RUNGS`` whose predicate holds and performs its action.
The order is load-bearing (Hermes ``turn_empty_response``):

1. ``streamed``: visible text already reached the user as stream deltas → that text
   is the answer (``partial_stream_recovery``);
2. ``prior_text``: the previous round said something and called only housekeeping
   tools (memory, todo, ...) → that text is the answer (``fallback_prior_turn_content``);
3. ``nudge``: the reply follows a tool round that was not nudged yet → a scaffolding
   pair, the ``(empty)`` assistant and a user nudge, once per tool round;
4. ``prefill``: the model reasoned → a scaffolding assistant message holding that
   reasoning, so the next call continues from it; at most ``thinking_prefill_retries_max``;
5. ``retry``: ask again, unchanged, at most ``empty_retries_max`` times per provider;
6. ``fallback``: switch to the next provider of ``fallback_providers`` (LOOP-6); the
   next iteration rebuilds the request for it and runs preflight again;
7. ``sentinel``: give up: the scaffolding ``(empty)`` sentinel, ``empty_response_exhausted``.

Every synthetic message is scaffolding (SCAF-1): dropped before anything is stored.
Each rung is a ``Rung`` value (a name, a predicate, an action and the two phrases the
docs print), so ``docs/loop.md`` is generated from this table and a change of order is
a change of one tuple.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from hermes_ref import routes
from hermes_ref.context import TurnContext
from hermes_ref.errors import InvariantBroken
from hermes_ref.models import Message, ProviderReply, Role, ScaffoldFlag
from hermes_ref.outcomes import ExitReason
from hermes_ref.scaffolding import EMPTY_AFTER_TOOLS_NUDGE, EMPTY_SENTINEL, scaffold

# Tools that keep the agent's own notes: a round of only these said nothing to the user
# beyond its text, so that text may stand as the answer (Hermes's list).
HOUSEKEEPING_TOOLS = frozenset({"memory", "todo", "todo_list", "skill_manage", "session_search"})

_THINK = re.compile(r"<(think|thinking|reasoning)>(.*?)(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE)


def visible_text(text: str | None) -> str:
    """``text`` without its think blocks (an unclosed one runs to the end), stripped."""
    return _THINK.sub("", text or "").strip()


def without_reasoning(text: str | None) -> str | None:
    """``text`` as it may be stored: unchanged, unless think blocks must come out (LOOP-4)."""
    if text is None or _THINK.search(text) is None:
        return text
    return visible_text(text)


def inline_reasoning(text: str | None) -> str:
    """What the think blocks of ``text`` hold, joined."""
    return "\n".join(m.group(2).strip() for m in _THINK.finditer(text or "")).strip()


def reasoning_of(reply: ProviderReply) -> str:
    """The reasoning a reply carries: structured first, else its inline think blocks."""
    return (reply.reasoning or "").strip() or inline_reasoning(reply.content)


def is_empty(reply: ProviderReply) -> bool:
    """No tool call and nothing visible: the ladder's input."""
    return not reply.tool_calls and not visible_text(reply.content)


# ---- the rungs' predicates and actions ------------------------------------------------


def _answer(ctx: TurnContext, text: str, detail: str) -> None:
    ctx.transcript.append(Message(role=Role.ASSISTANT, content=text, turn_id=ctx.turn_id))
    ctx.finish(ExitReason.TEXT_RESPONSE, detail, answer=text)


def _streamed(ctx: TurnContext, reply: ProviderReply) -> bool:
    return bool(visible_text(reply.streamed_text))


def _use_streamed(ctx: TurnContext, reply: ProviderReply) -> None:
    _answer(ctx, visible_text(reply.streamed_text), "partial_stream_recovery")


def prior_round_text(ctx: TurnContext) -> str | None:
    """The text of the turn's last tool round, when it called only housekeeping tools and
    nothing but its results came after it."""
    if not ctx.state.last_round_had_tools:
        return None
    for message in reversed(ctx.transcript.current_turn()):
        if message.role is Role.TOOL or message.scaffold is not None:
            continue
        if message.role is Role.ASSISTANT and message.tool_calls:
            text = visible_text(message.content)
            names = {c.name for c in message.tool_calls}
            return text if text and names <= HOUSEKEEPING_TOOLS else None
        return None
    return None


def _prior_text(ctx: TurnContext, reply: ProviderReply) -> bool:
    return prior_round_text(ctx) is not None


def _use_prior_text(ctx: TurnContext, reply: ProviderReply) -> None:
    _answer(ctx, prior_round_text(ctx) or "", "fallback_prior_turn_content")


def _nudge_due(ctx: TurnContext, reply: ProviderReply) -> bool:
    state = ctx.state
    return state.last_round_had_tools and not state.post_tool_nudged \
        and not inline_reasoning(reply.content)


def _nudge(ctx: TurnContext, reply: ProviderReply) -> None:
    ctx.state.post_tool_nudged = True
    flag = ScaffoldFlag.EMPTY_RECOVERY
    ctx.transcript.append(scaffold(Role.ASSISTANT, EMPTY_SENTINEL, flag, ctx.turn_id))
    ctx.transcript.append(scaffold(Role.USER, EMPTY_AFTER_TOOLS_NUDGE, flag, ctx.turn_id))


def _prefill_due(ctx: TurnContext, reply: ProviderReply) -> bool:
    return bool(reasoning_of(reply)) \
        and ctx.state.thinking_prefills < ctx.limits.thinking_prefill_retries_max


def _prefill(ctx: TurnContext, reply: ProviderReply) -> None:
    """The next request ends on the model's own reasoning, as an assistant prefill it
    continues from; a newer prefill takes the place of an older one."""
    ctx.state.thinking_prefills += 1
    tail = ctx.transcript.tail()
    message = scaffold(Role.ASSISTANT, reasoning_of(reply), ScaffoldFlag.THINKING_PREFILL,
                       ctx.turn_id)
    if tail is not None and tail.scaffold is ScaffoldFlag.THINKING_PREFILL:
        ctx.transcript.replace_last(message)
    else:
        ctx.transcript.append(message)


def _retry_due(ctx: TurnContext, reply: ProviderReply) -> bool:
    return ctx.state.empty_retries < ctx.limits.empty_retries_max


def _retry(ctx: TurnContext, reply: ProviderReply) -> None:
    ctx.state.empty_retries += 1


def _fallback_due(ctx: TurnContext, reply: ProviderReply) -> bool:
    return routes.can_fall_back(ctx)


def _fall_back(ctx: TurnContext, reply: ProviderReply) -> None:
    routes.fall_back(ctx)
    ctx.state.empty_retries = 0  # the next provider gets retries of its own


def _always(ctx: TurnContext, reply: ProviderReply) -> bool:
    return True


def _sentinel(ctx: TurnContext, reply: ProviderReply) -> None:
    ctx.transcript.append(
        scaffold(Role.ASSISTANT, EMPTY_SENTINEL, ScaffoldFlag.EMPTY_TERMINAL_SENTINEL, ctx.turn_id)
    )
    ctx.finish(ExitReason.EMPTY_RESPONSE_EXHAUSTED, "", answer=EMPTY_SENTINEL, failed=True)


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung: ``applies`` decides, ``act`` acts; ``when`` and ``then`` are for the docs."""

    name: str
    when: str
    then: str
    applies: Callable[[TurnContext, ProviderReply], bool]
    act: Callable[[TurnContext, ProviderReply], None]


RUNGS: tuple[Rung, ...] = (
    Rung("streamed", "visible text was already streamed to the user",
         "that text is the answer (`partial_stream_recovery`)", _streamed, _use_streamed),
    Rung("prior_text", "the previous round had text and called only housekeeping tools",
         "that text is the answer (`fallback_prior_turn_content`)", _prior_text, _use_prior_text),
    Rung("nudge", "a tool round came before and was not nudged yet",
         "append the `(empty)` assistant and a user nudge (scaffolding), call again",
         _nudge_due, _nudge),
    Rung("prefill", "the reply reasoned, fewer than `thinking_prefill_retries_max` prefills so far",
         "append the reasoning as an assistant prefill (scaffolding), call again",
         _prefill_due, _prefill),
    Rung("retry", "fewer than `empty_retries_max` retries on this provider",
         "call again with the same messages", _retry_due, _retry),
    Rung("fallback", "a fallback provider is left in `fallback_providers`",
         "switch to it: preflight and the request are rebuilt for it (LOOP-6)",
         _fallback_due, _fall_back),
    Rung("sentinel", "nothing above applies",
         "the `(empty)` sentinel (scaffolding); exit `empty_response_exhausted`", _always, _sentinel),
)


def walk(ctx: TurnContext, reply: ProviderReply) -> str:
    """Take the first rung of ``RUNGS`` that applies to ``reply``; returns its name."""
    for rung in RUNGS:
        if rung.applies(ctx, reply):
            rung.act(ctx, reply)
            return rung.name
    raise InvariantBroken("no rung of the empty-reply ladder applied (the last one always does)")


def table() -> str:
    """The ladder as the Markdown table ``docs/loop.md`` carries (a test keeps them equal)."""
    lines = ["| # | rung | when | then |", "|---|---|---|---|"]
    lines += [f"| {i} | `{r.name}` | {r.when} | {r.then} |" for i, r in enumerate(RUNGS, 1)]
    return "\n".join(lines)
