"""The reference tools: the catalog, the workspace runner and its simulated twin."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hermes_ref.models import ToolCall, ToolKind, ToolResult
from hermes_ref.shell.workspace_tools import WorkspaceTools
from hermes_ref.tool_specs import (
    REFERENCE_TOOLS,
    SEARCH_MATCHES_MAX,
    TOOLS_BY_NAME,
    scoped_path,
    validate_arguments,
)
from hermes_ref.tool_spill import spilled_path
from sim.tools import SimTools

_ids = itertools.count(1)
Runner = WorkspaceTools | SimTools


def make_call(name: str, arguments: str | None = None, **args: Any) -> ToolCall:
    raw = arguments if arguments is not None else json.dumps(args)
    return ToolCall(id=f"call-{next(_ids)}", name=name, arguments=raw)


def run(tools: Runner, name: str, **args: Any) -> ToolResult:
    return tools.run(make_call(name, **args))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@pytest.fixture
def ws(root: Path) -> WorkspaceTools:
    return WorkspaceTools(root, terminal_timeout_s=10.0, code_timeout_s=10.0)


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` as relpath -> text, like ``SimTools.snapshot_files``."""
    files: dict[str, str] = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            files[path.relative_to(root).as_posix()] = path.read_text("utf-8")
    return files


# -- the catalog -----------------------------------------------------------------------
def test_catalog_kinds_match_the_planner_contract() -> None:
    """Each reference tool has the kind, side-effect and refund flags the planner expects."""
    kinds = {spec.name: spec.kind for spec in REFERENCE_TOOLS}
    assert kinds == {
        "read_file": ToolKind.READER, "write_file": ToolKind.WRITER, "patch": ToolKind.WRITER,
        "search_files": ToolKind.READER, "terminal": ToolKind.SEQUENTIAL,
        "todo": ToolKind.SEQUENTIAL, "memory": ToolKind.SEQUENTIAL,
        "execute_code": ToolKind.SEQUENTIAL,
    }
    assert TOOLS_BY_NAME["clarify"].kind is ToolKind.INTERACTIVE
    assert TOOLS_BY_NAME["execute_code"].refundable
    assert TOOLS_BY_NAME["todo"].side_effecting
    assert not TOOLS_BY_NAME["read_file"].side_effecting


def test_catalog_specs_have_wire_form_with_object_schemas() -> None:
    """Every spec renders as a function tool whose parameters are a JSON object schema."""
    for spec in TOOLS_BY_NAME.values():
        wire = spec.wire()
        assert wire["function"]["name"] == spec.name
        assert wire["function"]["parameters"]["type"] == "object"


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("read_file", '{"path": "./a/../b.txt"}', "b.txt"),
        ("write_file", '{"path": "x//y/", "content": ""}', "x/y"),
        ("patch", '{"path": "../up"}', "../up"),
        ("search_files", "{}", "."),
        ("search_files", '{"path": "src/"}', "src"),
        ("read_file", "not json", None),
        ("read_file", '{"path": 3}', None),
        ("terminal", '{"command": "ls"}', None),
        ("nope", '{"path": "a"}', None),
    ],
)
def test_scoped_path_normalizes_reader_and_writer_paths(
    name: str, arguments: str, expected: str | None
) -> None:
    """scoped_path gives the normalized path of READER/WRITER calls and None otherwise."""
    assert scoped_path(ToolCall(id="c", name=name, arguments=arguments)) == expected


def test_validate_arguments_fills_defaults() -> None:
    """Optional parameters absent or null take the schema default."""
    spec = TOOLS_BY_NAME["read_file"]
    args = validate_arguments(spec, make_call("read_file", path="a", offset=None))
    assert args == {"path": "a", "offset": 1, "limit": 500}
    search_spec = TOOLS_BY_NAME["search_files"]
    search = validate_arguments(search_spec, make_call("search_files", pattern="x"))
    assert search == {"pattern": "x", "path": "."}


