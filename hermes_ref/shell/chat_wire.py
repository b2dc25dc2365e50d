"""The OpenAI chat-completions wire, read strictly: status codes, bodies and streams.

Theory of operation
-------------------
Pure functions and one fold from what a provider sent (a status, a header, bytes, SSE
lines) to the engine's vocabulary; no I/O. ``HttpProvider`` is the transport around them.

The error map of ``error_for_status`` (and of an error event inside a stream)::

    429                                       RateLimited(retry_after_s from Retry-After)
    5xx                                       ProviderServerError(status=...)      transient
    400 (or 413) saying context length        ContextOverflow
    401, 403                                  ProviderAuthError
    any other status outside 2xx              ProviderRejected
    2xx body that is not a usable completion  MalformedReply

``parse_retry_after`` reads delta-seconds or an HTTP-date. ``decode_json_body`` and
``parse_completion`` check a 2xx body field by field; a body the engine cannot use is a
``MalformedReply`` whose message is the JSON path of the first bad field, e.g.
``choices[0].message.tool_calls[1].function.name is missing``. The parser is strict on
purpose: a reference engine would rather fail loudly on a reply it does not understand
than guess. The one thing it fills in is a missing ``finish_reason`` ("tool_calls" when
the reply calls tools, else "stop"), because some OpenAI-compatible servers leave it out.
The one thing it repairs is text that is not Unicode: every parsed reply goes through
``reply_intake.clean_reply`` (the core's rule, applied here where text enters the
process), so a lone surrogate such as the JSON escape ``"\\ud83d"`` becomes U+FFFD.

Streams are folded by ``StreamAssembler``: content and reasoning deltas are concatenated,
tool-call deltas are grouped by their ``index`` (id and name arrive once, arguments arrive
in fragments), and the last ``finish_reason`` and ``usage`` seen win. Text is cleaned once
it is whole, so a surrogate pair that a server split across two deltas is joined into its
one character, not kept as two lone halves. A stream must end
with ``data: [DONE]``; a stream that just stops is malformed, not a short answer. (A
stream *cut* by the connection, before its last chunk, never reaches the fold: the
transport reports it, and ``HttpProvider`` maps it to a transient server error.) A byte-order
mark at the start of a stream is dropped, as the SSE format says. Choices are taken by
their ``index``, never by their position: the reply is choice 0's, in a whole body or a
stream, and the deltas of other choices are ignored.
"""

from __future__ import annotations

import email.utils
import json
import math
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from hermes_ref.errors import (
    ContextOverflow,
    MalformedReply,
    ProviderAuthError,
    ProviderError,
    ProviderRejected,
    ProviderServerError,
    RateLimited,
    StreamCut,
)
from hermes_ref.models import ProviderReply, StreamDelta, ToolCall, Usage
from hermes_ref.reply_intake import clean_reply

_SNIPPET_CHARS = 200  # how much of a foreign body an error message quotes


# ---- classify: HTTP status → typed error ------------------------------------------------


def error_for_status(
    status: int, body: bytes, *, retry_after: str | None, now: float
) -> ProviderError:
    """The typed error for a response whose status is outside 2xx."""
    code, message = _error_detail(body)
    summary = f"provider answered HTTP {status}: {message}"
    if status == 429:
        return RateLimited(summary, retry_after_s=parse_retry_after(retry_after, now=now))
    if status >= 500:
        return ProviderServerError(summary, status=status)
    if status in (401, 403):
        return ProviderAuthError(summary, status=status)
    # 413 is what some gateways send for an oversized prompt; the text decides, not the code.
    if status in (400, 413) and _says_context_overflow(code, message):
        return ContextOverflow(summary, status=status)
    return ProviderRejected(summary, status=status)


def _error_detail(body: bytes) -> tuple[str, str]:
    """(code, message) from an OpenAI error body, or ("", a snippet of the raw body)."""
    try:
        payload: object = json.loads(body)
    except (ValueError, RecursionError):
        return "", _snippet(body.decode("utf-8", errors="replace")) or "(empty body)"
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, str):
        return "", _snippet(error)
    if isinstance(error, dict):
        code = " ".join(str(error.get(k) or "") for k in ("code", "type")).strip()
        return code, _snippet(str(error.get("message") or ""))
    return "", _snippet(json.dumps(payload))


