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

Time in a batch (TOOL-5, run by ``sim.tool_batch``): ``slow(name, seconds, path=...,
start_delay_s=...)`` scripts how long matching calls run and how long they take to
begin once dispatched (a call waiting for an approval or a lock); ``stuck(name, ...)``
makes them never return. ``timing(call)`` answers the driver. ``stall_s=...`` on either
freezes the calling process while the first such call waits out its start delay (a late
call whose process stalls past its lease, LEASE-4): ``late_stall_s(call)`` tells the
batch runner how long, once, and ``late_stalls`` lists the freezes it carried out. Each ledger entry of a
call run in a batch carries the batch's record (``BatchStamp``): when the batch began,
when the call got a worker, was dispatched, started (``at``) and ended; checkers judge
the worker count, the start gate and the deadline on it.

An oversized result (over ``output_chars_max``) is spilled (TOOL-7): the whole text is
written to ``.hermes/spill/`` in the in-memory filesystem and the call gets a summary
naming it; its ledger entry records the whole text's size and digest and the digest of
the file as read back. ``print_next(name, text)`` makes the next ``terminal`` or
``execute_code`` call print ``text`` (a huge output, say).
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import shlex
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any

from hermes_ref.errors import BadInput
from hermes_ref.limits import Limits
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
from hermes_ref.tool_spill import spill_name
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
SPILL_NAMES_MAX = 64  # names a spill tries before it gives up (``SimTools._write_spill``)
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
    # TOOL-5: the batch's record of this call (None outside a batch), absolute virtual times
    batch: int | None = None
    parallel: bool = False
    batch_at: float | None = None
    ready_at: float | None = None       # got a worker
    dispatched_at: float | None = None  # passed the start gate
    ended_at: float | None = None       # None with ``stuck``: it never ends
    stuck: bool = False
    pid: int | None = None  # the simulated process that ran the batch (its pauses delay it)
    # the session the batch ran for, as its effect named it under the session's lease: with
    # ``watermark``, it tells the turn that ran the call when turns of other sessions write
    # between that turn's call row and its tools
    session_id: str | None = None
    # TOOL-7: the whole output's size and digest, and the spill file's, as read back
    output_chars: int = 0
    output_sha256: str = ""
    spilled_to: str | None = None
    spill_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class BatchStamp:
    """What the batch runner knows of a call when it starts (``SimLedgerEntry`` fields)."""

    batch: int
    parallel: bool
    batch_at: float
    ready_at: float
    dispatched_at: float
    ended_at: float | None
    pid: int | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class _Timing:
    name: str
    path: str | None
    duration_s: float
    start_delay_s: float
    stall_s: float = 0.0  # the process freezes this long as the first call waits to begin


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class SimTools(GuardedRunner):
    """Simulated tools over an in-memory filesystem; see the module docstring."""

    def __init__(
        self,
        files: Mapping[str, str] | None = None,
        *,
        costs: Mapping[str, float] | None = None,
        output_chars_max: int = Limits().tool_result_spill_chars,  # TOOL-7's cap
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
        self._timings: list[_Timing] = []
        self._late_stalled: set[int] = set()  # timing rules whose freeze was handed out
        self.late_stalls: list[tuple[int, float, float]] = []  # (pid, from, until), run
        self._outputs: dict[str, deque[str]] = {}
        self._stamp: BatchStamp | None = None
        self._spills = 0
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
        self._timings.clear()
        self._late_stalled.clear()

    def slow(self, name: str, seconds: float, *, path: str | None = None,
             start_delay_s: float = 0.0, stall_s: float = 0.0) -> None:
        """Calls of ``name`` (aimed at ``path``, if given) run ``seconds`` and begin
        ``start_delay_s`` after dispatch, in virtual time; the latest rule wins. With
        ``stall_s``, the process running the first such call freezes that long as the call
        begins to wait out its delay (see ``late_stall_s``)."""
        if not (seconds >= 0 and start_delay_s >= 0 and stall_s >= 0):
            raise BadInput(f"a tool's times must not be negative: {seconds}, {start_delay_s}, "
                           f"{stall_s}")
        self._timings.append(_Timing(name, path, seconds, start_delay_s, stall_s))

    def stuck(self, name: str, *, path: str | None = None, start_delay_s: float = 0.0,
              stall_s: float = 0.0) -> None:
        """Calls of ``name`` (aimed at ``path``, if given) never return."""
        if not (start_delay_s >= 0 and stall_s >= 0):
            raise BadInput(f"a tool's times must not be negative: {start_delay_s}, {stall_s}")
        self._timings.append(_Timing(name, path, math.inf, start_delay_s, stall_s))

    def disarm_late_stalls(self) -> None:
        """No rule set so far freezes a process any more (a calm phase: faults off, while
        the tools stay as slow as they were)."""
        self._late_stalled.update(range(len(self._timings)))

    def late_stall_s(self, call: ToolCall) -> float:
        """How long the process of ``call`` freezes as the call begins to wait out its start
        delay: the ``stall_s`` of the rule that times it, handed out once per rule (the
        first call that waits), else 0."""
        path = path_argument(call)
        for index in reversed(range(len(self._timings))):
            rule = self._timings[index]
            if rule.name == call.name and rule.path in (None, path):
                if rule.stall_s <= 0 or rule.start_delay_s <= 0 or index in self._late_stalled:
                    return 0.0
                self._late_stalled.add(index)
                return rule.stall_s
        return 0.0

    def timing(self, call: ToolCall) -> tuple[float, float]:
        """(start delay, duration) of ``call`` in virtual seconds (duration inf: stuck)."""
        path = path_argument(call)
        for rule in reversed(self._timings):
            if rule.name == call.name and rule.path in (None, path):
                return rule.start_delay_s, rule.duration_s
        return 0.0, self.cost_s(call.name)

    def print_next(self, name: str, text: str) -> None:
        """The next ``terminal`` or ``execute_code`` call of ``name`` prints ``text``."""
        if name not in ("terminal", "execute_code"):
            raise BadInput(f"only terminal and execute_code print output, not {name!r}")
        self._outputs.setdefault(name, deque()).append(text)

    def run_stamped(self, call: ToolCall, stamp: BatchStamp, *, watermark: int,
                    at: float) -> ToolResult:
        """``run`` inside a batch: the ledger entry carries the batch's record."""
        self._stamp = stamp
        try:
            return self.run(call, watermark=watermark, at=at)
        finally:
            self._stamp = None

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
        whole = self._execute(call, spec.name, args)
        self._last_spill = None
        result = self.spill(call, whole)
        spilled = None if result is whole else self._last_spill
        stamp = self._stamp
        timing = {} if stamp is None else {
            "batch": stamp.batch, "parallel": stamp.parallel, "batch_at": stamp.batch_at,
            "ready_at": stamp.ready_at, "dispatched_at": stamp.dispatched_at,
            "ended_at": stamp.ended_at, "stuck": stamp.ended_at is None, "pid": stamp.pid,
            "session_id": stamp.session_id}
        self.ledger.append(
            SimLedgerEntry(
                call_id=call.id, name=call.name, arguments=call.arguments,
                watermark=watermark, at=at, outcome=ledger_outcome(result), path=aimed,
                output_chars=len(whole.content), output_sha256=sha256_text(whole.content),
                spilled_to=spilled,
                spill_sha256=None if spilled is None or spilled not in self._files
                else sha256_text(self._files[spilled]),
                **timing,
            )
        )
        return result

    _last_spill: str | None = None

    def _write_spill(self, call: ToolCall, text: str) -> str:
        """TOOL-7: the whole text into a new file under ``.hermes/spill/``.

        A name another file holds is skipped, as the workspace runner skips one another
        runner took; the search gives up after ``SPILL_NAMES_MAX`` names (an ``OSError``,
        which the runner reports as an unsaved output), so a naming that keeps answering
        a taken name is a spill that failed, never a world that hangs."""
        for _ in range(SPILL_NAMES_MAX):
            self._spills += 1
            path = spill_name(self._spills, call.id)
            if path not in self._files:
                break
        else:
            raise OSError(f"no free spill name for {call.id} after {SPILL_NAMES_MAX} tries")
        self._store(path, text)
        self._last_spill = path
        return path

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
        printed = self._printed("terminal")
        output = simulated_terminal_output(args["command"]) if printed is None else printed
        return ok_result(call, format_process(output, 0))

    def _execute_code(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        printed = self._printed("execute_code")
        if printed is not None:
            return ok_result(call, format_process(printed, 0))
        lines = len(args["code"].splitlines())
        return ok_result(call, format_process(f"executed {lines} lines", 0))

    def _printed(self, name: str) -> str | None:
        queued = self._outputs.get(name)
        return queued.popleft() if queued else None


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