@pytest.mark.parametrize(
    ("name", "arguments", "fragment"),
    [
        ("read_file", "[1, 2]", "the arguments are not a JSON object"),
        ("read_file", "{not json", "the arguments are not a JSON object"),
        ("read_file", "{}", "missing required parameter 'path'"),
        ("read_file", '{"path": 7}', "parameter 'path' must be a string"),
        ("read_file", '{"path": "a", "offset": true}', "parameter 'offset' must be an integer"),
        ("read_file", '{"path": "a", "offset": 0}', "parameter 'offset' must be >= 1"),
        ("read_file", '{"path": "a", "limit": 1e9}', "parameter 'limit' must be <= 2000"),
        ("read_file", '{"path": "a", "file": "b"}', "unknown parameter 'file'"),
        ("write_file", '{"path": "a"}', "missing required parameter 'content'"),
        ("patch", '{"path": "a", "old_string": "", "new_string": "x"}', "'old_string' must not"),
        ("terminal", '{"command": "ls", "timeout_s": -1}', "parameter 'timeout_s' must be > 0"),
        ("terminal", '{"command": "ls", "timeout_s": NaN}', "'timeout_s' must be a number"),
        ("todo", '{"action": "drop"}', "parameter 'action' must be one of add, complete, list"),
        ("todo", '{"action": "complete"}', "parameter 'index' is required when action is"),
        ("memory", '{"action": "append"}', "parameter 'text' is required when action is"),
        ("write_file", '{"path": "a", "content": "\\ud800"}', "'content' must be valid Unicode"),
    ],
)
def test_malformed_arguments_are_error_results_naming_the_parameter(
    ws: WorkspaceTools, name: str, arguments: str, fragment: str
) -> None:
    """Bad arguments give an error result with disposition none that names the problem."""
    result = ws.run(make_call(name, arguments))
    assert result.is_error and result.disposition == "none"
    assert fragment in result.content
    assert ws.ledger == []


def test_unknown_tool_and_clarify_are_refused(ws: WorkspaceTools) -> None:
    """An unknown name and the engine-answered clarify tool are error results, not raises."""
    unknown = run(ws, "rm_rf", path=".")
    assert unknown.is_error and unknown.content.startswith("error: tool 'rm_rf' does not exist")
    clarify = run(ws, "clarify", question="which?")
    assert clarify.is_error and "no tool runner can answer it" in clarify.content


# -- workspace: file tools ---------------------------------------------------------------
def test_read_file_numbers_lines_with_offset_and_limit(ws: WorkspaceTools, root: Path) -> None:
    """read_file shows numbered lines and says how to continue when lines remain."""
    (root / "f.txt").write_text("one\ntwo\nthree\n")
    assert run(ws, "read_file", path="f.txt").content == "     1|one\n     2|two\n     3|three"
    page = run(ws, "read_file", path="f.txt", offset=2, limit=1).content
    assert page == "     2|two\n[1 more line; continue with offset=3]"
    assert "past the end" in run(ws, "read_file", path="f.txt", offset=9).content


def test_read_file_errors_for_missing_directory_and_binary(ws: WorkspaceTools, root: Path) -> None:
    """Missing files, folders and non-UTF-8 files are error results."""
    (root / "d").mkdir()
    (root / "bin").write_bytes(b"\xff\xfe\x00")
    assert run(ws, "read_file", path="nope.txt").content == "file not found: nope.txt"
    assert run(ws, "read_file", path="d").content == "is a directory: d"
    assert run(ws, "read_file", path="bin").content == "not a UTF-8 text file: bin"


def test_write_file_creates_parents_and_reports_bytes(ws: WorkspaceTools, root: Path) -> None:
    """write_file creates missing folders and reports the UTF-8 byte count."""
    result = run(ws, "write_file", path="deep/er/f.txt", content="héllo\n")
    assert result == ToolResult(
        call_id=result.call_id, name="write_file", content="wrote 7 bytes to deep/er/f.txt"
    )
    assert (root / "deep/er/f.txt").read_text("utf-8") == "héllo\n"