def _says_context_overflow(code: str, message: str) -> bool:
    text = f"{code} {message}".lower()
    return "context_length_exceeded" in text or "maximum context length" in text


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date.

    Returns None when the header is absent or unparsable (the caller then uses its own
    backoff); a date in the past means "retry now" (0.0).
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        return _seconds_until_http_date(text, now)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _seconds_until_http_date(text: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP-dates are always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "…"


# ---- parse: JSON values checked by path --------------------------------------------------


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _object(value: object, path: str) -> dict[str, Any]:
    if value is None:
        raise MalformedReply(f"{path} is missing")
    if not isinstance(value, dict):
        raise MalformedReply(f"{path} is not an object (got {_json_kind(value)})")
    return value


def _optional_str(value: object, path: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise MalformedReply(f"{path} is not a string (got {_json_kind(value)})")


def _required_str(value: object, path: str, *, allow_empty: bool = False) -> str:
    text = _optional_str(value, path)
    if text is None:
        raise MalformedReply(f"{path} is missing")
    if not text and not allow_empty:
        raise MalformedReply(f"{path} is empty")
    return text


def _count(value: object, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise MalformedReply(f"{path} is not a non-negative integer (got {_json_kind(value)})")


def decode_json_body(content: bytes) -> object:
    """A 2xx body as JSON, or MalformedReply saying why it is not."""
    if not content.strip():
        raise MalformedReply("body is empty, expected a JSON chat.completion")
    try:
        payload: object = json.loads(content)
    except (ValueError, RecursionError) as exc:
        snippet = _snippet(content.decode("utf-8", errors="replace"))
        raise MalformedReply(f"body is not JSON: {snippet!r}") from exc
    return payload


def parse_completion(payload: object) -> ProviderReply:
    """A decoded ``chat.completion`` object → ``ProviderReply`` (first choice only)."""
    body = _object(payload, "body")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        got = "empty" if choices == [] else f"{_json_kind(choices)}, not a non-empty array"
        raise MalformedReply(f"choices is missing or empty (got {got})")
    choice = _object(_first_choice(choices, "choices"), "choices[0]")
    message = _object(choice.get("message"), "choices[0].message")
    calls = _tool_calls(message.get("tool_calls"), "choices[0].message.tool_calls")
    finish = _optional_str(choice.get("finish_reason"), "choices[0].finish_reason")
    return clean_reply(ProviderReply(
        content=_optional_str(message.get("content"), "choices[0].message.content"),
        tool_calls=calls,
        finish_reason=finish or _default_finish(calls),
        reasoning=_reasoning(message, "choices[0].message"),
        usage=_usage(body.get("usage")),
        model=_optional_str(body.get("model"), "model") or "",
    ))


def _first_choice(choices: list[Any], path: str) -> object:
    """The choice whose ``index`` is 0, wherever it stands in the array.

    A server may list choices in any order (``n`` > 1, or a stream that interleaves them);
    a choice without an ``index`` counts as its position, as in the oldest servers.
    """
    for position, choice in enumerate(choices):
        index = choice.get("index", position) if isinstance(choice, dict) else position
        if index == 0:
            return choice
    raise MalformedReply(f"{path} has no choice with index 0")


def _tool_calls(value: object, path: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MalformedReply(f"{path} is not an array (got {_json_kind(value)})")
    return tuple(_tool_call(item, f"{path}[{i}]") for i, item in enumerate(value))


def _tool_call(value: object, path: str) -> ToolCall:
    call = _object(value, path)
    function = _object(call.get("function"), f"{path}.function")
    return ToolCall(
        id=_required_str(call.get("id"), f"{path}.id"),
        name=_required_str(function.get("name"), f"{path}.function.name"),
        # Arguments stay the raw JSON text, byte for byte; the engine parses them later.
        arguments=_required_str(
            function.get("arguments"), f"{path}.function.arguments", allow_empty=True
        ),
    )


def _reasoning(message: dict[str, Any], path: str) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        text = _optional_str(message.get(key), f"{path}.{key}")
        if text is not None:
            return text
    return None


def _usage(value: object) -> Usage:
    if value is None:
        return Usage()  # usage is optional; the engine falls back to its own estimate
    usage = _object(value, "usage")
    details = usage.get("prompt_tokens_details")
    cached = 0
    if details is not None:  # optional, and null on servers that keep no prompt cache
        cached_value = _object(details, "usage.prompt_tokens_details").get("cached_tokens")
        cached = 0 if cached_value is None else _count(
            cached_value, "usage.prompt_tokens_details.cached_tokens")
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens", 0), "usage.prompt_tokens"),
        completion_tokens=_count(usage.get("completion_tokens", 0), "usage.completion_tokens"),
        cached_tokens=cached,
    )


def _default_finish(calls: tuple[ToolCall, ...]) -> str:
    return "tool_calls" if calls else "stop"


# ---- parse: a server-sent-event stream ---------------------------------------------------


@dataclass
class _PartialCall:
    """One tool call being assembled from deltas that share an ``index``."""

    id: str | None = None
    name: str | None = None
    arguments: list[str] | None = None  # None until the first fragment arrives


@dataclass
class StreamAssembler:
    """Folds SSE lines of ``chat.completion.chunk`` objects into one ``ProviderReply``.

    Feed it every line (without its line ending) with ``feed_line``; stop when ``done``;
    then call ``finish``. Events are dispatched on blank lines, as the SSE format says, so
    a ``data:`` payload split across several lines is joined before it is decoded.
    """

    done: bool = False
    _content: list[str] = field(default_factory=list)
    _reasoning: list[str] = field(default_factory=list)
    _calls: dict[int, _PartialCall] = field(default_factory=dict)
    _finish: str | None = None
    _usage: Usage = field(default_factory=Usage)
    _model: str = ""
    _data: list[str] = field(default_factory=list)
    # DEL-1 / FIN-2: every piece in arrival order, the deltas the engine folds and emits
    deltas: list[StreamDelta] = field(default_factory=list)
    _line_no: int = 0
    _event_no: int = 0

    def feed_line(self, line: str) -> None:
        self._line_no += 1
        if self._line_no == 1 and line.startswith("\ufeff"):
            line = line[1:]  # the SSE format strips one byte-order mark at the stream's start
        if not line:
            self._dispatch()
            return
        if line.startswith(":"):
            return  # an SSE comment, used as a keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        elif name not in ("event", "id", "retry"):
            raise MalformedReply(
                f"stream line {self._line_no} is not a server-sent-event field: "
                f"{_snippet(line)!r}"
            )

    def finish(self) -> ProviderReply:
        self._dispatch()  # the last event may lack its closing blank line
        if not self.done and self._finish is not None:  # said it was done, then just stopped
            raise StreamCut("stream ended without 'data: [DONE]' after its finish chunk",
                            deltas=tuple(self.deltas))
        if not self.done and self.deltas:  # cut mid-answer, however cleanly it closed
            raise StreamCut("stream ended without its finish chunk or 'data: [DONE]' after "
                            f"{len(self.deltas)} deltas", deltas=tuple(self.deltas))
        if not self.done:
            raise MalformedReply("stream ended without 'data: [DONE]'")
        calls = tuple(self._assembled_call(i, p) for i, p in sorted(self._calls.items()))
        # Cleaned after joining, never per delta: the two halves of a pair that a server
        # split across deltas meet only here, and only here can they become one character.
        return clean_reply(ProviderReply(
            content="".join(self._content) if self._content else None,
            tool_calls=calls,
            finish_reason=self._finish or _default_finish(calls),
            reasoning="".join(self._reasoning) if self._reasoning else None,
            usage=self._usage,
            model=self._model,
        ))

    def _dispatch(self) -> None:
        if not self._data or self.done:
            self._data.clear()
            return
        data = "\n".join(self._data)
        self._data.clear()
        if data.strip() == "[DONE]":
            self.done = True
            return
        self._event_no += 1
        where = f"stream event {self._event_no}"
        try:
            chunk: object = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise MalformedReply(f"{where} is not JSON: {_snippet(data)!r}") from exc
        self._apply_chunk(_object(chunk, where), where)

    def _apply_chunk(self, chunk: dict[str, Any], where: str) -> None:
        if chunk.get("error") is not None:
            raise _stream_error(chunk["error"])
        self._model = _optional_str(chunk.get("model"), f"{where}: model") or self._model
        if chunk.get("usage") is not None:
            self._usage = _usage(chunk["usage"])
            self.deltas.append(StreamDelta(kind="usage", usage=self._usage))
        choices = chunk.get("choices")
        if choices is None or choices == []:
            return  # e.g. the trailing usage-only chunk
        if not isinstance(choices, list):
            raise MalformedReply(f"{where}: choices is not an array (got {_json_kind(choices)})")
        choice = _stream_choice(choices, where)
        if choice is None:
            return  # deltas of another choice (n > 1): the engine reads choice 0 only
        finish = _optional_str(choice.get("finish_reason"), f"{where}: choices[0].finish_reason")
        self._finish = finish or self._finish
        delta = choice.get("delta")
        if delta is not None:
            self._apply_delta(_object(delta, f"{where}: choices[0].delta"), where)
        if finish:
            self.deltas.append(StreamDelta(kind="finish", text=finish))

    def _apply_delta(self, delta: dict[str, Any], where: str) -> None:
        """Fold one delta of choice 0 into the reply being assembled."""
        path = f"{where}: choices[0].delta"
        content = _optional_str(delta.get("content"), f"{path}.content")
        if content is not None:
            self._content.append(content)
            self.deltas.append(StreamDelta(kind="text", text=content))
        reasoning = _reasoning(delta, path)
        if reasoning is not None:
            self._reasoning.append(reasoning)
            self.deltas.append(StreamDelta(kind="reasoning", text=reasoning))
        calls = delta.get("tool_calls")
        if calls is None:
            return
        if not isinstance(calls, list):
            raise MalformedReply(f"{path}.tool_calls is not an array (got {_json_kind(calls)})")
        for j, item in enumerate(calls):
            item_path = f"{path}.tool_calls[{j}]"
            self._apply_call_delta(_object(item, item_path), item_path)

    def _apply_call_delta(self, item: dict[str, Any], path: str) -> None:
        index = _count(item.get("index"), f"{path}.index")
        partial = self._calls.setdefault(index, _PartialCall())
        partial.id = _once(partial.id, _optional_str(item.get("id"), f"{path}.id"), f"{path}.id")
        function = item.get("function")
        if function is None:
            return
        function = _object(function, f"{path}.function")
        name = _optional_str(function.get("name"), f"{path}.function.name")
        partial.name = _once(partial.name, name, f"{path}.function.name")
        fragment = _optional_str(function.get("arguments"), f"{path}.function.arguments")
        if fragment is not None:
            partial.arguments = [*(partial.arguments or []), fragment]
        self.deltas.append(StreamDelta(kind="tool_call", index=index, call_id=item.get("id"),
                                       name=name, text=fragment or ""))

    @staticmethod
    def _assembled_call(index: int, partial: _PartialCall) -> ToolCall:
        path = f"choices[0].delta.tool_calls[index={index}]"
        if partial.arguments is None:
            raise MalformedReply(f"{path}.function.arguments is missing (never streamed)")
        return ToolCall(
            id=_required_str(partial.id, f"{path}.id"),
            name=_required_str(partial.name, f"{path}.function.name"),
            arguments="".join(partial.arguments),
        )


def _stream_choice(choices: list[Any], where: str) -> dict[str, Any] | None:
    """The chunk's choice with ``index`` 0 (a missing index counts as 0), or None."""
    for position, choice in enumerate(choices):
        item = _object(choice, f"{where}: choices[{position}]")
        if item.get("index", 0) == 0:
            return item
    return None


def _once(current: str | None, new: str | None, path: str) -> str | None:
    """Id and name arrive once; a repeat must agree, a different value is malformed."""
    if new is None or current is None or new == current:
        return current if new is None else new
    raise MalformedReply(f"{path} changed mid-stream from {current!r} to {new!r}")


def _stream_error(error: object) -> ProviderError:
    """An ``{"error": ...}`` event inside a 200 stream: the server gave up mid-answer."""
    code, message = _error_detail(json.dumps({"error": error}).encode("utf-8"))
    summary = f"provider sent an error mid-stream: {message or code}"
    if _says_context_overflow(code, message):
        return ContextOverflow(summary)
    return ProviderServerError(summary, status=None)
