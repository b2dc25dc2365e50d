"""Reply intake: the one rule by which a provider's reply becomes something the engine uses.

Theory of operation
-------------------
A provider sends what it likes. Two of the things it can send would otherwise break the
record quietly, so every reply passes through ``admit_reply`` once, where it arrives
(``loop.call_with_retries``, for the loop's calls and the grace summary alike), and the HTTP
adapter applies the text half, ``clean_reply``, where text enters the process
(``shell.chat_wire``).

**Text that is not Unicode.** JSON may carry a lone UTF-16 surrogate (``"\\ud83d"``),
and a server that streams UTF-16 code units can split a surrogate pair across two
deltas, which a fold that joins deltas receives as two separate halves. Python keeps
either in a ``str``, but no store can encode it: SQLite refuses the row, so the user was
told the turn succeeded while the record ended on the user row (FIN-3, FIN-6).
``clean_text`` joins a high half followed by a low half into its one character (what the
server meant) and replaces every other surrogate with U+FFFD, the Unicode replacement
character (what a decoder does with a byte it cannot read). Every string of a reply is
cleaned, tool-call ids, names and arguments included: the core never hands the store text
it cannot encode, and what is delivered is what is recorded.

**Calls that share an id.** Some servers number calls per request or reuse one id for a
batch, so two different calls of one reply arrive as ``call_0`` and ``call_0``. Results
are matched to calls by id, so both calls ran and the second one's result was recorded
twice, and the first call's effect was in no row (TOOL-3). There are two honest answers:
refuse the reply before anything runs, or give each call an identity of its own. This
engine renames, as Hermes does (``uniquify_tool_call_ids`` in its
``agent/message_sanitization.py``): the first call keeps the provider's id, and each
later call with the same id becomes ``<id>_d<n>``, with the smallest ``n`` from 2 that no
other id of the reply has. The reasons:

* the calls are what the model asked for; refusing the reply would throw away a usable
  round over a server's numbering, and asking again would most likely get the same ids;
* the names are deterministic (never random), so a replay of the same reply gives the
  same record and the same bytes on the wire, and the model sees the new ids in the
  transcript it is sent next;
* an id the provider gave only once keeps it, even one that looks like a suffix, so a
  call is renamed only when it truly collides (Hermes renames in order, and would rename
  such a call; this is the one place where the rule differs).

A repeat of the same call (same name, same arguments) is still two calls here: Hermes
drops such a repeat in a separate step (``_deduplicate_tool_calls``), which this engine
does not take on. Ids repeated across rounds are left alone: a result follows the row
that made its call, so they are not ambiguous.

**A reply that was streamed.** The provider port delivers a streamed reply as its
ordered deltas (``StreamDelta``: text, reasoning, tool-call fragments, usage, finish), and
``accumulate`` is the one fold that turns them into the reply, on whichever side of the
boundary they are folded (the HTTP adapter folds what it read off the wire, the core
folds what a cut stream left behind): text and reasoning pieces are joined, tool-call
fragments are grouped by their ``index`` (id and name once, arguments in pieces), and
the last finish reason and usage seen win. Text is cleaned once it is whole
(``clean_reply``), never per delta, so a surrogate pair split across two deltas is
joined. The reply keeps its deltas and ``streamed_text``, the visible text they carried;
reasoning pieces go only to ``reasoning``, never to the content.

Everything here is pure: a reply comes in, a reply goes out, and one that needs no
change comes back as the very same object.
"""

from __future__ import annotations

import re