def test_write_file_refuses_folders_and_file_parents(ws: WorkspaceTools, root: Path) -> None:
    """Writing onto a folder, or below a file, is an error and changes nothing."""
    (root / "d").mkdir()
    (root / "f").write_text("x")
    assert run(ws, "write_file", path="d", content="").content == "is a directory: d"
    below = run(ws, "write_file", path="f/g", content="")
    assert below.is_error and below.content == "a parent of f/g is not a directory"
    assert (root / "f").read_text() == "x"


def test_write_file_preserves_bytes_exactly(ws: WorkspaceTools, root: Path) -> None:
    """Content is written byte for byte, carriage returns included."""
    run(ws, "write_file", path="crlf.txt", content="a\r\nb\r\n")
    assert (root / "crlf.txt").read_bytes() == b"a\r\nb\r\n"


def test_patch_replaces_a_unique_occurrence(ws: WorkspaceTools, root: Path) -> None:
    """patch replaces old_string when it occurs exactly once."""
    (root / "p.py").write_text("x = 1\ny = 2\n")
    result = run(ws, "patch", path="p.py", old_string="y = 2", new_string="y = 3")
    assert not result.is_error and result.disposition == "applied"
    assert (root / "p.py").read_text() == "x = 1\ny = 3\n"


def test_patch_ambiguity_and_absence_are_errors(ws: WorkspaceTools, root: Path) -> None:
    """Zero or several occurrences are error results that say which, and change nothing."""
    (root / "p.txt").write_text("aa aa aa")
    many = run(ws, "patch", path="p.txt", old_string="aa", new_string="b")
    assert many.is_error and "occurs 3 times in p.txt" in many.content
    none = run(ws, "patch", path="p.txt", old_string="zz", new_string="b")
    assert none.is_error and none.content == "old_string not found in p.txt"
    assert many.disposition == none.disposition == "none"
    assert (root / "p.txt").read_text() == "aa aa aa"
    assert run(ws, "patch", path="q.txt", old_string="a", new_string="b").is_error


def test_search_files_reports_relpath_line_text_and_skips_hidden(
    ws: WorkspaceTools, root: Path
) -> None:
    """search_files lists relpath:line:text in path order and skips hidden folders."""
    (root / "src").mkdir()
    (root / "src/a.py").write_text("def f():\n    return 1\n")
    (root / "b.txt").write_text("no\ndef here\n")
    (root / ".git").mkdir()
    (root / ".git/config").write_text("def hidden\n")
    top = run(ws, "search_files", pattern=r"^def").content
    assert top == "b.txt:2:def here\nsrc/a.py:1:def f():"
    assert run(ws, "search_files", pattern="def", path="src").content == "src/a.py:1:def f():"
    assert run(ws, "search_files", pattern="zzz").content == "no matches for 'zzz'"


def test_search_files_invalid_regex_missing_path_and_cap(ws: WorkspaceTools, root: Path) -> None:
    """An invalid regex and a missing path are errors; long result lists are capped."""
    bad = run(ws, "search_files", pattern="(unclosed")
    assert bad.is_error and bad.content.startswith("invalid regex")
    assert run(ws, "search_files", pattern="x", path="nowhere").content == "file not found: nowhere"
    (root / "many.txt").write_text("hit\n" * (SEARCH_MATCHES_MAX + 10))
    capped = run(ws, "search_files", pattern="hit").content.splitlines()
    assert len(capped) == SEARCH_MATCHES_MAX + 1
    assert capped[-1] == f"[results capped at {SEARCH_MATCHES_MAX} matches]"


# -- workspace: processes ------------------------------------------------------------------
def test_terminal_returns_output_and_exit_code(ws: WorkspaceTools, root: Path) -> None:
    """terminal runs in the root and returns stdout, stderr and the exit code."""
    (root / "here.txt").write_text("")
    result = run(ws, "terminal", command="ls; echo oops >&2; exit 3")
    assert result.content == "here.txt\noops\n[exit code 3]"
    assert not result.is_error and result.disposition == "applied"


def test_terminal_timeout_is_unknown(ws: WorkspaceTools) -> None:
    """A command past its timeout is killed and reported with disposition unknown."""
    result = run(ws, "terminal", command="sleep 5", timeout_s=0.3)
    assert result.is_error and result.disposition == "unknown"
    assert "timed out after 0.3s" in result.content
    assert ws.ledger[-1].outcome == "unknown"


