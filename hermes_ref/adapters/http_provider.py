"""An httpx client for the OpenAI chat-completions wire format.

Theory of operation
-------------------
``HttpProvider.complete`` is the one place where a provider's HTTP reality becomes the
engine's vocabulary. It does three things, in order:

1. **send**: POST ``{base_url}/chat/completions`` with ``ProviderRequest.wire()`` as the
   body (which carries ``"stream": true`` when the request streams);
2. **classify**: a status outside 2xx becomes a typed ``ProviderError`` (table below);
3. **parse**: a 2xx body (one JSON document, or a server-sent-event stream of
   ``chat.completion.chunk`` objects) is checked field by field and becomes a
   ``ProviderReply``. A body the engine cannot use is a ``MalformedReply`` whose message
   is the JSON path of the first bad field, e.g.
   ``choices[0].message.tool_calls[1].function.name is missing``.

The error map; the foreign exception, when there is one, is kept as ``__cause__``::

    429                                       RateLimited(retry_after_s from Retry-After)
    5xx                                       ProviderServerError(status=...)      transient
    400 (or 413) saying context length        ContextOverflow
    401, 403                                  ProviderAuthError
    any other status outside 2xx              ProviderRejected
    httpx.TimeoutException                    ProviderTimeout                      transient
    any other transport failure               ProviderServerError(status=None)     transient
    2xx body that is not a usable completion  MalformedReply

No httpx or json exception escapes ``complete``. The parser is strict on purpose: a
reference engine would rather fail loudly on a reply it does not understand than guess.
The one thing it fills in is a missing ``finish_reason`` ("tool_calls" when the reply
calls tools, else "stop"), because some OpenAI-compatible servers leave it out.

Streams are folded by ``StreamAssembler``: content and reasoning deltas are concatenated,
tool-call deltas are grouped by their ``index`` (id and name arrive once, arguments arrive
in fragments), and the last ``finish_reason`` and ``usage`` seen win. A stream must end
with ``data: [DONE]``; a stream that just stops is malformed, not a short answer.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from types import TracebackType
from typing import Any

import httpx

from hermes_ref.effects import ProviderRequest
from hermes_ref.errors import (
    ContextOverflow,
    MalformedReply,
    ProviderAuthError,
    ProviderError,
    ProviderRejected,
    ProviderServerError,
    ProviderTimeout,
    RateLimited,
)
from hermes_ref.models import ProviderReply, ToolCall, Usage

_SNIPPET_CHARS = 200  # how much of a foreign body an error message quotes


class HttpProvider:
    """Calls one OpenAI-compatible endpoint; see the module docstring for the contract."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``client`` lets tests pass one built with ``transport=``; it is then theirs to
        close. ``clock`` (epoch seconds) turns an HTTP-date Retry-After into a delay."""
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()
        self._timeout = httpx.Timeout(timeout_s)
        self._clock = clock

    async def __aenter__(self) -> HttpProvider:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client if this provider created it."""
        if self._owns_client:
            await self._client.aclose()

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        """One model call. Raises only ``ProviderError`` subclasses."""
        body = _encode_body(request)
        try:
            if request.stream:
                return await self._complete_streamed(body)
            return await self._complete_whole(body)
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(f"provider timed out: {type(exc).__name__}") from exc
        except httpx.InvalidURL as exc:
            # A broken base_url will not fix itself, so retrying would only hide it.
            raise ProviderRejected(f"invalid provider URL {self.url!r}: {exc}") from exc
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise ProviderServerError(
                f"provider unreachable: {type(exc).__name__}: {exc}", status=None
            ) from exc

    async def _complete_whole(self, body: bytes) -> ProviderReply:
        response = await self._client.post(
            self.url, content=body, headers=self._headers(stream=False), timeout=self._timeout
        )
        if not response.is_success:
            raise self._error_for(response)
        return parse_completion(decode_json_body(response.content))

    async def _complete_streamed(self, body: bytes) -> ProviderReply:
        async with self._client.stream(
            "POST", self.url, content=body, headers=self._headers(stream=True),
            timeout=self._timeout,
        ) as response:
            if not response.is_success:
                await response.aread()
                raise self._error_for(response)
            if response.headers.get("content-type", "").startswith("application/json"):
                # The server ignored "stream": true and sent one whole completion.
                return parse_completion(decode_json_body(await response.aread()))
            assembler = StreamAssembler()
            async for line in response.aiter_lines():
                assembler.feed_line(line)
                if assembler.done:
                    break  # anything after [DONE] is not part of this completion
            return assembler.finish()

    def _headers(self, *, stream: bool) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
        }
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        return headers

    def _error_for(self, response: httpx.Response) -> ProviderError:
        return error_for_status(
            response.status_code,
            response.content,
            retry_after=response.headers.get("retry-after"),
            now=self._clock(),
        )


def _encode_body(request: ProviderRequest) -> bytes:
    """The request body; NaN and unserialisable values are refused before anything is sent."""
    try:
        return request.wire_json()
    except (TypeError, ValueError) as exc:
        raise ProviderRejected(f"request body cannot be encoded as JSON: {exc}") from exc


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
    choice = _object(choices[0], "choices[0]")
    message = _object(choice.get("message"), "choices[0].message")
    calls = _tool_calls(message.get("tool_calls"), "choices[0].message.tool_calls")
    finish = _optional_str(choice.get("finish_reason"), "choices[0].finish_reason")
    return ProviderReply(
        content=_optional_str(message.get("content"), "choices[0].message.content"),
        tool_calls=calls,
        finish_reason=finish or _default_finish(calls),
        reasoning=_reasoning(message, "choices[0].message"),
        usage=_usage(body.get("usage")),
        model=_optional_str(body.get("model"), "model") or "",
    )


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
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens", 0), "usage.prompt_tokens"),
        completion_tokens=_count(usage.get("completion_tokens", 0), "usage.completion_tokens"),
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
    _line_no: int = 0
    _event_no: int = 0

    def feed_line(self, line: str) -> None:
        self._line_no += 1
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
        if not self.done:
            raise MalformedReply("stream ended without 'data: [DONE]'")
        calls = tuple(self._assembled_call(i, p) for i, p in sorted(self._calls.items()))
        return ProviderReply(
            content="".join(self._content) if self._content else None,
            tool_calls=calls,
            finish_reason=self._finish or _default_finish(calls),
            reasoning="".join(self._reasoning) if self._reasoning else None,
            usage=self._usage,
            model=self._model,
        )

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
        choices = chunk.get("choices")
        if choices is None or choices == []:
            return  # e.g. the trailing usage-only chunk
        if not isinstance(choices, list):
            raise MalformedReply(f"{where}: choices is not an array (got {_json_kind(choices)})")
        choice = _object(choices[0], f"{where}: choices[0]")
        finish = _optional_str(choice.get("finish_reason"), f"{where}: choices[0].finish_reason")
        self._finish = finish or self._finish
        delta = choice.get("delta")
        if delta is not None:
            self._apply_delta(_object(delta, f"{where}: choices[0].delta"), where)

    def _apply_delta(self, delta: dict[str, Any], where: str) -> None:
        path = f"{where}: choices[0].delta"
        content = _optional_str(delta.get("content"), f"{path}.content")
        if content is not None:
            self._content.append(content)
        reasoning = _reasoning(delta, path)
        if reasoning is not None:
            self._reasoning.append(reasoning)
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
