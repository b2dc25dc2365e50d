"""The checkers restate the rules they judge by: a module of ``sim.checkers`` imports from
``hermes_ref`` only data (texts, marks, tables, enums, value types), never a function that
decides, and each restated rule agrees with the engine's on a catalog of cases, so a
change to either one is a finding, never a shared blind spot."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import sim.checkers
from hermes_ref import admission, lease, limits, tokens, tool_batch, tool_specs, tool_spill
from hermes_ref.errors import BadInput
from hermes_ref.models import ToolCall
from sim.checkers import measure, rules

_TEXT = "a fixed text the engine writes, which the checkers look for as it is"
_TYPE = "a value type or enum the record is made of; its fields are data"
_ERROR = "an error type the provider raises; turn.py names the failures it may see"

# What a checker may import from the engine, each with the reason it is data.
ALLOWED: dict[str, dict[str, str]] = {
    "hermes_ref.admission": {name: _TYPE for name in (
        "Ack", "AdmissionRow", "AdmissionStatus", "Move", "Outcome", "Refusal")},
    "hermes_ref.closure": {name: _TEXT for name in (
        "INTERRUPTED_CALL_TEXT", "NOT_RUN_TEXT", "RECOVERED_CALL_TEXT", "UNRECORDED_RESULT_TEXT")},
    "hermes_ref.effects": {"Site": "the enum of places a write or a tool run happens"},
    "hermes_ref.errors": {name: _ERROR for name in (
        "ContextOverflow", "ProviderAuthError", "ProviderError", "ProviderServerError",
        "ProviderTimeout", "RateLimited", "StreamCut")},
    "hermes_ref.finalizer": {name: _TEXT for name in ("HELD_BACK_NOTE", "MUTATION_FOOTER")},
    "hermes_ref.limits": {"Limits": "the turn's configuration; checkers read its numbers"},
    "hermes_ref.models": {
        **{name: _TYPE for name in ("Event", "EventKind", "Message", "ProviderReply", "Role",
                                    "ScaffoldFlag", "StreamDelta", "ToolCall", "ToolKind")},
        "WIRE_MESSAGE_KEYS": "the keys the wire format has (WIRE-3), a set of names"},
    "hermes_ref.outcomes": {
        **{name: _TYPE for name in ("Completion", "ExitLine", "ExitReason", "ToolProgress",
                                    "TurnStarted")},
        "CONTEXT_PRESSURE_EXITS": "a set of exit reasons the spec groups (FIN-5)",
        "FAILED_EXITS": "a set of exit reasons that are failures (LOOP-3)"},
    "hermes_ref.ports": {name: _TYPE for name in (
        "CompactionRow", "DurableRecord", "LeaseGrantRow", "LedgerEntry", "StoredMessage")},
    "hermes_ref.rotation": {"COMPRESSION": "the end reason a rotation writes (CMP-5)",
                            "ROTATED": "the event kind a rotation logs"},
    "hermes_ref.scaffolding": {name: _TEXT for name in (
        "DROPPED_TOOLCALL_NUDGE", "EMPTY_AFTER_TOOLS_NUDGE", "EMPTY_SENTINEL",
        "GRACE_SUMMARY_PROMPT", "PRE_VERIFY_NUDGE")},
    "hermes_ref.session": {"Route": _TYPE, "SessionSource": _TYPE},
    "hermes_ref.tool_batch": {"BatchBounds": "the batch's numbers; tool_limits reads its "
                                             "fields, never its gate_s", "TIMED_OUT_MARK": _TEXT},
    "hermes_ref.tool_specs": {"TOOLS_BY_NAME": "the tool catalog: names, kinds, schemas"},
    "hermes_ref.wire": {"ProviderRequest": _TYPE},
}

# Whole engine modules a checker may import, each with the reason.
ALLOWED_MODULES = {
    "hermes_ref.compression": "compaction_places.finds_nothing asks the engine's planner on "
                              "purpose, and has_work checks its answer by the spec's arithmetic",
}

CHECKERS = sorted(Path(sim.checkers.__file__).parent.rglob("*.py"))


def _engine_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for each engine import of ``path``; name None for a whole module."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "hermes_ref"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "hermes_ref":
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                is_module = node.module == "hermes_ref" or whole in ALLOWED_MODULES
                found.append((whole, None) if is_module else (node.module, alias.name))
    return found


@pytest.mark.parametrize("path", CHECKERS, ids=lambda p: p.name)
def test_a_checker_imports_only_data_from_the_engine(path: Path) -> None:
    """A checker module imports from hermes_ref only the allowlisted data, never a function."""
    bad = [f"{module}.{name}" if name else module for module, name in _engine_imports(path)
           if (module not in ALLOWED_MODULES if name is None
               else name not in ALLOWED.get(module, {}))]
    assert not bad, f"{path.name} borrows {bad}: restate the rule in sim/checkers instead"


@pytest.mark.parametrize(("module", "name"),
                         [(m, n) for m, names in ALLOWED.items() for n in names])
def test_nothing_allowed_is_a_function(module: str, name: str) -> None:
    """Each allowlisted name is data or a type, so the allowlist cannot let a rule in."""
    value = getattr(importlib.import_module(module), name)
    assert not inspect.isfunction(value) and not inspect.isbuiltin(value), f"{module}.{name}"


def test_the_walk_sees_the_checkers() -> None:
    """The import check reads the whole package, the restated rules among it."""
    names = {p.name for p in CHECKERS}
    assert {"base.py", "measure.py", "rules.py", "admission.py"} <= names


WIRE = [
    {"role": "user", "content": ""},
    {"role": "user", "content": "abc"},
    {"role": "assistant", "content": "abcd", "tool_calls": []},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
        {"id": "c2", "type": "function",
         "function": {"name": "write_file", "arguments": '{"path": "a.txt", "content": "xy"}'}}]},
    {"role": "tool", "content": "é" * 9, "tool_call_id": "c1"},
]


@pytest.mark.parametrize("wire", WIRE)
def test_tokens_are_counted_as_the_engine_counts(wire: dict[str, object]) -> None:
    """The restated estimate gives the engine's count for every kind of message."""
    assert measure.message_tokens(wire) == tokens.count_message(wire)


