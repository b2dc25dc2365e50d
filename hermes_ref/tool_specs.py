"""The reference tool catalog and the checks and wording every tool runner shares.

Theory of operation
-------------------
A tool exists in three places: its ``ToolSpec`` (what the model is offered and how the
segment planner treats it), a real runner (``hermes_ref.shell.workspace_tools.WorkspaceTools``)
and a simulated twin (``sim.tools.SimTools``). The two runners differ only in *where*
bytes live (a workspace folder or an in-memory dict); everything that can be decided
from values alone is shared, so both give the same answers with the same words:

* ``call_problem`` is the one judgement of whether a call can be dispatched at all (a
  tool the turn offers, arguments that are a JSON object) and its one wording; the engine
  answers such a call in place without dispatching it (TOOL-2, LOOP-9), and a runner
  handed one anyway answers with the same words.
* ``check_call`` maps a ``ToolCall`` to its spec and validated arguments, or to the
  error result the model sees ("nothing happened", disposition ``none``). After
  ``call_problem`` it covers unknown, missing and ill-typed parameters, and
  action-dependent requirements (``todo add`` needs ``text``).
* path helpers name the path a call touches (``path_argument``), normalize it against
  the workspace root (``normalize_in_root``, the first step of both runners' resolvers),
  compare two resolved paths (``paths_overlap``) and word what went wrong;
  result helpers build results, format a process exit and cap long output;
  ``GuardedRunner`` is the front of every runner: it never raises and always caps.
* what a tool does to text (render, patch, search, todo, memory) is ``hermes_ref.tool_text``.

Nothing here performs I/O: the engine core imports this module to plan segments
(``path_argument`` gives the path a READER/WRITER call names; the tool world resolves it).
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from typing import Any

from hermes_ref.models import Disposition, JsonDict, ToolCall, ToolKind, ToolResult, ToolSpec
from hermes_ref.tool_spill import summarize  # TOOL-7

# -- bounds shared by both runners ---------------------------------------------------
READ_LIMIT_DEFAULT = 500
READ_LIMIT_MAX = 2000
SEARCH_MATCHES_MAX = 200
SEARCH_LINE_CHARS_MAX = 300
TERMINAL_TIMEOUT_MAX_S = 600.0
TODO_PATH = ".hermes/todo.json"
MEMORY_PATH = ".hermes/memory.md"


# -- the catalog ---------------------------------------------------------------------
def _string(description: str, **extra: Any) -> JsonDict:
    return {"type": "string", "description": description, **extra}


def _integer(description: str, **extra: Any) -> JsonDict:
    return {"type": "integer", "description": description, **extra}


def _params(required: dict[str, JsonDict], optional: dict[str, JsonDict] | None = None) -> JsonDict:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
    }


_PATH = _string("Path relative to the workspace root.")

READ_FILE = ToolSpec(
    name="read_file",
    description="Read a UTF-8 text file; lines are numbered from 1.",
    parameters=_params(
        {"path": _PATH},
        {
            "offset": _integer("First line to show (1-based).", minimum=1, default=1),
            "limit": _integer(
                "Maximum number of lines.", minimum=1, maximum=READ_LIMIT_MAX,
                default=READ_LIMIT_DEFAULT,
            ),
        },
    ),
    kind=ToolKind.READER,
    side_effecting=False,
)
WRITE_FILE = ToolSpec(
    name="write_file",
    description="Create or overwrite a file with the given content; parents are created.",
    parameters=_params({"path": _PATH, "content": _string("The complete new content.")}),
    kind=ToolKind.WRITER,
)
PATCH = ToolSpec(
    name="patch",
    description="Replace old_string with new_string in a file; old_string must occur once.",
    parameters=_params(
        {
            "path": _PATH,
            "old_string": _string("Exact text to replace; must be unique.", minLength=1),
            "new_string": _string("Replacement text."),
        }
    ),
    kind=ToolKind.WRITER,
)
SEARCH_FILES = ToolSpec(
    name="search_files",
    description="Search files under a path with a Python regex; hidden folders are skipped.",
    parameters=_params(
        {"pattern": _string("Python regular expression, matched per line.")},
        {"path": _string("File or folder to search.", default=".")},
    ),
    kind=ToolKind.READER,
    side_effecting=False,
)
TERMINAL = ToolSpec(
    name="terminal",
    description="Run a shell command in the workspace root; returns output and exit code.",
    parameters=_params(
        {"command": _string("Shell command.")},
        {
            "timeout_s": {
                "type": "number", "description": "Seconds before the command is killed.",
                "exclusiveMinimum": 0, "maximum": TERMINAL_TIMEOUT_MAX_S,
            }
        },
    ),
    kind=ToolKind.SEQUENTIAL,
)
TODO = ToolSpec(
    name="todo",
    description="Keep a todo list: add an item, complete one by its number, or list them.",
    parameters=_params(
        {"action": _string("What to do.", enum=["add", "complete", "list"])},
        {
            "text": _string("Item text (add)."),
            "index": _integer("Item number (complete).", minimum=1),
        },
    ),
    kind=ToolKind.SEQUENTIAL,
    side_effecting=True,
)
MEMORY = ToolSpec(
    name="memory",
    description="Durable notes for later sessions: append a note or read them all.",
    parameters=_params(
        {"action": _string("What to do.", enum=["append", "read"])},
        {"text": _string("Note text (append).")},
    ),
    kind=ToolKind.SEQUENTIAL,
    keeps_memory=True,
)
EXECUTE_CODE = ToolSpec(
    name="execute_code",
    description="Run a Python program in the workspace root; returns output and exit code.",
    parameters=_params({"code": _string("Python source.")}),
    kind=ToolKind.SEQUENTIAL,
    refundable=True,
)
CLARIFY = ToolSpec(
    name="clarify",
    description="Ask the user a question and wait for the answer.",
    parameters=_params(
        {"question": _string("The question.")},
        {"choices": {"type": "array", "items": {"type": "string"}, "description": "Options."}},
    ),
    kind=ToolKind.INTERACTIVE,
    side_effecting=False,
)

REFERENCE_TOOLS: tuple[ToolSpec, ...] = (
    READ_FILE, WRITE_FILE, PATCH, SEARCH_FILES, TERMINAL, TODO, MEMORY, EXECUTE_CODE,
)
# Every known spec, including ``clarify``, an interactive barrier for the planner that no runner runs.
TOOLS_BY_NAME: dict[str, ToolSpec] = {spec.name: spec for spec in (*REFERENCE_TOOLS, CLARIFY)}

# Parameters an action needs beyond the schema's ``required`` list.
_ACTION_REQUIRES: dict[tuple[str, str], str] = {
    ("todo", "add"): "text",
    ("todo", "complete"): "index",
    ("memory", "append"): "text",
}


# -- argument validation -------------------------------------------------------------
class _Invalid(Exception):
    """Internal: one parameter is wrong; the message names it."""


_TYPE_NAMES = {
    "string": "a string", "integer": "an integer", "number": "a number",
    "boolean": "a boolean", "array": "an array", "object": "an object",
}


def _typed(name: str, schema: JsonDict, value: Any) -> Any:
    """``value`` checked against one JSON-schema type (a float like 2.0 counts as integer)."""
    kind = schema.get("type")
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": is_number and (isinstance(value, int) or math.isfinite(value)),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(str(kind), True)
    if not ok:
        raise _Invalid(f"parameter '{name}' must be {_TYPE_NAMES.get(str(kind), kind)}")
    if isinstance(value, str) and not _encodable(value):
        raise _Invalid(f"parameter '{name}' must be valid Unicode text (lone surrogate)")
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_value(name: str, schema: JsonDict, value: Any) -> Any:
    value = _typed(name, schema, value)
    if "enum" in schema and value not in schema["enum"]:
        raise _Invalid(f"parameter '{name}' must be one of {', '.join(schema['enum'])}")
    if "minimum" in schema and value < schema["minimum"]:
        raise _Invalid(f"parameter '{name}' must be >= {schema['minimum']}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        raise _Invalid(f"parameter '{name}' must be > {schema['exclusiveMinimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        raise _Invalid(f"parameter '{name}' must be <= {schema['maximum']}")
    if "minLength" in schema and len(value) < schema["minLength"]:
        raise _Invalid(f"parameter '{name}' must not be empty")
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict):
        value = [_check_value(f"{name}[{i}]", items, item) for i, item in enumerate(value)]
    return value


def _check_object(schema: JsonDict, raw: JsonDict) -> dict[str, Any]:
    properties: dict[str, JsonDict] = schema.get("properties", {})
    required = set(schema.get("required", ()))
    if schema.get("additionalProperties") is False:
        for key in raw:
            if key not in properties:
                raise _Invalid(f"unknown parameter '{key}'")
    args: dict[str, Any] = {}
    for name, prop in properties.items():
        value = raw.get(name)
        if value is None:  # an explicit null counts as absent
            if name in required:
                raise _Invalid(f"missing required parameter '{name}'")
            if "default" in prop:
                args[name] = prop["default"]
            continue
        args[name] = _check_value(name, prop, value)
    return args


def validate_arguments(spec: ToolSpec, call: ToolCall) -> dict[str, Any] | str:
    """The call's arguments checked against ``spec`` (defaults filled in), or a message.

    The message names the offending parameter; nothing has happened when it is returned.
    """
    raw = call.parsed_arguments()
    if raw is None:
        return f"invalid arguments for {spec.name}: arguments must be a JSON object"
    try:
        args = _check_object(spec.parameters, raw)
        needed = _ACTION_REQUIRES.get((spec.name, str(args.get("action"))))
        if needed is not None and needed not in args:
            raise _Invalid(f"parameter '{needed}' is required when action is '{args['action']}'")
    except _Invalid as problem:
        return f"invalid arguments for {spec.name}: {problem}"
    return args


def call_problem(call: ToolCall, specs: Mapping[str, ToolSpec]) -> str | None:
    """Why ``call`` cannot be dispatched at all, or None (TOOL-2, LOOP-9).

    ``specs`` are the tools the turn offers; the wording is the model's only clue, so it
    names what was wrong and what would have worked.
    """
    if call.name not in specs:
        return (f"error: tool {call.name!r} does not exist; "
                f"available tools: {', '.join(sorted(specs))}")
    if call.arguments_object is None:
        return "error: the arguments are not a JSON object, so the call was not run"
    return None


def check_call(call: ToolCall) -> tuple[ToolSpec, dict[str, Any]] | ToolResult:
    """The spec and validated arguments of ``call``, or the error result to return."""
    problem = call_problem(call, TOOLS_BY_NAME)
    if problem is not None:
        return error_result(call, problem)
    spec = TOOLS_BY_NAME[call.name]
    if spec.kind is ToolKind.INTERACTIVE:
        return error_result(call, f"{call.name} asks the user, and no tool runner can answer it")
    args = validate_arguments(spec, call)
    if isinstance(args, str):
        return error_result(call, args)
    return spec, args


# -- paths ---------------------------------------------------------------------------
def path_argument(call: ToolCall, spec: ToolSpec | None = None) -> str | None:
    """The path a READER/WRITER call names, as the model wrote it ("." for a pathless reader).

    None for other tools and for arguments that are not a JSON object or carry no string
    path. ``spec`` defaults to the catalog entry of the call's name. Where the path
    really lands is the tool world's answer (``ResolvePaths``), not this string's.
    """
    spec = spec or TOOLS_BY_NAME.get(call.name)
    if spec is None or spec.kind not in (ToolKind.READER, ToolKind.WRITER):
        return None
    args = call.arguments_object
    if args is None:
        return None
    path = args.get("path")
    if path is None and spec.kind is ToolKind.READER:
        return "."
    return path if isinstance(path, str) else None


def scoped_path(call: ToolCall, spec: ToolSpec | None = None) -> str | None:
    """The call's path normalized as a string (``a/../b`` is ``b``); no root, no symlinks."""
    path = path_argument(call, spec)
    return None if path is None else posixpath.normpath(path)