def test_execute_code_runs_python_in_the_root(ws: WorkspaceTools, root: Path) -> None:
    """execute_code runs isolated Python with the root as working directory."""
    result = run(ws, "execute_code", code="import os\nprint(sorted(os.listdir('.')))")
    assert result.content == "[]\n[exit code 0]"
    failing = run(ws, "execute_code", code="raise SystemExit(4)")
    assert failing.content.endswith("[exit code 4]")


def test_execute_code_timeout_is_unknown(root: Path) -> None:
    """Code that runs past code_timeout_s is killed and reported as unknown."""
    tools = WorkspaceTools(root, code_timeout_s=0.5)
    result = run(tools, "execute_code", code="import time\ntime.sleep(10)")
    assert result.is_error and result.disposition == "unknown"


# -- workspace: housekeeping ------------------------------------------------------------------
def test_todo_add_complete_list(ws: WorkspaceTools, root: Path) -> None:
    """todo keeps a numbered list in .hermes/todo.json."""
    assert run(ws, "todo", action="list").content == "(no todos)"
    run(ws, "todo", action="add", text="write tests")
    run(ws, "todo", action="add", text="ship")
    done = run(ws, "todo", action="complete", index=1)
    assert done.content == "completed todo 1: write tests\n1. [x] write tests\n2. [ ] ship"
    missing = run(ws, "todo", action="complete", index=9)
    assert missing.is_error and missing.content == "no todo with index 9 (there are 2)"
    stored = json.loads((root / ".hermes/todo.json").read_text())
    assert stored == [{"text": "write tests", "done": True}, {"text": "ship", "done": False}]


def test_todo_corrupt_store_is_an_error(ws: WorkspaceTools, root: Path) -> None:
    """A corrupt todo file is reported, not overwritten."""
    (root / ".hermes").mkdir()
    (root / ".hermes/todo.json").write_text("{oops")
    result = run(ws, "todo", action="add", text="x")
    assert result.is_error and "corrupt" in result.content
    assert (root / ".hermes/todo.json").read_text() == "{oops"


def test_memory_append_and_read(ws: WorkspaceTools, root: Path) -> None:
    """memory appends notes to .hermes/memory.md and reads them back."""
    assert run(ws, "memory", action="read").content == "(memory is empty)"
    assert run(ws, "memory", action="append", text="likes tea").content == (
        "appended 9 characters to memory"
    )
    run(ws, "memory", action="append", text="uses vim\n")
    assert run(ws, "memory", action="read").content == "likes tea\nuses vim\n"
    assert (root / ".hermes/memory.md").read_text() == "likes tea\nuses vim\n"


# -- workspace: confinement ---------------------------------------------------------------------
@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "/"])
@pytest.mark.parametrize("name", ["read_file", "write_file", "patch", "search_files"])
def test_path_escapes_are_refused(ws: WorkspaceTools, tmp_path: Path, name: str, path: str) -> None:
    """Relative escapes and absolute paths outside the root never touch anything."""
    args = {
        "read_file": {"path": path},
        "write_file": {"path": path, "content": "pwned"},
        "patch": {"path": path, "old_string": "root", "new_string": "pwned"},
        "search_files": {"pattern": "root", "path": path},
    }[name]
    result = run(ws, name, **args)
    assert result.is_error and result.disposition == "none"
    assert result.content == f"path escapes the workspace: {path}"
    assert not (tmp_path / "x").exists()


def test_absolute_path_inside_root_is_allowed(ws: WorkspaceTools, root: Path) -> None:
    """An absolute path that lands inside the root is served like a relative one."""
    (root / "in.txt").write_text("ok\n")
    assert run(ws, "read_file", path=str(root / "in.txt")).content == "     1|ok"