def test_a_route_window_is_the_engines() -> None:
    """A fallback route's window in the estimate is the one preflight compares with."""
    route = limits.ProviderRoute(model="m", context_window_tokens=1000, token_ratio=1.3)
    assert measure.route_window_tokens(1000, 1.3) == route.window_in_estimate


def _call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id="c", name=name, arguments=arguments)


CALLS = [
    _call("write_file", '{"path": "./docs/../a.txt", "content": "x"}'),
    _call("write_file", '{"path": "a.txt"}'),
    _call("read_file", "{}"),
    _call("read_file", ""),
    _call("read_file", '{"path": 3}'),
    _call("read_file", "[1]"),
    _call("read_file", "{not json"),
    _call("search_files", '{"path": "src/../.."}'),
    _call("no_such_tool", '{"path": "a"}'),
]


@pytest.mark.parametrize("call", CALLS, ids=lambda c: f"{c.name}:{c.arguments}")
def test_paths_are_scoped_as_the_engine_scopes_them(call: ToolCall) -> None:
    """The named path and its lexical scope are the engine's, odd arguments included."""
    assert rules.named_path(call) == tool_specs.path_argument(call)
    assert rules.scoped_path(call) == tool_specs.scoped_path(call)


@pytest.mark.parametrize("content", [None, "", "read_file timed out after 420s; its effects "
                                     "are unknown", "x timed out after 42s", "timed out after 420s"])
def test_the_timed_out_wording_is_read_as_the_engine_reads_it(content: str | None) -> None:
    """A result is the deadline's own exactly when the engine would say so."""
    bounds = tool_batch.BatchBounds()
    assert rules.says_timed_out(content, bounds.deadline_s) == \
        tool_batch.is_timed_out(content, bounds)


@pytest.mark.parametrize("content", [
    None, "", tool_spill.spill_summary("spills/1-c.txt", "head", "tail", 10_000),
    "the whole output is in x", "the whole output is in  (y) the whole output is in z (m)"])
def test_a_spill_file_is_named_as_the_engine_names_it(content: str | None) -> None:
    """The spill file a summary names is the one the engine reads out of it."""
    assert rules.spill_named(content) == tool_spill.spilled_path(content)


PAYLOADS: list[object] = [
    {"text": "hi"}, {"text": "a\r\nb\rc", "role": "operator", "n": [1, 2.5]},
    '{"text": "from JSON text"}', b'{"text": "bytes"}', "{not json", [1], {"text": "  "},
    {"text": 3}, {"note": "no text"}, {"text": float("nan")}, {"text": "\ud83d"},
    {"text": "x" * 300}, {"text": object()},
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=repr)
def test_payloads_normalize_as_the_engine_normalizes_them(payload: object) -> None:
    """Normalized payloads, and the ones refused, are the engine's (ADM-3)."""
    engine = limits.Limits(admission_payload_bytes_max=256)
    try:
        expected: dict[str, object] | None = admission.normalize_payload(payload, engine)
    except BadInput:
        expected = None
    assert rules.normalized_payload(payload, 256) == expected


@pytest.mark.parametrize("holder", [
    "pid=12:pidns=4026531836:turn=turn-1:platform=cli", "sim-0:turn=t:platform=unknown",
    "", "a=b=c:x", "turn=:platform=web"])
def test_holder_fields_are_read_as_the_engine_reads_them(holder: str) -> None:
    """A holder string's fields are the engine's reading of it (LEASE-2)."""
    assert rules.holder_fields(holder) == lease.holder_fields(holder)
