"""Checkers of stable bytes: the share of each prompt a provider's cache can serve (CTX-3,
WIRE-1), and rows whose content was rewritten, which must not replay an old sidecar (WIRE-2).

Theory of operation
-------------------
A provider's prompt cache matches from the first byte: a request is served from the cache
for as long as it repeats, exactly, a prompt the provider saw before, and pays in full from
the first byte that differs. CTX-3 (one system prompt per session, replayed byte for
byte) and WIRE-1 (an injected row replayed as the bytes first sent) exist so that each
request of a conversation repeats the one before it; this checker measures whether it did.

It reads only the request bodies the world recorded, never the engine's figures or the
provider's: for each call of a session, in call order, the cached tokens are those of the
longest run of leading messages its body shares with the body of an earlier *answered*
call of the same session (a failed call leaves nothing cached) with the same model and
tools, each message counted whole by the token estimate (``measure.message_tokens``
of the parsed wire message), as ``sim.provider.PromptCache`` reports them.

A story declares what it expects by running turns as ``CacheShareRun`` with a
``min_share``; the share of a session is its declared turns' cached tokens over their
prompt tokens. Silence is no pass: a declared turn with no call, or a call whose body
cannot be read, is a finding. Where the share falls short, the finding names the first
place a request stopped repeating the request before it: its system message (CTX-3) or a
message replayed with other bytes than it was sent with before (WIRE-1).

*Rewrites (WIRE-2).* The one composer writes a sidecar as the row's content, a blank line
and the injection fenced in ``<context>``, so every stored sidecar must be that form of its
row's *current* content: a row written again with new content and its old sidecar holds
the old content, and fails. A rewrite the harness asked for (``sim.world.RewriteRun``) must
be in the record, and every later request that carries the row must send its new content
(or a sidecar composed from it); each turn of the session that ran after the rewrite must
have sent the row at least once, or nothing would show what it replays.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from hermes_ref.models import Message, Role
from hermes_ref.ports import CompactionRow
from sim.checkers.base import Observation, Violation, checker
from sim.checkers.lineage import roots
from sim.checkers.measure import message_tokens
from sim.checkers.wire import WireMessage, sent_messages
from sim.world import CallRecord, RewriteRun, TurnRun


@dataclass(frozen=True, slots=True)
class CacheShareRun(TurnRun):
    """A turn whose requests a story expects a prompt cache to serve, at least ``min_share``
    of their prompt tokens over the session's declared turns."""

    min_share: float = 0.0


@dataclass(frozen=True, slots=True)
class CallShare:
    """One call's prompt as a prefix cache sees it, read from the recorded body."""

    call: CallRecord
    prompt_tokens: int
    cached_tokens: int
    # the earlier call this one repeats the most of (None: none shares its head), and how
    # many leading messages they share
    nearest: CallRecord | None
    shared: int
    messages: tuple[WireMessage, ...]


def session_shares(obs: Observation, session_id: str) -> list[CallShare] | str:
    """Every call of ``session_id`` with its cached tokens, or what makes a body unreadable."""
    earlier: list[tuple[Any, tuple[WireMessage, ...], CallRecord]] = []
    out: list[CallShare] = []
    for call in obs.calls:
        if call.session_id != session_id:
            continue
        messages = sent_messages(call)
        if isinstance(messages, str):
            return f"call at effect {call.seq}: {messages}"
        sent, head = tuple(messages), _head(call)
        best, nearest = 0, None
        for other_head, other, record in earlier:
            if other_head != head:
                continue
            shared = _shared(sent, other)
            if nearest is None or shared > best:
                best, nearest = shared, record
        out.append(CallShare(call, sum(message_tokens(m) for m in sent),
                             sum(message_tokens(m) for m in sent[:best]), nearest, best, sent))
        if call.reply is not None:
            earlier.append((head, sent, call))
    return out


def _head(call: CallRecord) -> Any:
    body = call.sent
    return (body.get("model"), body.get("tools")) if isinstance(body, dict) else None