def test_symlinks_out_of_the_root_are_refused(
    ws: WorkspaceTools, root: Path, tmp_path: Path
) -> None:
    """Symlinked files and folders that point outside the root are refused and not followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "dirlink").symlink_to(outside, target_is_directory=True)
    assert run(ws, "read_file", path="link.txt").content.startswith("path escapes the workspace")
    assert run(ws, "write_file", path="dirlink/new.txt", content="x").is_error
    assert run(ws, "patch", path="link.txt", old_string="secret", new_string="x").is_error
    assert run(ws, "search_files", pattern="secret").content == "no matches for 'secret'"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret\n"


def test_symlink_inside_root_is_followed(ws: WorkspaceTools, root: Path) -> None:
    """A symlink whose target stays inside the root works normally."""
    (root / "real.txt").write_text("hi\n")
    (root / "alias.txt").symlink_to(root / "real.txt")
    assert run(ws, "read_file", path="alias.txt").content == "     1|hi"


# -- workspace: output cap, ledger, never-raises -------------------------------------------------
def test_output_over_the_cap_is_spilled_with_a_summary(root: Path) -> None:
    """Content over output_chars_max goes whole to a spill file; the result names it (TOOL-7)."""
    tools = WorkspaceTools(root, output_chars_max=300)
    result = run(tools, "terminal", command="python3 -c 'print(\"x\" * 1000)'")
    assert len(result.content) <= 300 + len("\n[exit code 0]")
    assert result.content.endswith("[exit code 0]")
    path = spilled_path(result.content)
    assert path is not None and (root / path).read_text() == "x" * 1000 + "\n"
    (root / "small.txt").write_text("hi\n")
    read = run(tools, "read_file", path="small.txt")  # a small result stays inline
    assert spilled_path(read.content) is None


class _NoRoom(WorkspaceTools):
    """A workspace whose spill files cannot be written, for a reason ``why`` long."""

    def __init__(self, root: Path, cap: int, why: str) -> None:
        super().__init__(root, output_chars_max=cap)
        self.why = why

    def _write_spill(self, call: ToolCall, text: str) -> str:
        raise OSError(self.why)


@pytest.mark.parametrize(("cap", "why"), [(1_000, "No space left on device"),
                                          (300, "no room " * 20), (40, "no room " * 20)])
def test_a_result_that_could_not_be_spilled_fits_the_cap_notes_included(
        root: Path, cap: int, why: str) -> None:
    """Cut because the spill failed, the whole message with its notes is at most the cap."""
    (root / "big.txt").write_text("y" * 3_000)
    content = run(_NoRoom(root, cap, why), "read_file", path="big.txt").content
    assert len(content) <= cap, len(content)
    if cap >= 300:
        assert content.startswith("     1|yyy") and "could not be saved" in content
        assert "characters cut" in content


def test_ledger_records_executed_calls_with_watermark(ws: WorkspaceTools) -> None:
    """Executed calls (not refused ones) are ledgered with the watermark and time given."""
    write = make_call("write_file", path="a.txt", content="x")
    ws.run(write, watermark=7, at=12.5)
    ws.run(make_call("read_file", "{}"), watermark=8, at=13.0)
    ws.run(make_call("read_file", path="a.txt"), watermark=9, at=14.0)
    assert [(e.name, e.watermark, e.at, e.outcome) for e in ws.ledger] == [
        ("write_file", 7, 12.5, "applied"),
        ("read_file", 9, 14.0, "applied"),
    ]
    assert ws.ledger[0].call_id == write.id and ws.ledger[0].arguments == write.arguments


def test_internal_failures_become_error_results(ws: WorkspaceTools, monkeypatch: Any) -> None:
    """An unexpected exception inside a handler is an error result with disposition unknown."""

    def explode(*_: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Path, "write_bytes", explode)
    result = run(ws, "write_file", path="a.txt", content="x")
    assert result.is_error and result.disposition == "unknown"
    assert "disk on fire" in result.content
    assert ws.ledger[-1].outcome == "unknown"


_NAMES = [*TOOLS_BY_NAME, "unknown_tool"]
_JSON_VALUES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)


def _args_for(name: str) -> st.SearchStrategy[str]:
    """JSON objects over the tool's own parameter names (plus a stray one)."""
    spec = TOOLS_BY_NAME.get(name)
    keys = [*(spec.parameters["properties"] if spec else ()), "stray"]
    values = _JSON_VALUES | st.lists(_JSON_VALUES, max_size=3)
    return st.dictionaries(st.sampled_from(keys), values, max_size=4).map(json.dumps)


