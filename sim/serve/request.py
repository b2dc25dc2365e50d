"""A chat-completions request body, read as the OpenAI API reads it.

Theory of operation
-------------------
The served simulator must never be the reason an agent's turn ends, so it takes every
request shape the API takes: any role of the API (``developer`` included), content as a
string or a list of parts, assistant messages passed back with extra keys
(``reasoning_content``, ``refusal``, ``annotations``, ``audio``, ``function_call``), any
optional parameter. What the API does not know is not refused either: it is noted in
``View.unknown`` for the journal. ``read`` refuses only what the API refuses, and answers
as it does: status 400, ``{"error": {"message", "type", "param", "code"}}``, the wording
modelled on the API's.

Beyond field types, two transcript rules are enforced because the API enforces them and
an agent must learn of a broken transcript here rather than in production: a ``tool``
message must answer a call of the assistant message before it, and every call of an
assistant message must be answered before the next non-tool message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "assistant", "user", "function", "tool", "developer")
KNOWN_FIELDS = frozenset({
    "model", "messages", "audio", "frequency_penalty", "function_call", "functions",
    "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities",
    "n", "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier",
    "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
})
KNOWN_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id",
                                "function_call", "refusal", "audio", "annotations"})
N_MAX = 128


@dataclass(frozen=True)
class Refusal:
    """What the API answers a request it refuses."""

    message: str
    param: str | None = None
    code: str | None = None
    status: int = 400


@dataclass(frozen=True)
class View:
    """What the simulator needs of an accepted request."""

    model: str
    messages: tuple[dict[str, Any], ...]
    has_tools: bool
    stream: bool
    include_usage: bool
    n: int
    unknown: tuple[str, ...]
    tools: tuple[Any, ...] = ()  # as sent: the prompt a provider caches begins with them

    @property
    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return text_of(message.get("content"))
        return ""


def text_of(content: object) -> str:
    """The text of a content value: a string, or the text parts of a list joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, dict) and p.get("type") == "text")
    return ""


def read(body: bytes) -> View | Refusal:
    """The accepted view of a body, or the API's refusal of it."""
    try:
        payload: object = json.loads(body)
    except (ValueError, RecursionError):
        return Refusal("We could not parse the JSON body of your request. The API expects "
                       "a JSON payload, but what was sent was not valid JSON.")
    if not isinstance(payload, dict):
        return _type("body", "an object", payload)
    model = payload.get("model")
    if model is None:
        return Refusal("you must provide a model parameter")
    if not isinstance(model, str):
        return _type("model", "a string", model)
    messages = payload.get("messages")
    if messages is None:
        return _missing("messages")
    if not isinstance(messages, list):
        return _type("messages", "an array", messages)
    if not messages:
        return Refusal("Invalid 'messages': empty array. Expected an array with minimum "
                       "length 1, but got an empty array instead.", "messages", "empty_array")
    refused = _check_messages(messages) or _check_options(payload)
    if refused is not None:
        return refused
    stream = payload.get("stream") is True
    options = payload.get("stream_options")
    return View(
        model=model, messages=tuple(messages), has_tools=bool(payload.get("tools")),
        stream=stream,
        include_usage=stream and isinstance(options, dict) and options.get("include_usage") is True,
        n=payload.get("n") or 1, unknown=_unknown(payload),
        tools=tuple(payload.get("tools") or ()),
    )


def _check_messages(messages: list[Any]) -> Refusal | None:
    open_calls: list[str] = []
    opened_at = 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            return _type(where, "an object", message)
        refused = _check_message(message, where)
        if refused is not None:
            return refused
        role = message["role"]
        if role == "tool":
            if message["tool_call_id"] not in open_calls:
                return Refusal("Invalid parameter: messages with role 'tool' must be a response "
                               "to a preceding message with 'tool_calls'.", f"{where}.role")
            open_calls.remove(message["tool_call_id"])
            continue
        if open_calls:
            return _unanswered(opened_at, open_calls)
        calls = message.get("tool_calls") if role == "assistant" else None
        open_calls = [c["id"] for c in calls or ()]
        opened_at = i
    return _unanswered(opened_at, open_calls) if open_calls else None


