"""Deterministic twins of the reference tools over an in-memory filesystem.

Theory of operation
-------------------
``SimTools`` keeps the workspace as ``dict[str, str]``: normalized relative paths to
text. Folders are implied by the paths (``"a/b.txt"`` makes ``"a"`` a folder). Argument
validation and result texts come from ``hermes_ref.tool_specs``, and what each tool does
to text (render, patch, search, the todo list, the memory notes) from
``hermes_ref.tool_text``: the same functions ``WorkspaceTools`` uses, so a script of
file calls gives the same results in both worlds. The todo list and the notes live in
the same dict under ``.hermes/`` and show up in ``snapshot_files``.

Paths resolve as the real tools resolve them. The workspace has an absolute root
(``SIM_ROOT``, ``/workspace``), so a call may name ``/workspace/a.txt``; symlinks
(``add_links``: a link's path and its target, relative to the link's folder or
absolute, as ``ln -s`` takes them) are followed component by component with ``..``
taken after the link, as ``os.path.realpath`` does. Every tool acts through
``_resolve``, and ``resolve_paths`` answers the engine's ``ResolvePaths`` with it, so
the segment planner sees the files the calls will touch. Each ledger entry records the
path its call was aimed at, as resolved when it ran (``SimLedgerEntry.path``): the
segment checker judges overlap on that, not on the engine's plan.

``terminal`` and ``execute_code`` are simulated: ``echo X`` prints ``X``, any other
command prints ``ran: <command>``, and code prints ``executed <n> lines``; both exit 0.

Every call that passes validation is *executed* and appended to ``ledger`` (reads too),
with the caller's ``watermark`` and ``at``: checkers compare the ledger with the durable
record to prove persist-before-execute. Fault hooks act at execution, after validation:

* ``fail_next(name, message)`` queues one error result for the next call of ``name``;
* ``hang(name)`` makes every call of ``name`` report a timeout (disposition
  ``unknown``) until ``clear_faults``; the driver uses ``is_hung`` to jump its virtual
  clock to the batch deadline.

``cost_s(name)`` is the simulated duration the driver adds to its virtual clock.
Like the real tools, a call never raises (TOOL-6).
"""

from __future__ import annotations

import posixpath
import shlex
from collections import deque
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any

from hermes_ref.errors import BadInput
from hermes_ref.models import ToolCall, ToolResult
from hermes_ref.ports import LedgerEntry
from hermes_ref.tool_specs import (
    MEMORY_PATH,
    SEARCH_MATCHES_MAX,
    TODO_PATH,
    GuardedRunner,
    check_call,
    error_result,
    escape_message,
    format_process,
    is_directory_message,
    ledger_outcome,
    normalize_in_root,
    not_a_directory_message,
    not_found_message,
    ok_result,
    path_argument,
    relative_path,
    timeout_message,
    wrote_message,
)
from hermes_ref.tool_text import (
    Change,
    apply_memory,
    apply_todo,
    compile_pattern,
    format_matches,
    in_hidden_dir,
    render_lines,
    replace_once,
    search_text,
)

DEFAULT_COST_S = 0.01
DEFAULT_COSTS: Mapping[str, float] = {"terminal": 0.5}
SIM_ROOT = "/workspace"  # the simulated workspace's absolute root

Handler = Callable[[ToolCall, dict[str, Any]], ToolResult]


class _Refused(Exception):
    """Internal: the call cannot proceed; the message is the error result's content."""


class SimLedgerEntry(LedgerEntry):
    """A ledger entry that also says where the call was aimed, as the world resolved it.

    ``path`` is workspace-relative ("." for the root) for a READER/WRITER call, and None
    for other tools and for a path the tools refused (nothing was touched).
    """

    path: str | None = None