def _assert_result_for(call: ToolCall, result: object) -> None:
    assert isinstance(result, ToolResult)
    assert result.call_id == call.id and result.name == call.name


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


_SPAWNING = {"terminal": "command", "execute_code": "code"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(_NAMES), call_id=st.text(max_size=10), arguments=st.text())
def test_workspace_never_raises_on_arbitrary_argument_text(
    fuzz_root: Path, name: str, call_id: str, arguments: str
) -> None:
    """Any argument text for any tool yields a ToolResult with the call id, never a raise."""
    parsed = ToolCall(id="probe", name=name, arguments=arguments).parsed_arguments() or {}
    assume(not (name in _SPAWNING and isinstance(parsed.get(_SPAWNING[name]), str)))
    call = ToolCall(id=call_id, name=name, arguments=arguments)
    _assert_result_for(call, WorkspaceTools(fuzz_root).run(call))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from([n for n in _NAMES if n not in _SPAWNING]))
def test_workspace_never_raises_on_fuzzed_parameters(
    fuzz_root: Path, data: st.DataObject, name: str
) -> None:
    """Objects with the tool's own parameter names and random values never make a tool raise."""
    call = ToolCall(id="fuzz", name=name, arguments=data.draw(_args_for(name)))
    _assert_result_for(call, WorkspaceTools(fuzz_root).run(call))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(_NAMES), text=st.text())
def test_sim_never_raises(data: st.DataObject, name: str, text: str) -> None:
    """SimTools answers arbitrary text and fuzzed parameters with a ToolResult."""
    sim = SimTools({"a.txt": "alpha\n", "d/b.txt": "beta\n"})
    for arguments in (text, data.draw(_args_for(name))):
        call = ToolCall(id="fuzz", name=name, arguments=arguments)
        _assert_result_for(call, sim.run(call))


# -- sim: parity with the workspace --------------------------------------------------------------
_INITIAL = {"a.txt": "alpha\nbeta\nalpha\n", "src/m.py": "def f():\n    return 1\n"}
_SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "a.txt"}),
    ("read_file", {"path": "a.txt", "offset": 2, "limit": 1}),
    ("read_file", {"path": "missing.txt"}),
    ("read_file", {"path": "src"}),
    ("read_file", {"path": "../etc/passwd"}),
    ("write_file", {"path": "new/dir/n.txt", "content": "fresh\n"}),
    ("write_file", {"path": "src", "content": "x"}),
    ("write_file", {"path": "a.txt/x", "content": "x"}),
    ("patch", {"path": "a.txt", "old_string": "alpha", "new_string": "A"}),
    ("patch", {"path": "a.txt", "old_string": "gamma", "new_string": "G"}),
    ("patch", {"path": "a.txt", "old_string": "beta", "new_string": "B"}),
    ("patch", {"path": "nope.txt", "old_string": "x", "new_string": "y"}),
    ("search_files", {"pattern": "alpha|def"}),
    ("search_files", {"pattern": "f", "path": "src"}),
    ("search_files", {"pattern": "["}),
    ("search_files", {"pattern": "x", "path": "missing"}),
    ("todo", {"action": "add", "text": "one"}),
    ("todo", {"action": "add", "text": "two"}),
    ("todo", {"action": "complete", "index": 2}),
    ("todo", {"action": "complete", "index": 5}),
    ("todo", {"action": "list"}),
    ("memory", {"action": "append", "text": "remember me"}),
    ("memory", {"action": "read"}),
    ("search_files", {"pattern": "one|remember"}),
    ("terminal", {"command": "echo hello world"}),
    ("read_file", {"path": "a.txt", "limit": "3"}),
    ("unknown", {}),
]


def _results(tools: Runner) -> list[tuple[str, bool, str]]:
    return [
        (r.content, r.is_error, r.disposition)
        for r in (tools.run(ToolCall(id="p", name=n, arguments=json.dumps(a))) for n, a in _SCRIPT)
    ]