def _unanswered(index: int, ids: list[str]) -> Refusal:
    return Refusal("An assistant message with 'tool_calls' must be followed by tool messages "
                   "responding to each 'tool_call_id'. The following tool_call_ids did not "
                   f"have response messages: {', '.join(ids)}", f"messages.[{index}].role")


def _check_message(message: dict[str, Any], where: str) -> Refusal | None:
    role = message.get("role")
    if role is None:
        return _missing(f"{where}.role")
    if role not in ROLES:
        listed = ", ".join(f"'{r}'" for r in ROLES[:-1]) + f", and '{ROLES[-1]}'"
        return Refusal(f"Invalid value: {json.dumps(role)}. Supported values are: {listed}.",
                       f"{where}.role", "invalid_value")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        return _type(f"{where}.content", "one of a string or array of objects", content)
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                return _missing(f"{where}.content[{j}].type")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        return _missing(f"{where}.tool_call_id")
    if role in ("user", "system", "developer", "tool") and content is None:
        return _missing(f"{where}.content")
    calls = message.get("tool_calls")
    if role == "assistant" and calls is not None:
        if not isinstance(calls, list):
            return _type(f"{where}.tool_calls", "an array", calls)
        for j, call in enumerate(calls):
            refused = _check_call(call, f"{where}.tool_calls[{j}]")
            if refused is not None:
                return refused
    return None


def _check_call(call: object, where: str) -> Refusal | None:
    if not isinstance(call, dict):
        return _type(where, "an object", call)
    function = call.get("function")
    if not isinstance(call.get("id"), str):
        return _missing(f"{where}.id")
    if call.get("type") == "custom":  # a custom tool's call carries its input, not a function
        custom = call.get("custom")
        if not isinstance(custom, dict) or not isinstance(custom.get("name"), str):
            return _missing(f"{where}.custom.name")
        return None
    if not isinstance(function, dict):
        return _missing(f"{where}.function")
    for key in ("name", "arguments"):
        if not isinstance(function.get(key), str):
            return _missing(f"{where}.function.{key}")
    return None


def _check_options(payload: dict[str, Any]) -> Refusal | None:
    n = payload.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        return _type("n", "an integer", n)
    if isinstance(n, int) and not 1 <= n <= N_MAX:
        return Refusal(f"Invalid 'n': integer {'below minimum' if n < 1 else 'above maximum'} "
                       f"value. Expected a value {'>= 1' if n < 1 else f'<= {N_MAX}'}, but got "
                       f"{n} instead.", "n", "integer_below_min_value" if n < 1
                       else "integer_above_max_value")
    for key in ("stream", "parallel_tool_calls", "logprobs", "store"):
        value = payload.get(key)
        if value is not None and not isinstance(value, bool):
            return _type(key, "a boolean", value)
    for key in ("max_tokens", "max_completion_tokens", "seed", "top_logprobs"):
        value = payload.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return _type(key, "an integer", value)
    tools = payload.get("tools")
    if tools is not None and not isinstance(tools, list):
        return _type("tools", "an array", tools)
    for i, tool in enumerate(tools or ()):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") not in ("function", "custom"):
            return _missing(f"tools[{i}].type")
        if tool["type"] == "function" and not (
                isinstance(function, dict) and isinstance(function.get("name"), str)):
            return _missing(f"tools[{i}].function.name")
    return None


def _unknown(payload: dict[str, Any]) -> tuple[str, ...]:
    found = [key for key in payload if key not in KNOWN_FIELDS]
    for i, message in enumerate(payload["messages"]):
        found += [f"messages[{i}].{key}" for key in message if key not in KNOWN_MESSAGE_KEYS]
    return tuple(found)


def _missing(param: str) -> Refusal:
    return Refusal(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _type(param: str, expected: str, got: object) -> Refusal:
    kinds = {bool: "a boolean", int: "an integer", float: "a decimal", str: "a string",
             list: "an array", dict: "an object", type(None): "null"}
    return Refusal(f"Invalid type for '{param}': expected {expected}, but got "
                   f"{kinds.get(type(got), 'a value')} instead.", param, "invalid_type")