def normalize_in_root(path: str, root: str) -> str | None:
    """``path`` (relative to ``root``, or absolute) as a normalized workspace-relative path.

    The lexical first step of every resolver, the workspace tools' and the simulator's:
    join with the root, collapse ``.`` and ``..`` as strings, and keep what stays inside
    (``"."`` for the root itself). None when the path leaves the root on paper. Symlinks
    are the second step, and only a resolver that can see the tree takes it.
    """
    top = posixpath.normpath(root)
    joined = posixpath.normpath(posixpath.join(top, path))
    if joined == top:
        return "."
    prefix = top if top.endswith("/") else top + "/"
    return joined[len(prefix):] if joined.startswith(prefix) else None


def paths_overlap(a: str, b: str) -> bool:
    """Do two workspace-relative paths touch (one is the other or inside it)? "." is all."""
    if a == "." or b == ".":
        return True
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def relative_path(path: str) -> str | None:
    """``path`` normalized relative to a workspace root, or None when it leaves the root."""
    normal = posixpath.normpath(path)
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../"):
        return None
    return normal


def escape_message(path: str) -> str:
    return f"path escapes the workspace: {path}"


def wrote_message(content: str, path: str) -> str:
    return f"wrote {len(content.encode('utf-8'))} bytes to {path}"