def test_sim_and_workspace_agree_on_the_behaviour_table(root: Path) -> None:
    """The same script gives the same results and the same final files in both worlds."""
    for rel, text in _INITIAL.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    ws, sim = WorkspaceTools(root), SimTools(_INITIAL)
    assert _results(sim) == _results(ws)
    assert sim.snapshot_files() == tree(root)
    assert [(e.name, e.outcome) for e in sim.ledger] == [(e.name, e.outcome) for e in ws.ledger]


# -- sim: simulation, ledger and faults ------------------------------------------------------------
def test_sim_terminal_and_code_are_deterministic() -> None:
    """Simulated processes print derived text: echo echoes, others say what ran."""
    sim = SimTools()
    assert run(sim, "terminal", command="echo 'a  b' c").content == "a  b c\n[exit code 0]"
    assert run(sim, "terminal", command="make test").content == "ran: make test\n[exit code 0]"
    assert run(sim, "execute_code", code="a = 1\nprint(a)\n").content == (
        "executed 2 lines\n[exit code 0]"
    )


def test_sim_ledger_records_every_executed_call() -> None:
    """Reads and writes are ledgered with watermark and time; refused arguments are not."""
    sim = SimTools({"f.txt": "x"})
    sim.run(make_call("read_file", path="f.txt"), watermark=3, at=1.0)
    sim.run(make_call("write_file", path="g.txt"), watermark=4, at=2.0)
    sim.run(make_call("write_file", path="g.txt", content="y"), watermark=5, at=3.0)
    assert [(e.name, e.watermark, e.at) for e in sim.ledger] == [
        ("read_file", 3, 1.0), ("write_file", 5, 3.0),
    ]
    sim.reset_ledger()
    assert sim.ledger == []


def test_sim_fail_next_fails_exactly_one_call() -> None:
    """fail_next makes only the next executed call of that tool an error; nothing changes."""
    sim = SimTools()
    sim.fail_next("write_file", "disk full")
    failed = run(sim, "write_file", path="a.txt", content="x")
    assert failed.is_error and failed.content == "disk full"
    assert sim.snapshot_files() == {}
    assert sim.ledger[-1].outcome == "error"
    assert not run(sim, "write_file", path="a.txt", content="x").is_error
    assert sim.snapshot_files() == {"a.txt": "x"}


def test_sim_hang_reports_timeouts_until_cleared() -> None:
    """hang makes every call of the tool time out with disposition unknown until cleared."""
    sim = SimTools()
    sim.hang("terminal")
    assert sim.is_hung("terminal")
    for _ in range(2):
        result = run(sim, "terminal", command="echo hi")
        assert result.is_error and result.disposition == "unknown"
        assert "timed out" in result.content
    assert sim.ledger[-1].outcome == "unknown"
    sim.clear_faults()
    assert not run(sim, "terminal", command="echo hi").is_error


def test_sim_costs_have_defaults_and_overrides() -> None:
    """cost_s is 0.01 s by default, 0.5 s for terminal, and can be overridden."""
    sim = SimTools(costs={"execute_code": 2.0})
    assert sim.cost_s("read_file") == 0.01
    assert sim.cost_s("terminal") == 0.5
    assert sim.cost_s("execute_code") == 2.0


def test_sim_snapshot_is_a_copy_and_paths_are_confined() -> None:
    """snapshot_files cannot change the world, and escaping paths are refused."""
    sim = SimTools({"./a.txt": "x"})
    sim.snapshot_files()["a.txt"] = "changed"
    assert sim.snapshot_files() == {"a.txt": "x"}
    escape = run(sim, "write_file", path="/tmp/x", content="y")
    assert escape.content == "path escapes the workspace: /tmp/x"


def test_sim_spills_like_the_workspace() -> None:
    """SimTools spills an oversized result to its filesystem with the same summary."""
    sim = SimTools({"big.txt": "y" * 500}, output_chars_max=300)
    content = run(sim, "read_file", path="big.txt").content
    path = spilled_path(content)
    assert path is not None and path.startswith(".hermes/spill/0001-") and len(content) <= 300
    assert sim.snapshot_files()[path] == "     1|" + "y" * 500