from hermes_ref.models import ProviderReply, StreamDelta, ToolCall, Usage

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with surrogate halves paired into characters and lone ones as U+FFFD.

    Encoding to UTF-16 with ``surrogatepass`` writes each code point's 16-bit units as
    they are; decoding them again pairs every high unit followed by a low unit, exactly
    as a UTF-16 reader would, and ``replace`` turns each unit left alone into U+FFFD.
    """
    if text.isascii() or _SURROGATE.search(text) is None:
        return text  # the common case: nothing to do, and no copy
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _clean_optional(text: str | None) -> str | None:
    return None if text is None else clean_text(text)


def _clean_call(call: ToolCall) -> ToolCall:
    id_, name, arguments = clean_text(call.id), clean_text(call.name), clean_text(call.arguments)
    if (id_, name, arguments) == (call.id, call.name, call.arguments):
        return call
    return ToolCall(id=id_, name=name, arguments=arguments)


def clean_reply(reply: ProviderReply) -> ProviderReply:
    """The reply with every string cleaned (``clean_text``); the same object if none changed."""
    content, reasoning = _clean_optional(reply.content), _clean_optional(reply.reasoning)
    model, streamed = clean_text(reply.model), clean_text(reply.streamed_text)
    calls = tuple(_clean_call(c) for c in reply.tool_calls)
    same_calls = all(a is b for a, b in zip(calls, reply.tool_calls, strict=True))
    if same_calls and (content, reasoning, model, streamed) == (
            reply.content, reply.reasoning, reply.model, reply.streamed_text):
        return reply
    return reply.model_copy(update={
        "content": content, "reasoning": reasoning, "model": model, "tool_calls": calls,
        "streamed_text": streamed,
    })


def unique_call_ids(calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    """The calls, each with an id no other call of the reply has (``<id>_d<n>`` on a repeat)."""
    ids = [c.id for c in calls]
    if len(set(ids)) == len(ids):
        return calls
    taken = set(ids)
    seen: set[str] = set()
    out: list[ToolCall] = []
    for call in calls:
        if call.id in seen:
            n = 2
            while f"{call.id}_d{n}" in taken:
                n += 1
            call = call.model_copy(update={"id": f"{call.id}_d{n}"})
            taken.add(call.id)
        seen.add(call.id)
        out.append(call)
    return tuple(out)


def admit_reply(reply: ProviderReply) -> ProviderReply:
    """The reply as the engine uses it: clean text (``clean_reply``), then distinct call ids.

    Text first, because cleaning can make two ids equal (``a\\ud800`` and ``a\\ud801`` both
    become ``a\\ufffd``), and the ids must be distinct as they will be stored.
    """
    reply = clean_reply(reply)
    calls = unique_call_ids(reply.tool_calls)
    return reply if calls is reply.tool_calls else reply.model_copy(update={"tool_calls": calls})


def accumulate(deltas: tuple[StreamDelta, ...], model: str = "") -> ProviderReply:
    """The reply an ordered tuple of stream deltas makes (see the module docstring)."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str | None]] = {}  # index -> [id, name, arguments...]
    finish: str | None = None
    usage = Usage()
    for delta in deltas:
        if delta.kind == "text":
            text.append(delta.text)
        elif delta.kind == "reasoning":
            reasoning.append(delta.text)
        elif delta.kind == "tool_call":
            parts = calls.setdefault(delta.index, [None, None])
            parts[0] = delta.call_id or parts[0]
            parts[1] = delta.name or parts[1]
            parts.append(delta.text)
        elif delta.kind == "finish":
            finish = delta.text or finish
        elif delta.usage is not None:
            usage = delta.usage
    built = tuple(ToolCall(id=p[0] or "", name=p[1] or "", arguments="".join(
        a for a in p[2:] if a is not None)) for _, p in sorted(calls.items()))
    content = "".join(text) if text else None
    reply = clean_reply(ProviderReply(
        content=content, tool_calls=built,
        finish_reason=finish or ("tool_calls" if built else "stop"),
        reasoning="".join(reasoning) if reasoning else None, usage=usage, model=model,
    ))
    return reply.model_copy(update={"deltas": deltas, "streamed_text": reply.content or ""})


def finished(deltas: tuple[StreamDelta, ...]) -> bool:
    """The stream said it was done: a finish delta arrived (FIN-2 reads this)."""
    return any(d.kind == "finish" for d in deltas)