def not_found_message(path: str) -> str:
    return f"file not found: {path}"


def is_directory_message(path: str) -> str:
    return f"is a directory: {path}"


def not_a_directory_message(path: str) -> str:
    return f"a parent of {path} is not a directory"


# -- results -------------------------------------------------------------------------
def error_result(call: ToolCall, message: str, disposition: Disposition = "none") -> ToolResult:
    return ToolResult(
        call_id=call.id, name=call.name, content=message, is_error=True, disposition=disposition
    )


def ok_result(call: ToolCall, content: str) -> ToolResult:
    return ToolResult(call_id=call.id, name=call.name, content=content)


def ledger_outcome(result: ToolResult) -> str:
    """What a ledger entry records: "applied", "error" or "unknown"."""
    if result.disposition == "unknown":
        return "unknown"
    return "error" if result.is_error else "applied"


def unsaved_output(head: str, tail: str, total_chars: int, why: str, chars_max: int) -> str:
    """An oversized output whose spill file could not be written, in at most ``chars_max``
    characters, notes included (TOOL-7): as much of its start (``head``) and of its end
    (``tail``) as fits around one note of how much was cut and why it was not saved."""
    why = why[:max(0, min(300, chars_max // 4))]  # a long reason must not crowd out the text

    def note(cut: int) -> str:
        return (f"\n[output truncated: {cut} of {total_chars} characters cut; the whole "
                f"output could not be saved: {why}]\n")
    room = chars_max - len(note(total_chars))  # the cut has at most the total's digits
    if room <= 0:
        return note(total_chars).strip("\n")[:max(0, chars_max)]
    tail_keep = min(len(tail), room // 2)
    head_keep = min(len(head), room - tail_keep)
    kept_tail = tail[len(tail) - tail_keep:]
    return head[:head_keep] + note(total_chars - head_keep - tail_keep) + kept_tail


def format_process(output: str, exit_code: int) -> str:
    """Process output followed by its exit code on a line of its own."""
    newline = "\n" if output and not output.endswith("\n") else ""
    return f"{output}{newline}[exit code {exit_code}]"


def timeout_message(what: str, timeout_s: float | None = None) -> str:
    after = f" after {timeout_s:g}s" if timeout_s is not None else ""
    return f"{what} timed out{after}; its effects are unknown"


class GuardedRunner:
    """The shared front of every tool runner: never raise, never send too much (TOOL-6, 7).

    Subclasses implement ``_run`` and ``_write_spill``; ``run`` turns any exception it
    lets through into an error result whose disposition is ``unknown`` (the call may
    have stopped half-way), and a result longer than ``output_chars_max`` characters is
    spilled (``spill``): the whole text goes to a file and the model gets a summary
    naming it (``hermes_ref.tool_spill``). Only when the file cannot be written is the
    text cut (``unsaved_output``), with a note saying so, and the whole message, note
    included, still fits the cap.
    """

    output_chars_max: int = 50_000

    def run(self, call: ToolCall, *, watermark: int = 0, at: float = 0.0) -> ToolResult:
        """Run one call; every failure is an error result, never an exception."""
        try:
            result = self._run(call, watermark, at)
        except Exception as exc:  # TOOL-6: the last line of defence
            result = error_result(call, f"{call.name} failed: {exc!r}", "unknown")
        return self.spill(call, result)

    def spill(self, call: ToolCall, result: ToolResult) -> ToolResult:
        """``result`` with an oversized text replaced by a spill summary (TOOL-7)."""
        if len(result.content) <= self.output_chars_max:
            return result
        try:
            path = self._write_spill(call, result.content)
        except Exception as exc:  # no room for the file: cut, and say why, within the cap
            text = result.content
            cut = unsaved_output(text, text, len(text), str(exc) or repr(exc),
                                 self.output_chars_max)
            return result.model_copy(update={"content": cut})
        summary = summarize(path, result.content, self.output_chars_max)
        return result.model_copy(update={"content": summary})

    def _run(self, call: ToolCall, watermark: int, at: float) -> ToolResult:
        raise NotImplementedError

    def _write_spill(self, call: ToolCall, text: str) -> str:
        """Write ``text`` whole to a new spill file; its workspace-relative path."""
        raise NotImplementedError
