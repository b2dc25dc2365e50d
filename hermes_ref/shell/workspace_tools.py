"""The reference tools, really run in a workspace folder.

Theory of operation
-------------------
``WorkspaceTools.run`` is the synchronous ``ToolRunner`` port; the asyncio driver calls
it through ``asyncio.to_thread``. One call goes through three steps:

1. ``check_call`` (shared with the simulator, in ``hermes_ref.tool_specs``) validates
   the name and arguments. A refusal is an error result with disposition ``none``;
   nothing happened and nothing is ledgered.
2. The call is executed by its handler, and a ``LedgerEntry`` carrying the caller's
   ``watermark`` and ``at`` is appended: the ledger is the tool world's own record of
   what ran, which checkers compare with the durable record.
3. Content over ``output_chars_max`` characters is spilled (TOOL-7): the whole text is
   written to a new file under ``spill_dir`` (``<root>/.hermes/spill`` by default) and
   the model gets a summary naming it (``hermes_ref.tool_spill``).

A tool never raises (TOOL-6): ``OSError`` becomes an error result, and any other
exception becomes an error result with disposition ``unknown``, because the handler may
have stopped half-way.

Paths are confined to the root: every path argument is resolved, first as a string
against the root (``normalize_in_root``, so an absolute in-root path is accepted), then
with symlinks followed, and must land inside the resolved root, otherwise the call is
refused before anything is touched. ``resolve_paths`` answers the engine's
``ResolvePaths`` with that same resolution, so the segment planner sees the files the
calls will act on.

``terminal`` and ``execute_code`` run in a new session (their own process group) with
the root as working directory, through ``hermes_ref.shell.process_output``: the output is
read as it streams, at most the cap and a bounded tail stay in memory and the rest goes
straight to the spill file; on timeout the whole tree is killed (the group, every
descendant, a ``setsid`` grandchild included, and whatever still holds the pipe) and
reaped, the call returns at its timeout and the result says the effects are unknown.
When the spill file cannot be written the output is still read to its end and the result
shows its head and tail, within the cap, with a note of why the whole is in no file; any
other failure once the process has started ends its tree and the result says the
effects are unknown (it never says the call could not start).
The confinement applies to path arguments only: a shell command can reach whatever the
process can.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from hermes_ref.errors import BadInput
from hermes_ref.models import Disposition, ToolCall, ToolResult
from hermes_ref.ports import LedgerEntry
from hermes_ref.shell.process_output import ProcessLost, ProcessOutcome, run_process
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
    timeout_message,
    unsaved_output,
    wrote_message,
)
from hermes_ref.tool_spill import PREVIEW_CHARS_MAX, preview_chars, spill_name, spill_summary
from hermes_ref.tool_text import (
    Change,
    apply_memory,
    apply_todo,
    compile_pattern,
    format_matches,
    render_lines,
    replace_once,
    search_text,
)

READ_BYTES_MAX = 10_000_000  # larger files are refused by read_file/patch, skipped by search

Handler = Callable[[ToolCall, dict[str, Any]], ToolResult]


class WorkspaceTools(GuardedRunner):
    """Real tools confined to ``root``; see the module docstring."""

    def __init__(
        self,
        root: Path,
        *,
        terminal_timeout_s: float = 30.0,
        code_timeout_s: float = 30.0,
        output_chars_max: int = 50_000,
        spill_dir: Path | None = None,
    ) -> None:
        self.root = root.resolve()
        if not self.root.is_dir():
            raise BadInput(f"workspace root is not a directory: {root}")
        self.spill_dir = spill_dir.resolve() if spill_dir is not None else None
        self._spills = 0
        self.terminal_timeout_s = terminal_timeout_s
        self.code_timeout_s = code_timeout_s
        self.output_chars_max = output_chars_max
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

    def _run(self, call: ToolCall, watermark: int, at: float) -> ToolResult:
        checked = check_call(call)
        if isinstance(checked, ToolResult):
            return checked
        spec, args = checked
        try:
            result = self._handlers[spec.name](call, args)
        except OSError as exc:
            disposition: Disposition = "unknown" if spec.side_effecting else "none"
            result = error_result(call, f"{spec.name} failed: {exc.strerror or exc}", disposition)
        except Exception as exc:
            result = error_result(call, f"{spec.name} failed: {exc!r}", "unknown")
        self.ledger.append(
            LedgerEntry(
                call_id=call.id, name=call.name, arguments=call.arguments,
                watermark=watermark, at=at, outcome=ledger_outcome(result),
            )
        )
        return result

    # -- paths ---------------------------------------------------------------------
    def resolve_paths(self, paths: tuple[str, ...]) -> tuple[str | None, ...]:
        """Where each path lands, workspace-relative, or None when refused (``ResolvePaths``).

        The same ``_resolve`` every tool acts through, so the segment planner compares
        exactly the files the calls will touch.
        """
        return tuple(self.resolve_path(path) for path in paths)

    def resolve_path(self, path: str) -> str | None:
        target = self._resolve(path)
        return None if isinstance(target, str) else self._rel(target)

    def _resolve(self, path: str) -> Path | str:
        """``path`` resolved inside the root, or the refusal message.

        First the shared lexical step (``normalize_in_root``: an absolute in-root path is
        made relative, ``..`` collapsed as a string), then the tree's: symlinks followed,
        and the result must still be inside the resolved root.
        """
        rel = normalize_in_root(path, self.root.as_posix())
        if rel is None:
            return escape_message(path)
        try:
            resolved = (self.root / rel).resolve()
        except (OSError, ValueError, RuntimeError) as exc:
            return f"invalid path {path!r}: {exc}"
        if not resolved.is_relative_to(self.root):
            return escape_message(path)
        return resolved

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # -- spill files (TOOL-7) -------------------------------------------------------
    def _open_spill(self, call: ToolCall) -> tuple[str, TextIO]:
        """A new spill file for ``call``: its name as the model sees it, and the file.

        Under the workspace, the name is workspace-relative (``read_file`` can page
        through it); in a configured ``spill_dir`` it is the absolute path.
        """
        while True:
            self._spills += 1
            rel = spill_name(self._spills, call.id)
            if self.spill_dir is None:
                target, name = self.root / rel, rel
            else:
                target = self.spill_dir / Path(rel).name
                name = target.as_posix()
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                handle = target.open("x", encoding="utf-8", errors="replace")
            except FileExistsError:
                continue  # another runner on this folder took that number
            return name, handle

    def _write_spill(self, call: ToolCall, text: str) -> str:
        name, handle = self._open_spill(call)
        with handle:
            handle.write(text)
        return name

    def _file_problem(self, target: Path) -> str | None:
        """Why ``target`` cannot be read as a text file, or None."""
        rel = self._rel(target)
        if target.is_dir():
            return is_directory_message(rel)
        if not target.exists():
            return not_found_message(rel)
        if not target.is_file():
            return f"not a regular file: {rel}"
        if target.stat().st_size > READ_BYTES_MAX:
            return f"file too large: {rel} (over {READ_BYTES_MAX} bytes)"
        return None

    def _text_file(self, path: str) -> tuple[Path, str] | str:
        """The resolved path and UTF-8 text of an existing file, or the error message."""
        target = self._resolve(path)
        if isinstance(target, str):
            return target
        problem = self._file_problem(target)
        if problem is not None:
            return problem
        try:
            return target, target.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return f"not a UTF-8 text file: {self._rel(target)}"

    def _store(self, target: Path, text: str) -> str | None:
        """Write ``text`` to ``target`` (parents created); a message if that cannot start."""
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            return not_a_directory_message(self._rel(target))
        target.write_bytes(text.encode("utf-8"))
        return None

    # -- file tools ----------------------------------------------------------------
    def _read_file(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        found = self._text_file(args["path"])
        if isinstance(found, str):
            return error_result(call, found)
        target, text = found
        return ok_result(call, render_lines(text, self._rel(target), args["offset"], args["limit"]))

    def _write_file(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        target = self._resolve(args["path"])
        if isinstance(target, str):
            return error_result(call, target)
        rel = self._rel(target)
        if target.is_dir():
            return error_result(call, is_directory_message(rel))
        problem = self._store(target, args["content"])
        if problem is not None:
            return error_result(call, problem)
        return ok_result(call, wrote_message(args["content"], rel))

    def _patch(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        found = self._text_file(args["path"])
        if isinstance(found, str):
            return error_result(call, found)
        target, text = found
        change = replace_once(text, args["old_string"], args["new_string"], self._rel(target))
        return self._apply(call, target, change)

    def _apply(self, call: ToolCall, target: Path, change: Change) -> ToolResult:
        if change.is_error:
            return error_result(call, change.message)
        if change.new is not None:
            problem = self._store(target, change.new)
            if problem is not None:
                return error_result(call, problem)
        return ok_result(call, change.message)

    def _search_files(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        regex = compile_pattern(args["pattern"])
        if isinstance(regex, str):
            return error_result(call, regex)
        base = self._resolve(args["path"])
        if isinstance(base, str):
            return error_result(call, base)
        if not base.exists():
            return error_result(call, not_found_message(self._rel(base)))
        matches: list[str] = []
        for rel, path in self._files_under(base):
            text = self._searchable_text(path)
            if text is not None:
                matches.extend(search_text(regex, rel, text))
            if len(matches) > SEARCH_MATCHES_MAX:
                break
        return ok_result(call, format_matches(matches, args["pattern"]))

    def _files_under(self, base: Path) -> list[tuple[str, Path]]:
        """``(relpath, path)`` of every file under ``base``, hidden folders skipped, sorted."""
        if not base.is_dir():
            return [(self._rel(base), base)]
        found: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [name for name in dirnames if not name.startswith(".")]
            for name in filenames:
                path = Path(dirpath, name)
                found.append((self._rel(path), path))
        return sorted(found)

    def _searchable_text(self, path: Path) -> str | None:
        """The text of a regular UTF-8 file inside the root; None for anything else."""
        try:
            resolved = path.resolve()
            if not resolved.is_relative_to(self.root) or self._file_problem(resolved):
                return None
            return resolved.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError, RuntimeError):
            return None

    # -- housekeeping --------------------------------------------------------------
    def _todo(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        return self._housekeeping(call, TODO_PATH, lambda raw: apply_todo(raw, args))

    def _memory(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        return self._housekeeping(call, MEMORY_PATH, lambda raw: apply_memory(raw, args))

    def _housekeeping(
        self, call: ToolCall, path: str, decide: Callable[[str | None], Change]
    ) -> ToolResult:
        target = self._resolve(path)
        if isinstance(target, str):
            return error_result(call, target)
        raw: str | None = None
        if target.exists():
            found = self._text_file(path)
            if isinstance(found, str):
                return error_result(call, found)
            raw = found[1]
        return self._apply(call, target, decide(raw))

    # -- processes -----------------------------------------------------------------
    def _terminal(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        timeout_s: float = args.get("timeout_s") or self.terminal_timeout_s
        return self._spawn(call, args["command"], shell=True, timeout_s=timeout_s)

    def _execute_code(self, call: ToolCall, args: dict[str, Any]) -> ToolResult:
        argv = [sys.executable, "-I", "-c", args["code"]]
        return self._spawn(call, argv, shell=False, timeout_s=self.code_timeout_s)

    def _spawn(
        self, call: ToolCall, command: str | list[str], *, shell: bool, timeout_s: float
    ) -> ToolResult:
        """Run a process in its own session; output is stdout and stderr interleaved."""
        cap = self.output_chars_max
        try:
            done = run_process(command, shell=shell, cwd=self.root, timeout_s=timeout_s,
                               cap_chars=cap, tail_chars=PREVIEW_CHARS_MAX,
                               open_spill=lambda: self._open_spill(call))
        except ProcessLost as exc:  # it ran, then reading it failed: it was ended
            return error_result(call, f"{call.name} failed while it ran and was ended: {exc}; "
                                "its effects are unknown", "unknown")
        except (OSError, ValueError) as exc:
            return error_result(call, f"{call.name} could not start: {exc}")
        if done.exit_code is None:
            return error_result(call, timeout_message(call.name, timeout_s), "unknown")
        return ok_result(call, _process_text(done, done.exit_code, cap))


def _process_text(done: ProcessOutcome, exit_code: int, cap: int) -> str:
    """A finished process's result text: whole, a spill summary, or cut when unsaved."""
    if done.spilled_to is not None:
        keep = preview_chars(cap, done.spilled_to)
        return format_process(spill_summary(done.spilled_to, done.head[:keep],
                                            done.tail[-keep:] if keep else "",
                                            done.total_chars), exit_code)
    if done.unsaved is None:
        return format_process(done.head, exit_code)
    room = cap - len(format_process("", exit_code)) - 1  # the exit line and its newline
    return format_process(unsaved_output(done.head, done.tail, done.total_chars, done.unsaved,
                                         room), exit_code)
