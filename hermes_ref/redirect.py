"""LOOP-4: a correction the user sends while the turn runs becomes a real user row.

Theory of operation
-------------------
The user may correct a turn while it runs ("no, use the other file"). The correction is
queued outside the engine; a model call in flight may be cut short by it
(``errors.Redirected``, carrying the raw text streamed so far). At the top of every loop
iteration the loop drains the queue (``DrainRedirects``, ``take_redirects``) and, when a
correction is there:

1. the scaffolding of the working list is dropped: the correction supersedes whatever
   retry steering was under way;
2. the reply that was cut (or the work that was under way) gets an assistant row: the
   *visible* part of what was streamed, think blocks removed, so raw reasoning never
   enters replayable content; when nothing was visible the row is stored ``hidden``
   with no text: a hidden row marks where the turn was cut and never goes on the wire
   (``loop.build_request`` leaves it out);
3. the correction is a user row of the turn, stored before the next call;
4. an answer the verification gate held back (FIN-1) is no longer the answer: it answered
   what the user asked before the correction. The budget's end then asks for a summary
   instead, and a failed check leaves no answer to stand;

and the loop goes on with the next iteration, preflight first. Hermes does the same in
``_apply_active_turn_redirect``.

A correction leaves the empty-reply ladder's counters (LOOP-8) as they were: they count
per turn and per provider, not per correction. A tool round the correction followed and
no nudge answered yet is still due its one nudge, a round already nudged gets no second
one, and prefills and retries stay bounded across the correction. (Only the scaffolding
goes; Hermes's redirect resets none of those counters either.)
"""

from __future__ import annotations

from collections.abc import Iterable

from hermes_ref.context import TurnContext
from hermes_ref.effects import DrainRedirects, Site
from hermes_ref.ladder import visible_text
from hermes_ref.models import Message, Role


def user_turns(messages: Iterable[Message]) -> int:
    """How many user turns ``messages`` hold: a turn's first user row opens it; a later user
    row of the same turn is a correction it took in, not a turn (CTX-1 counts turns)."""
    seen: set[str] = set()
    count = 0
    for message in messages:
        if message.role is not Role.USER:
            continue
        if message.turn_id is None or message.turn_id not in seen:
            count += 1
        if message.turn_id is not None:
            seen.add(message.turn_id)
    return count


def placeholder(ctx: TurnContext, partial: str | None) -> Message:
    """The assistant row for a reply a correction cut: visible text, or hidden."""
    shown = visible_text(partial)
    if shown:
        return Message(role=Role.ASSISTANT, content=shown, turn_id=ctx.turn_id)
    return Message(role=Role.ASSISTANT, content="", hidden=True, turn_id=ctx.turn_id)


async def take_redirects(ctx: TurnContext) -> None:
    """Drain the corrections sent to this turn and store them (see the module docstring)."""
    corrections = await DrainRedirects(ctx.session_id, ctx.turn_id)
    partial, ctx.state.cut_partial = ctx.state.cut_partial, None
    if not corrections:
        return
    ctx.state.withheld_answer = None  # the user's word overrules the answer held back (FIN-1)
    ctx.transcript.drop_scaffolding()
    rows: list[Message] = []
    tail = ctx.transcript.tail()
    if tail is None or tail.role is not Role.ASSISTANT:
        rows.append(placeholder(ctx, partial))
    rows.append(Message(role=Role.USER, content="\n\n".join(corrections), turn_id=ctx.turn_id))
    # stored rows join the working list; the ladder's counters stay the turn's (LOOP-8)
    await ctx.persist(tuple(rows), Site.REDIRECT)