class SimTools(GuardedRunner):
    """Simulated tools over an in-memory filesystem; see the module docstring."""

    def __init__(
        self,
        files: Mapping[str, str] | None = None,
        *,
        costs: Mapping[str, float] | None = None,
        output_chars_max: int = 50_000,
        root: str = SIM_ROOT,
    ) -> None:
        self.root = posixpath.normpath(root)
        if not posixpath.isabs(self.root):
            raise BadInput(f"the simulated root must be absolute: {root!r}")
        self._files: dict[str, str] = {}
        self._links: dict[str, str] = {}
        self.add_files(files or {})
        self._costs = {**DEFAULT_COSTS, **(costs or {})}
        self.output_chars_max = output_chars_max
        self._failures: dict[str, deque[str]] = {}
        self._hung: set[str] = set()
        self.ledger: list[LedgerEntry] = []
        self._handlers: dict[str, Handler] = {
            "read_file": self._read_file,
            "write_file": self._write_file,
            "patch": self._patch,
            "search_files": self._search_files,
            "terminal": self._terminal,
            "todo": self._todo,
            "memory": self._memory,
            "execute_code": self._execute_code,
        }

    # -- world control -------------------------------------------------------------
    def add_files(self, files: Mapping[str, str]) -> None:
        """Put files into the simulated workspace (a story's setup; no ledger entry)."""
        for path, text in files.items():
            rel = relative_path(path)
            if rel is None or rel == ".":
                raise BadInput(f"file path is not inside the workspace: {path!r}")
            if rel in self._links:
                raise BadInput(f"a symlink is already at {rel!r}")
            self._files[rel] = text

    def add_links(self, links: Mapping[str, str]) -> None:
        """Put symlinks into the workspace: link path -> target, as ``ln -s target link``.

        The target is relative to the link's folder, or absolute (``/workspace/a.txt``);
        it may dangle or point outside the root, as a real one may.
        """
        for path, target in links.items():
            rel = relative_path(path)
            if rel is None or rel == ".":
                raise BadInput(f"link path is not inside the workspace: {path!r}")
            if rel in self._files or self._is_dir(rel):
                raise BadInput(f"a file or folder is already at {rel!r}")
            if not target:
                raise BadInput(f"the link {rel!r} has an empty target")
            self._links[rel] = target

    def fail_next(self, name: str, message: str = "simulated tool failure") -> None:
        """The next executed call of ``name`` returns an error result with ``message``."""
        self._failures.setdefault(name, deque()).append(message)

    def hang(self, name: str) -> None:
        """Every call of ``name`` times out (disposition unknown) until ``clear_faults``."""
        self._hung.add(name)

    def is_hung(self, name: str) -> bool:
        return name in self._hung

    def clear_faults(self) -> None:
        self._failures.clear()
        self._hung.clear()

    def cost_s(self, name: str) -> float:
        """Simulated duration of one call of ``name``, in virtual seconds."""
        return self._costs.get(name, DEFAULT_COST_S)

    def snapshot_files(self) -> dict[str, str]:
        return dict(self._files)

    def reset_ledger(self) -> None:
        self.ledger.clear()

    # -- the port (``run`` comes from GuardedRunner) -----------------------------------
    def _run(self, call: ToolCall, watermark: int, at: float) -> ToolResult:
        checked = check_call(call)
        if isinstance(checked, ToolResult):
            return checked
        spec, args = checked
        raw = path_argument(call, spec)
        aimed = None if raw is None else self.resolve_path(raw)  # before the call may move it
        result = self._execute(call, spec.name, args)
        self.ledger.append(
            SimLedgerEntry(
                call_id=call.id, name=call.name, arguments=call.arguments,
                watermark=watermark, at=at, outcome=ledger_outcome(result), path=aimed,
            )
        )
        return result

    def _execute(self, call: ToolCall, name: str, args: dict[str, Any]) -> ToolResult:
        if name in self._hung:
            return error_result(call, timeout_message(name), "unknown")
        queued = self._failures.get(name)
        if queued:
            return error_result(call, queued.popleft())
        try:
            return self._handlers[name](call, args)
        except _Refused as refusal:
            return error_result(call, str(refusal))

    # -- paths ---------------------------------------------------------------------
    def resolve_paths(self, paths: tuple[str, ...]) -> tuple[str | None, ...]:
        """Where each path lands, workspace-relative, or None when refused (``ResolvePaths``)."""
        return tuple(self.resolve_path(path) for path in paths)

    def resolve_path(self, path: str) -> str | None:
        try:
            return self._resolve(path)
        except _Refused:
            return None

    def _resolve(self, path: str) -> str:
        """``path`` resolved inside the root, as ``WorkspaceTools._resolve`` does it.

        The shared lexical step first (``normalize_in_root``), then symlinks; the result
        must still be inside the root. Raises ``_Refused`` with the refusal's words.
        """
        rel = normalize_in_root(path, self.root)
        if rel is None:
            raise _Refused(escape_message(path))
        real = self._real(self.root, rel, {})
        if real is None:
            raise _Refused(f"invalid path {path!r}: symlink loop")
        inside = normalize_in_root(real, self.root)
        if inside is None:
            raise _Refused(escape_message(path))
        return inside

    def _real(self, base: str, rest: str, seen: dict[str, str | None]) -> str | None:
        """``os.path.realpath``'s walk over the simulated tree: ``rest`` read from ``base``.

        Each component is taken in turn: ``..`` goes to the parent of what is resolved so
        far, a link is replaced by its resolved target. None on a loop.
        """
        path = "/" if rest.startswith("/") else base
        for name in rest.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                path = posixpath.dirname(path)
                continue
            candidate = posixpath.join(path, name)
            target = self._link_at(candidate)
            if target is None:
                path = candidate
                continue
            if candidate in seen:
                known = seen[candidate]
                if known is None:
                    return None  # the link is being resolved further up: a loop
                path = known
                continue
            seen[candidate] = None
            followed = self._real(path, target, seen)
            if followed is None:
                return None
            seen[candidate] = path = followed
        return path

    def _link_at(self, absolute: str) -> str | None:
        """The target of the simulated link at ``absolute``, if there is one (only in the root)."""
        rel = normalize_in_root(absolute, self.root)
        return None if rel is None else self._links.get(rel)

    # -- the in-memory filesystem --------------------------------------------------
    def _path(self, path: str) -> str:
        return self._resolve(path)

    def _is_dir(self, rel: str) -> bool:
        return rel == "." or any(key.startswith(rel + "/") for key in chain(self._files, self._links))

    def _text(self, rel: str) -> str:
        if self._is_dir(rel):
            raise _Refused(is_directory_message(rel))
        if rel not in self._files:
            raise _Refused(not_found_message(rel))
        return self._files[rel]

    def _store(self, rel: str, text: str) -> None:
        parent = posixpath.dirname(rel)
        while parent:
            if parent in self._files:
                raise _Refused(not_a_directory_message(rel))
            parent = posixpath.dirname(parent)
        self._files[rel] = text

    def _apply(self, call: ToolCall, rel: str, change: Change) -> ToolResult:
        if change.is_error:
            return error_result(call, change.message)
        if change.new is not None:
            self._store(rel, change.new)
        return ok_result(call, change.message)

    # -- file tools ----------------------------------------------------------------
    def _read_file(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        rel = self._path(args["path"])
        return ok_result(call, render_lines(self._text(rel), rel, args["offset"], args["limit"]))

    def _write_file(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        rel = self._path(args["path"])
        if self._is_dir(rel):
            raise _Refused(is_directory_message(rel))
        self._store(rel, args["content"])
        return ok_result(call, wrote_message(args["content"], rel))

    def _patch(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        rel = self._path(args["path"])
        change = replace_once(self._text(rel), args["old_string"], args["new_string"], rel)
        return self._apply(call, rel, change)

    def _search_files(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        regex = compile_pattern(args["pattern"])
        if isinstance(regex, str):
            raise _Refused(regex)
        matches: list[str] = []
        for rel, text in self._files_under(self._path(args["path"])):
            matches.extend(search_text(regex, rel, text))
            if len(matches) > SEARCH_MATCHES_MAX:
                break
        return ok_result(call, format_matches(matches, args["pattern"]))

    def _files_under(self, base: str) -> list[tuple[str, str]]:
        """``(relpath, text)`` of the files under ``base`` in path order, hidden folders skipped.

        A link to a file in the root is listed under its own name, as ``os.walk`` lists
        it for the real search; a link to a folder is not walked into.
        """
        if base in self._files:
            return [(base, self._files[base])]
        if not self._is_dir(base):
            raise _Refused(not_found_message(base))
        prefix = "" if base == "." else base + "/"
        found = [(key, self._files[key]) for key in self._files]
        for link in self._links:
            target = self.resolve_path(link)
            if target is not None and target in self._files:
                found.append((link, self._files[target]))
        return sorted(
            (key, text) for key, text in found
            if key.startswith(prefix) and not in_hidden_dir(key[len(prefix):])
        )

    # -- housekeeping --------------------------------------------------------------
    def _todo(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        return self._apply(call, TODO_PATH, apply_todo(self._files.get(TODO_PATH), args))

    def _memory(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        return self._apply(call, MEMORY_PATH, apply_memory(self._files.get(MEMORY_PATH), args))

    # -- simulated processes -------------------------------------------------------
    def _terminal(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        return ok_result(call, format_process(simulated_terminal_output(args["command"]), 0))

    def _execute_code(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        lines = len(args["code"].splitlines())
        return ok_result(call, format_process(f"executed {lines} lines", 0))


def simulated_terminal_output(command: str) -> str:
    """``echo X`` prints ``X`` and a newline; any other command prints ``ran: <command>``."""
    stripped = command.strip()
    if stripped != "echo" and not stripped.startswith("echo "):
        return f"ran: {command}"
    words = stripped[len("echo") :]
    try:
        return " ".join(shlex.split(words)) + "\n"
    except ValueError:  # unbalanced quotes: print the words as they are
        return words.strip() + "\n"
