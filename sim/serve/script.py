"""The served script: its model and its validation.

Theory of operation
-------------------
A script file is JSON. A list is the old form (the steps of the main route); an object
is the full form::

    {"seed": 7, "model": "sim-fake", "context_window": 131072,
     "steps": [STEP, ...],                             the main loop's route
     "routes": [{"name": "titles", "match": {"tools": false, "last_user_contains": "title"},
                 "steps": [STEP, ...], "when_exhausted": STEP}],
     "when_exhausted": STEP}                           the answer once a route runs out

A request goes to the first route whose ``match`` holds (``tools``: whether the request
offers tools; ``last_user_contains``: a substring of the last user message; ``stream``;
``model``), else to the main route, so side calls (titles, summaries) never consume the
main script. A route that has run out answers with its ``when_exhausted``, else the
script's, else a 500 that counts as a harness error.

A STEP is a reply or an error, plus timing and a repeat count:

* reply: ``{"text": S}``, ``{"tool_calls": [CALL, ...], "content": S}`` (the list may be
  empty: a literal ``"tool_calls": []``) or ``{"content": null}`` (neither text nor calls);
  with ``finish_reason``, ``reasoning``, ``fault`` (``lone_surrogate``, ``split_pair`` on
  text, ``shared_id`` on calls) and ``usage`` (``{"prompt_tokens": N,
  "completion_tokens": N}``, or ``null`` for none at all). A CALL is ``{"name": S,
  "arguments": OBJECT or STRING, "id": S}`` (a string is sent verbatim, malformed or not).
* error: ``{"error": KIND}`` with KIND one of ``ERROR_KINDS``; any error may override
  ``status``, ``message``, ``type``, ``code``, ``param``, ``retry_after_s`` (a Retry-After
  header, on any status), ``headers`` and ``body`` (sent verbatim instead of the error
  object). ``timeout`` holds the connection ``stall_s`` seconds without answering.
* timing, on any step: ``delay_s`` before the status line; on a stream, ``chunk_delay_s``
  between events, ``stall_after`` events then a pause of ``stall_s``, ``cut_after``
  events then the connection drops (on a whole body: half the body, then the drop),
  ``error_after`` events then an error event inside the stream; ``json_body: true``
  answers a stream request with one JSON body.
* ``repeat``: how many requests the step answers (default 1), or ``"always"``.

Every error is a ``BadInput`` naming the file, the step and the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_ref.errors import BadInput

ERROR_KINDS: dict[str, tuple[int, str, str | None]] = {
    # kind: (status, type, code); messages are written in ``sim.serve.wire``
    "rate_limited": (429, "requests", "rate_limit_exceeded"),
    "server_error": (500, "server_error", None),
    "overloaded": (529, "overloaded_error", None),
    "timeout": (0, "", None),
    "context_overflow": (400, "invalid_request_error", "context_length_exceeded"),
    "auth": (401, "invalid_request_error", "invalid_api_key"),
    "forbidden": (403, "invalid_request_error", "unsupported_country_region_territory"),
    "not_found": (404, "invalid_request_error", "model_not_found"),
    "too_large": (413, "invalid_request_error", "request_too_large"),
    "unprocessable": (422, "invalid_request_error", None),
    "rejected": (400, "invalid_request_error", None),
    "malformed": (200, "", None),
    "http": (0, "invalid_request_error", None),
}
TEXT_FAULTS = frozenset({"lone_surrogate", "split_pair"})
CALL_FAULTS = frozenset({"shared_id"})
MATCH_KEYS = frozenset({"tools", "last_user_contains", "stream", "model"})
_REPLY_KEYS = {"text", "tool_calls", "content", "finish_reason", "reasoning", "fault", "usage"}
_ERROR_KEYS = {"error", "status", "message", "type", "code", "param", "retry_after_s",
               "headers", "body", "stall_s"}
_TIMING_KEYS = {"delay_s", "chunk_delay_s", "stall_after", "stall_s", "cut_after",
                "error_after", "json_body", "repeat"}
_SCRIPT_KEYS = {"seed", "model", "context_window", "steps", "routes", "when_exhausted",
                "created"}
ALWAYS = None  # a repeat count of None: the step never runs out


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class Reply:
    content: str | None
    tool_calls: tuple[Call, ...] | None  # None: no key at all; (): a literal empty list
    finish_reason: str
    reasoning: str | None = None
    fault: str | None = None
    usage: tuple[int, int] | None = (-1, -1)  # (-1, -1): computed; None: no usage at all


@dataclass(frozen=True)
class ErrorReply:
    kind: str
    status: int
    type: str
    code: str | None
    param: str | None = None
    message: str | None = None  # None: the kind's own wording
    retry_after_s: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None


@dataclass(frozen=True)
class Timing:
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    stall_after: int | None = None
    stall_s: float = 60.0
    cut_after: int | None = None
    error_after: int | None = None
    json_body: bool = False


@dataclass(frozen=True)
class Step:
    label: str
    answer: Reply | ErrorReply
    timing: Timing = field(default_factory=Timing)
    repeat: int | None = 1


@dataclass(frozen=True)
class Route:
    name: str
    match: tuple[tuple[str, Any], ...]
    steps: tuple[Step, ...]
    when_exhausted: Step | None = None


@dataclass(frozen=True)
class Script:
    routes: tuple[Route, ...]  # the declared routes, then the main route last
    seed: int = 0
    model: str = "sim-fake"
    context_window: int = 131072
    created: int = 1767225600  # 2026-01-01T00:00:00Z; the n-th answer is created + n
    when_exhausted: Step | None = None

    @property
    def main(self) -> Route:
        return self.routes[-1]


def load(path: str | Path) -> Script:
    """Read and validate a script file; ``BadInput`` naming the problem."""
    try:
        raw: object = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise BadInput(f"{path}: no such script file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the script: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{path}: not valid JSON: {exc}") from exc
    return parse(raw, str(path))


def parse(raw: object, where: str = "script") -> Script:
    """A validated ``Script`` from decoded JSON (a list of steps or a script object)."""
    if isinstance(raw, list):
        raw = {"steps": raw}
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: a script is a JSON list of steps or an object, "
                       f"got {type(raw).__name__}")
    _no_unknown(raw, _SCRIPT_KEYS, where)
    steps = _steps(raw.get("steps", []), "main", where)
    routes = [_route(r, i, where) for i, r in enumerate(_list(raw.get("routes", []), "routes",
                                                              where))]
    names = [r.name for r in routes]
    if len(set(names)) != len(names) or "main" in names:
        raise BadInput(f"{where}: route names must be unique and not 'main'")
    exhausted = raw.get("when_exhausted")
    main = Route("main", (), steps)
    return Script(
        routes=(*routes, main),
        seed=_int(raw.get("seed", 0), "seed", where, minimum=0),
        model=_str(raw.get("model", "sim-fake"), "model", where),
        context_window=_int(raw.get("context_window", 131072), "context_window", where, 1),
        created=_int(raw.get("created", 1767225600), "created", where, minimum=0),
        when_exhausted=None if exhausted is None else step(exhausted, "when_exhausted", where),
    )


def _route(raw: object, index: int, where: str) -> Route:
    here = f"{where}: routes[{index}]"
    if not isinstance(raw, dict):
        raise BadInput(f"{here}: a route is an object")
    _no_unknown(raw, {"name", "match", "steps", "when_exhausted"}, here)
    name = _str(raw.get("name", f"route{index}"), "name", here)
    match = raw.get("match")
    if not isinstance(match, dict) or not match:
        raise BadInput(f"{here}: 'match' must be a non-empty object")
    _no_unknown(match, MATCH_KEYS, f"{here}.match")
    for key in ("tools", "stream"):
        if key in match and not isinstance(match[key], bool):
            raise BadInput(f"{here}.match.{key} must be true or false")
    for key in ("last_user_contains", "model"):
        if key in match:
            _str(match[key], f"match.{key}", here)
    exhausted = raw.get("when_exhausted")
    return Route(name, tuple(sorted(match.items())), _steps(raw.get("steps", []), name, where),
                 None if exhausted is None else step(exhausted, f"{name}.when_exhausted", where))


def _steps(raw: object, route: str, where: str) -> tuple[Step, ...]:
    items = _list(raw, f"{route} steps", where)
    return tuple(step(s, f"{route}[{i}]", where) for i, s in enumerate(items))


def step(raw: object, label: str, where: str = "script") -> Step:
    """One validated step; ``label`` names it in errors and in the summary."""
    here = f"{where}: step {label}"
    if not isinstance(raw, dict):
        raise BadInput(f"{here}: a step is an object, got {type(raw).__name__}")
    is_error = "error" in raw
    if not is_error and not ({"text", "tool_calls", "content"} & set(raw)):
        raise BadInput(f"{here}: a step needs one of 'text', 'tool_calls', 'content', 'error'")
    _no_unknown(raw, (_ERROR_KEYS if is_error else _REPLY_KEYS) | _TIMING_KEYS, here)
    answer = _error(raw, here) if is_error else _reply(raw, here)
    repeat = raw.get("repeat", 1)
    if repeat != "always":
        repeat = _int(repeat, "repeat", here, minimum=1)
    return Step(label, answer, _timing(raw, here), None if repeat == "always" else repeat)


def _reply(raw: dict[str, Any], here: str) -> Reply:
    if "text" in raw and ("tool_calls" in raw or "content" in raw):
        raise BadInput(f"{here}: 'text' goes alone; use 'content' beside 'tool_calls'")
    calls: tuple[Call, ...] | None = None
    if "tool_calls" in raw:
        items = _list(raw["tool_calls"], "tool_calls", here)
        calls = tuple(_call(c, f"{here}: tool_calls[{j}]") for j, c in enumerate(items))
    content = raw["text"] if "text" in raw else raw.get("content")
    if content is not None and not isinstance(content, str):
        raise BadInput(f"{here}: 'text' and 'content' must be strings (content may be null)")
    fault = raw.get("fault")
    known = CALL_FAULTS if calls is not None else TEXT_FAULTS
    if fault is not None and fault not in known:
        raise BadInput(f"{here}: unknown fault {fault!r}; expected one of {sorted(known)}")
    finish = raw.get("finish_reason", "tool_calls" if calls is not None else "stop")
    reasoning = raw.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise BadInput(f"{here}: 'reasoning' must be a string")
    return Reply(content, calls, _str(finish, "finish_reason", here), reasoning, fault,
                 _usage(raw, here))


def _usage(raw: dict[str, Any], here: str) -> tuple[int, int] | None:
    if "usage" not in raw:
        return (-1, -1)
    usage = raw["usage"]
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise BadInput(f"{here}: 'usage' must be an object or null")
    _no_unknown(usage, {"prompt_tokens", "completion_tokens", "total_tokens"}, f"{here}.usage")
    return (_int(usage.get("prompt_tokens", 0), "usage.prompt_tokens", here, 0),
            _int(usage.get("completion_tokens", 0), "usage.completion_tokens", here, 0))


def _call(raw: object, here: str) -> Call:
    if not isinstance(raw, dict):
        raise BadInput(f"{here}: a tool call is an object")
    _no_unknown(raw, {"id", "name", "arguments"}, here)
    name, args = raw.get("name"), raw.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise BadInput(f"{here}: 'name' is missing or not a non-empty string")
    if not isinstance(args, dict | str):
        raise BadInput(f"{here}: 'arguments' must be an object or a string")
    call_id = raw.get("id", "")
    return Call(name, args if isinstance(args, str) else json.dumps(args),
                _str(call_id, "id", here) if call_id else "")


def _error(raw: dict[str, Any], here: str) -> ErrorReply:
    kind = raw["error"]
    if kind not in ERROR_KINDS:
        raise BadInput(f"{here}: unknown error {kind!r}; expected one of {sorted(ERROR_KINDS)}")
    status, kind_type, code = ERROR_KINDS[kind]
    if kind == "http" and "status" not in raw:
        raise BadInput(f"{here}: an 'http' error needs a 'status'")
    if "status" in raw:
        status = _int(raw["status"], "status", here, minimum=200)
        if status > 599:
            raise BadInput(f"{here}: status must be an integer from 200 to 599")
    headers = raw.get("headers", {})
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise BadInput(f"{here}: 'headers' must be an object of strings")
    body = raw.get("body")
    retry = raw.get("retry_after_s")
    return ErrorReply(
        kind=kind, status=status,
        type=_str(raw.get("type", kind_type), "type", here),
        code=_opt_str(raw.get("code", code), "code", here),
        param=_opt_str(raw.get("param"), "param", here),
        message=_opt_str(raw.get("message"), "message", here),
        retry_after_s=None if retry is None else _number(retry, "retry_after_s", here),
        headers=tuple((k.lower(), v) for k, v in headers.items()),
        body=None if body is None else (body if isinstance(body, str) else json.dumps(body))
        .encode("utf-8", "surrogatepass"),
    )


def _timing(raw: dict[str, Any], here: str) -> Timing:
    values: dict[str, Any] = {k: _int(raw[k], k, here, minimum=0)
                              for k in ("stall_after", "cut_after", "error_after") if k in raw}
    values.update({k: _number(raw[k], k, here)
                   for k in ("delay_s", "chunk_delay_s", "stall_s") if k in raw})
    json_body = raw.get("json_body", False)
    if not isinstance(json_body, bool):
        raise BadInput(f"{here}: 'json_body' must be true or false")
    return Timing(**values, json_body=json_body)


def _no_unknown(raw: dict[str, Any], known: set[str] | frozenset[str], here: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise BadInput(f"{here}: unknown key(s) {unknown}; expected some of {sorted(known)}")


def _list(value: object, key: str, here: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadInput(f"{here}: '{key}' must be a list")
    return value


def _str(value: object, key: str, here: str) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{here}: '{key}' must be a string")
    return value


def _opt_str(value: object, key: str, here: str) -> str | None:
    return None if value is None else _str(value, key, here)


def _int(value: object, key: str, here: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadInput(f"{here}: '{key}' must be an integer of at least {minimum}")
    return value


def _number(value: object, key: str, here: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value >= 0):
        raise BadInput(f"{here}: '{key}' must be a non-negative number of seconds")
    return float(value)
