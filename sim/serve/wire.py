"""From a step and a request to a plan of bytes: status, headers, events, pauses, cuts.

Theory of operation
-------------------
``plan(step, view, ids)`` is pure: it decides every byte and every pause, and the server
(or the in-process httpx handler) only plays the plan. A plan is a status, headers and a
list of ``Action`` values: send these bytes, sleep this long, stall this long (hold the
connection and send nothing), or cut (drop the connection without finishing the body).

Replies follow the published wire format. A whole body is one ``chat.completion``; a
stream is ``chat.completion.chunk`` events (text and tool-call arguments cut into a few
deltas, the halves of a split surrogate pair in separate deltas), a finish chunk, the
usage chunk only when the request asked for it (``stream_options.include_usage``), then
``data: [DONE]``. ``n`` > 1 gives that many choices, each under its own ``index``.
``id`` (``chatcmpl-`` + 24 hex) and tool-call ids come from ``Ids``, seeded per request, and
``created`` is the script's epoch plus the request's number: deterministic per seed.

Errors carry the API's shape, ``{"error": {"message", "type", "param", "code"}}``; the
context-overflow message uses the API's wording, which clients detect by its text.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from hermes_ref.tokens import count_text
from sim.serve.request import Refusal, View
from sim.serve.script import ErrorReply, Reply, Script, Step

LONE_SURROGATE = "\ud83d"
SPLIT_PAIR = "\ud83d\ude00"  # U+1F600 as its two UTF-16 halves
_BETWEEN_HALVES = re.compile(r"(?<=[\ud800-\udbff])(?=[\udc00-\udfff])")


@dataclass(frozen=True)
class Action:
    kind: str  # "send", "sleep", "stall", "cut"
    data: bytes = b""
    seconds: float = 0.0


@dataclass(frozen=True)
class Plan:
    status: int
    headers: tuple[tuple[str, str], ...]
    actions: tuple[Action, ...]
    streamed: bool = False
    summary: object = None  # what the journal records of the reply

    @property
    def body(self) -> bytes:
        return b"".join(a.data for a in self.actions if a.kind == "send")


class Ids:
    """Completion and tool-call ids of one request, from the seed and the request's number.

    Seeded per request, so concurrent requests get the same ids whatever thread runs first.
    """

    def __init__(self, seed: int, seq: int) -> None:
        self._rng = random.Random(f"{seed}:{seq}")

    def hex(self, digits: int) -> str:
        return f"{self._rng.getrandbits(digits * 4):0{digits}x}"


def _encode(payload: object) -> bytes:
    # surrogatepass keeps a lone surrogate as its \\udXXX escape (json escapes it anyway)
    return json.dumps(payload).encode("utf-8", "surrogatepass")


def refusal_plan(refusal: Refusal) -> Plan:
    error = {"message": refusal.message, "type": "invalid_request_error",
             "param": refusal.param, "code": refusal.code}
    return _json_plan(refusal.status, {"error": error})


def not_found_plan(method: str, path: str) -> Plan:
    error = {"message": f"Invalid URL ({method} {path})", "type": "invalid_request_error",
             "param": None, "code": None}
    return _json_plan(404, {"error": error})


def harness_plan(message: str) -> Plan:
    error = {"message": message, "type": "harness_error", "param": None, "code": None}
    return _json_plan(500, {"error": error})


def models_plan(script: Script, model_id: str | None) -> Plan:
    entry = {"id": script.model, "object": "model", "created": script.created,
             "owned_by": "hermes-ref-sim"}
    if model_id is None:
        return _json_plan(200, {"object": "list", "data": [entry]})
    if model_id != script.model:
        error = {"message": f"The model '{model_id}' does not exist",
                 "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
        return _json_plan(404, {"error": error})
    return _json_plan(200, entry)


def _json_plan(status: int, payload: object, extra: tuple[tuple[str, str], ...] = (),
               delay_s: float = 0.0) -> Plan:
    body = _encode(payload)
    actions = (*((Action("sleep", seconds=delay_s),) if delay_s else ()), Action("send", body))
    return Plan(status, (("content-type", "application/json"), *extra), actions,
                summary=payload)


def plan(step: Step, view: View, ids: Ids, script: Script, seq: int,
         cached_messages: int = 0) -> Plan:
    """The plan that answers ``view`` with ``step``; ``cached_messages`` leading messages of
    the request were in an earlier one (``sim.serve.prefix``)."""
    if isinstance(step.answer, ErrorReply):
        return _error_plan(step, step.answer, view, script)
    reply = step.answer
    head = {"id": f"chatcmpl-{ids.hex(24)}", "created": script.created + seq,
            "model": view.model, "system_fingerprint": "fp_hermes_ref_sim"}
    calls = _calls(reply, ids)
    usage = _usage(reply, view, calls, cached_messages)
    timing = step.timing
    if view.stream and not timing.json_body:
        return _stream_plan(step, head, reply, calls, usage if view.include_usage else None, view)
    message: dict[str, Any] = {"role": "assistant", "content": _content(reply), "refusal": None}
    if calls is not None:
        message["tool_calls"] = calls
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    choices = [{"index": i, "message": message, "logprobs": None,
                "finish_reason": reply.finish_reason} for i in range(view.n)]
    body: dict[str, Any] = {**head, "object": "chat.completion", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    whole = _json_plan(200, body, delay_s=timing.delay_s)
    if timing.cut_after is None:
        return whole
    data = whole.body
    cut = (*whole.actions[:-1], Action("send", data[: len(data) // 2]), Action("cut"))
    headers = (*whole.headers, ("content-length", str(len(data))))
    return Plan(200, headers, cut, summary={"cut": "half the body", "body": body})


def _calls(reply: Reply, ids: Ids) -> list[dict[str, Any]] | None:
    if reply.tool_calls is None:
        return None
    made = [{"id": c.id or f"call_{ids.hex(24)}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in reply.tool_calls]
    if reply.fault == "shared_id" and made:
        for call in made:
            call["id"] = reply.tool_calls[0].id or "call_0"
    return made


def _content(reply: Reply) -> str | None:
    suffix = {"lone_surrogate": LONE_SURROGATE, "split_pair": SPLIT_PAIR}.get(reply.fault or "", "")
    return None if reply.content is None else reply.content + suffix


def _usage(reply: Reply, view: View, calls: list[dict[str, Any]] | None,
           cached_messages: int = 0) -> dict[str, Any] | None:
    """The script's usage, or computed: the prompt's tokens, and of them those of the leading
    messages an earlier request had (the prefix cache), counted by the same rule."""
    if reply.usage is None:
        return None
    prompt, completion = reply.usage
    if prompt >= 0:
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}
    prompt = count_text(json.dumps(view.messages))
    cached = count_text(json.dumps(view.messages[:cached_messages])) if cached_messages else 0
    completion = count_text(reply.content) + count_text(reply.reasoning) + sum(
        count_text(c["function"]["name"]) + count_text(c["function"]["arguments"])
        for c in calls or ())
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": min(cached, prompt)}}


def _stream_plan(step: Step, head: dict[str, Any], reply: Reply,
                 calls: list[dict[str, Any]] | None, usage: dict[str, Any] | None,
                 view: View) -> Plan:
    opening = "" if reply.content is not None and calls is None else None
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": opening}]
    deltas += [{"reasoning_content": p} for p in _pieces(reply.reasoning)]
    deltas += [{"content": p} for p in _pieces(_content(reply))]
    if calls == []:
        deltas.append({"tool_calls": []})
    for i, call in enumerate(calls or ()):
        first = {"index": i, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": ""}}
        deltas.append({"tool_calls": [first]})
        deltas += [{"tool_calls": [{"index": i, "function": {"arguments": p}}]}
                   for p in _pieces(call["function"]["arguments"]) if p]
    chunk = {**head, "object": "chat.completion.chunk"}
    events = [{**chunk, "choices": [{"index": n, "delta": d, "logprobs": None,
                                     "finish_reason": None} for n in range(view.n)]}
              for d in deltas]
    events.append({**chunk, "choices": [{"index": n, "delta": {}, "logprobs": None,
                                         "finish_reason": reply.finish_reason}
                                        for n in range(view.n)]})
    if usage is not None:
        events.append({**chunk, "choices": [], "usage": usage})
    return Plan(200, (("content-type", "text/event-stream"), ("cache-control", "no-cache")),
                tuple(_stream_actions(step, [_encode(e) for e in events])), streamed=True,
                summary=events)


def _stream_actions(step: Step, events: list[bytes]) -> list[Action]:
    timing = step.timing
    actions = [Action("sleep", seconds=timing.delay_s)] if timing.delay_s else []
    for i, event in enumerate(events):
        if i == timing.cut_after:
            return [*actions, Action("cut")]
        if i == timing.error_after:
            error = {"error": {"message": "The server had an error while processing your "
                               "request.", "type": "server_error", "param": None, "code": None}}
            return [*actions, Action("send", b"data: " + _encode(error) + b"\n\n")]
        if i == timing.stall_after:
            actions.append(Action("stall", seconds=timing.stall_s))
        if i and timing.chunk_delay_s:
            actions.append(Action("sleep", seconds=timing.chunk_delay_s))
        actions.append(Action("send", b"data: " + event + b"\n\n"))
    if timing.cut_after is not None and timing.cut_after >= len(events):
        return [*actions, Action("cut")]
    return [*actions, Action("send", b"data: [DONE]\n\n")]


def _pieces(value: str | None, count: int = 3) -> list[str]:
    """``value`` in up to ``count`` even pieces, also cut between surrogate halves."""
    if value is None:
        return []
    size = max(1, -(-len(value) // count))
    even = [value[i:i + size] for i in range(0, len(value), size)] or [""]
    return [part for piece in even for part in _BETWEEN_HALVES.split(piece)]


def _error_plan(step: Step, error: ErrorReply, view: View, script: Script) -> Plan:
    timing = step.timing
    if error.kind == "timeout":
        seconds = timing.stall_s
        return Plan(0, (), (Action("stall", seconds=seconds),), summary={"stall_s": seconds})
    headers = list(error.headers)
    if error.retry_after_s is not None:
        headers.append(("retry-after", f"{error.retry_after_s:g}"))
    if error.kind == "malformed" and error.body is None:
        return _json_plan(error.status, {"object": "chat.completion", "choices": []},
                          tuple(headers), timing.delay_s)
    if error.body is not None:
        actions = (*((Action("sleep", seconds=timing.delay_s),) if timing.delay_s else ()),
                   Action("send", error.body))
        has_type = any(k == "content-type" for k, _ in headers)
        ctype = () if has_type else (("content-type", "application/json"),)
        return Plan(error.status, (*ctype, *headers), actions,
                    summary=error.body.decode("utf-8", "replace"))
    body = {"error": {"message": error.message or _message(error, view, script),
                      "type": error.type, "param": error.param, "code": error.code}}
    return _json_plan(error.status, body, tuple(headers), timing.delay_s)


def _message(error: ErrorReply, view: View, script: Script) -> str:
    if error.kind == "context_overflow":
        sent = max(script.context_window + 1, count_text(json.dumps(view.messages)))
        return (f"This model's maximum context length is {script.context_window} tokens. "
                f"However, your messages resulted in {sent} tokens. Please reduce the length "
                "of the messages.")
    wait = f" Please try again in {error.retry_after_s:g}s." if error.retry_after_s else ""
    return {
        "rate_limited": f"Rate limit reached for requests on {view.model}.{wait}",
        "server_error": "The server had an error while processing your request. Sorry about that!",
        "overloaded": "Overloaded",
        "auth": "Incorrect API key provided. You can find your API key in your account settings.",
        "forbidden": "Country, region, or territory not supported",
        "not_found": f"The model '{view.model}' does not exist or you do not have access to it.",
        "too_large": "Request too large. Reduce the size of your request and try again.",
        "unprocessable": "The request could not be processed.",
    }.get(error.kind, f"scripted {error.kind} (HTTP {error.status})")