def _shared(a: tuple[WireMessage, ...], b: tuple[WireMessage, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@checker("prompt_cache_share", ("CTX-3", "WIRE-1"),
         "over a session's declared turns, the prompt tokens a prefix cache serves, read from "
         "the recorded bodies, are at least the share the story declared")
def prompt_cache_share(obs: Observation) -> list[Violation]:
    declared: dict[str, list[CacheShareRun]] = defaultdict(list)
    for run in obs.runs or ():
        if isinstance(run, CacheShareRun):
            declared[run.session_id].append(run)
    out: list[Violation] = []
    for session_id, runs in declared.items():
        out.extend(_judge_session(obs, session_id, runs))
    return out


def _judge_session(obs: Observation, session_id: str, runs: list[CacheShareRun]) -> list[Violation]:
    shares = session_shares(obs, session_id)
    if isinstance(shares, str):
        return [_v("WIRE-1", f"session {session_id}: {shares}")]
    by_turn: dict[str, list[CallShare]] = defaultdict(list)
    for share in shares:
        by_turn[share.call.turn_id].append(share)
    out: list[Violation] = []
    measured: list[CallShare] = []
    for run in runs:
        calls = by_turn.get(run.turn_id or "", [])
        if not calls and not run.crashed:
            out.append(_v("WIRE-1", f"turn {session_id}/{run.turn_id} was declared for the "
                                    "prompt-cache share but made no call to measure"))
        measured.extend(calls)
    prompt = sum(s.prompt_tokens for s in measured)
    cached = sum(s.cached_tokens for s in measured)
    wanted = min(run.min_share for run in runs)
    if out or not measured:
        return out
    if prompt <= 0 or cached < wanted * prompt:
        invariant, where = _first_break(measured)
        out.append(_v(invariant, f"session {session_id}: a prefix cache serves {cached} of "
                                 f"{prompt} prompt tokens over {len(runs)} declared turns "
                                 f"(share {cached / max(prompt, 1):.3f}, declared at least "
                                 f"{wanted:.3f}); {where}"))
    return out


def _first_break(measured: list[CallShare]) -> tuple[str, str]:
    """Which id a short share breaks: where a request first stopped repeating its nearest
    earlier request before that one's end (the system message: CTX-3; a replayed message
    sent with other bytes: WIRE-1)."""
    for share in measured:
        near = share.nearest
        if near is None:
            continue
        before = sent_messages(near)
        if isinstance(before, str) or share.shared >= len(before):
            continue
        index = share.shared
        was, now = before[index], share.messages[index] if index < len(share.messages) else None
        tag = f"call at effect {share.call.seq} (turn {share.call.turn_id})"
        if index == 0 and was.get("role") == Role.SYSTEM.value:
            return "CTX-3", (f"{tag} sent another system prompt than the call at effect "
                             f"{near.seq}: the prompt was not replayed byte for byte")
        shown = str((now or {}).get("content") or "")[:40]
        return "WIRE-1", (f"{tag} sent message {index} as {shown!r}, other bytes than the call "
                          f"at effect {near.seq} sent there: the replay is not stable")
    return "WIRE-1", "every request repeats the one before it; the turns add too much new text"


def _v(invariant: str, message: str) -> Violation:
    return Violation("prompt_cache_share", invariant, message)


# ---- WIRE-2: a rewritten row carries no stale sidecar ------------------------------------------


def sidecar_problem(content: str | None, sidecar: str) -> str | None:
    """Why ``sidecar`` is not ``content`` composed with an injection, or None when it is.

    WIRE-1's composer writes a sidecar only for a non-empty injection: the row's content,
    a blank line, then the injection fenced in ``<context>``; so a sidecar always holds its
    row's content as the composer writes it. A row whose content was written again and
    whose old sidecar stayed holds the *old* content in it: that is WIRE-2.
    """
    head, tail = f"{content or ''}\n\n<context>\n", "\n</context>"
    if not sidecar.startswith(head) or not sidecar.endswith(tail) or len(sidecar) < len(head) + len(tail):
        return "it is not the row's content composed with an injection"
    if not sidecar[len(head):-len(tail)]:  # an empty injection gets no sidecar at all
        return "the composer would not write it for the row's content"
    return None


@checker("rewrites_drop_the_sidecar", ("WIRE-2",),
         "every stored api_content is its row's content composed with an injection, and a row "
         "rewritten between turns is sent as its new content on every later call")
def rewrites_drop_the_sidecar(obs: Observation) -> list[Violation]:
    out: list[Violation] = []
    for stored in obs.record.messages:
        row = stored.message
        if row.api_content is None:
            continue
        problem = sidecar_problem(row.content, row.api_content)
        if problem is not None:
            out.append(_v2(f"row #{row.row_id} ({row.role.value}) stores content "
                           f"{(row.content or '')[:40]!r} with a sidecar that begins "
                           f"{row.api_content[:40]!r}: {problem} (a stale sidecar)"))
    runs = list(obs.runs or ())
    root = roots(obs.record)  # a turn is run as the session asked for, a rewrite in its tip
    for place, run in enumerate(runs):
        if isinstance(run, RewriteRun):
            lineage = root.get(run.session_id, run.session_id)
            later = [r for r in runs[place + 1:] if root.get(r.session_id, r.session_id) == lineage
                     and not isinstance(r, RewriteRun) and r.turn_id and not r.crashed]
            out.extend(_judge_rewrite(obs, run, later))
    return out


def _judge_rewrite(obs: Observation, run: RewriteRun, later: list[TurnRun]) -> list[Violation]:
    """The rewrite is in the record, and every later call that carries the row sends it as
    the new content (or a sidecar composed from it). Silence is a finding: each turn of the
    session that ran after the rewrite must have sent the row at least once, or nothing
    shows what it replays. A turn that made no model call at all (it ended at preflight, say,
    with the context past every compaction) sent no request, so it replays nothing; it is
    excused only when the record shows that: its exit line records no call, or every call
    it made came before the rewrite (silence is no pass).

    A rotation moves the conversation to a child session whose first rows are copies of
    the rows the compaction kept (CMP-5): the row is followed there (``_places``), and a
    call made on the child carries the copy where the child's record has it. A turn whose
    every call after the rewrite went to a session the row no longer lives in (a committed
    compaction summarized it away) is excused too: the record shows it replays a summary."""
    rows = [m.message for m in obs.record.messages if m.session_id == run.session_id]
    index = next((i for i, m in enumerate(rows) if m.row_id == run.row_id), None)
    if index is None or rows[index].content != run.text:
        return [_v2(f"row #{run.row_id} of session {run.session_id} was rewritten, but the "
                    "record does not hold its new content")]
    places, gone, out = _places(obs, run, rows[index], index)
    carried: set[str] = set()
    holding: set[str] = set()  # turns that called a session holding the row after the rewrite
    elsewhere: set[str] = set()  # turns that called a session the row had left
    for call in obs.calls:
        if call.seq <= run.seq or (call.session_id not in places and call.session_id not in gone):
            continue
        if call.session_id in gone:
            elsewhere.add(call.turn_id)
            continue
        holding.add(call.turn_id)
        place, expected = places[call.session_id]
        sent = sent_messages(call)
        if isinstance(sent, str):
            out.append(_v2(f"call at effect {call.seq}: {sent}"))
            continue
        found = _sent_at(sent, place, rows[index].role)
        if found is _ABSENT:
            continue  # this request does not carry the row where the record has it
        carried.add(call.turn_id)
        if found != expected and (not isinstance(found, str)
                                  or sidecar_problem(expected, found) is not None):
            out.append(_v2(f"call at effect {call.seq} sent row #{run.row_id}, rewritten to "
                           f"{run.text[:40]!r}, as {str(found)[:60]!r}: the bytes of its old "
                           "sidecar"))
    excused = _said_none(obs, run) | (elsewhere - holding)
    for turn in later:
        if turn.turn_id not in carried and (turn.turn_id in holding or turn.turn_id not in excused):
            out.append(_v2(f"turn {run.session_id}/{turn.turn_id} ran after row #{run.row_id} "
                           "was rewritten and sent it in no request: nothing shows what it "
                           "replays"))
    return out


def _said_none(obs: Observation, run: RewriteRun) -> set[str]:
    """Turns whose record shows they sent nothing after the rewrite: their exit line records
    no call, or every call they made came before it."""
    said = {v.turn_id for v in obs.turns.values() if v.exit is not None and v.exit.api_calls == 0}
    return said | {c.turn_id for c in obs.calls if c.session_id == run.session_id and c.seq <= run.seq}


Place = tuple[int, str]  # where a session's record holds the row (no system row), and its text


def _places(obs: Observation, run: RewriteRun, row: Message, index: int
            ) -> tuple[dict[str, Place], set[str], list[Violation]]:
    """Each session holding the rewritten row or a rotation's copy of it, with the row's
    place among that session's rows and the text it must be sent as; the sessions of the
    lineage a rotation moved on to without a copy (the row was summarized away); and the
    copies that hold other content than the rewrite."""
    places: dict[str, Place] = {run.session_id: (index, run.text)}
    gone: set[str] = set()
    out: list[Violation] = []
    session, current = run.session_id, row
    for done in obs.record.compactions:
        if done.session_id != session or done.child_id is None:
            continue
        session = done.child_id
        kept = [m.message for m in obs.record.messages if m.session_id == session]
        copy = _copy_of(current, [m for m in kept if _in_compacted(m, done)])
        if copy is None:
            gone.add(session)
            for later in obs.record.compactions:  # commit order: a child follows its parent
                if later.session_id in gone and later.child_id is not None:
                    gone.add(later.child_id)
            break
        expected = run.text if _kept_verbatim(copy) else copy.content or ""
        if copy.content != expected:
            out.append(_v2(f"row #{run.row_id}, rewritten to {run.text[:40]!r}, was copied into "
                           f"session {session} as #{copy.row_id} {(copy.content or '')[:40]!r}: "
                           "the rotation kept what the rewrite replaced"))
        places[session] = (kept.index(copy), expected)
        current = copy
    return places, gone, out


def _in_compacted(message: Message, done: CompactionRow) -> bool:
    return done.first_row_id <= (message.row_id or 0) < done.first_row_id + done.rows_after


def _identity(message: Message) -> tuple[Any, ...]:
    """What a compaction's copy keeps of a row besides its text: role, turn, time, call ids."""
    return (message.role, message.turn_id, message.created_at, message.tool_call_id,
            tuple(c.id for c in message.tool_calls))


def _copy_of(row: Message, compacted: list[Message]) -> Message | None:
    """The one row of a compacted set that copies ``row``, or None (summarized away, or no
    single row it could be)."""
    same = [m for m in compacted if _identity(m) == _identity(row)]
    if len(same) > 1:
        same = [m for m in same if m.content == row.content]
    return same[0] if len(same) == 1 else None


def _kept_verbatim(copy: Message) -> bool:
    """A compaction rewrites only tool outputs (pruned) and tool calls (orphans repaired):
    any other kept row is copied with its text as it was."""
    return copy.role is not Role.TOOL and not copy.tool_calls


_ABSENT = object()


def _sent_at(sent: list[WireMessage], place: int, role: Role) -> Any:
    """The content a request sent at the row's place, or ``_ABSENT`` when it has no such row
    there."""
    body = [m for m in sent if m.get("role") != Role.SYSTEM.value]
    if place >= len(body) or body[place].get("role") != role.value:
        return _ABSENT
    return body[place].get("content")


def _v2(message: str) -> Violation:
    return Violation("rewrites_drop_the_sidecar", "WIRE-2", message)
