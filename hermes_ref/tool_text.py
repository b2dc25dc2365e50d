"""What the reference tools do to text: render, patch, search, todo and memory.

Theory of operation
-------------------
Both tool runners (``WorkspaceTools`` on a folder, ``SimTools`` on an in-memory dict) read
the stored text, hand it to a function here and write back what it decides, so the two
agree to the word. Everything here is a pure function of its arguments:

* ``render_lines`` shows a file with line numbers, a window of ``offset``/``limit`` and a
  note of how to continue; ``replace_once`` is ``patch`` (``old_string`` must occur once);
* ``compile_pattern``, ``search_text`` and ``format_matches`` are ``search_files``, line by
  line, capped at ``SEARCH_MATCHES_MAX`` matches; ``in_hidden_dir`` says which files a
  search skips;
* stateful tools (patch, todo, memory) decide a ``Change`` from the stored text: the new
  text to store (or None) and the reply. ``apply_todo`` keeps the list as JSON at
  ``TODO_PATH``; ``apply_memory`` appends notes to ``MEMORY_PATH``.

The bounds and paths these use are the catalog's (``hermes_ref.tool_specs``). Nothing here
performs I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hermes_ref.tool_specs import SEARCH_LINE_CHARS_MAX, SEARCH_MATCHES_MAX, TODO_PATH


# -- changes -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Change:
    """What a stateful tool decided: the new stored text (None: leave it) and the reply."""

    new: str | None
    message: str
    is_error: bool = False


# -- file text -----------------------------------------------------------------------
def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line.removesuffix("\r") for line in lines] if text else []


def render_lines(text: str, path: str, offset: int, limit: int) -> str:
    """Lines ``offset .. offset+limit-1`` (1-based) of ``text`` as ``"     n|line"``."""
    lines = _lines(text)
    if not lines:
        return f"({path} is empty)"
    if offset > len(lines):
        return f"(offset {offset} is past the end: {path} has {len(lines)} lines)"
    shown = lines[offset - 1 : offset - 1 + limit]
    body = "\n".join(f"{offset + i:>6}|{line}" for i, line in enumerate(shown))
    rest = len(lines) - (offset - 1 + len(shown))
    if rest > 0:
        noun = "line" if rest == 1 else "lines"
        body += f"\n[{rest} more {noun}; continue with offset={offset + len(shown)}]"
    return body



def replace_once(text: str, old: str, new: str, path: str) -> Change:
    """``old`` replaced by ``new`` in ``text``; an error unless ``old`` occurs exactly once."""
    count = text.count(old)
    if count == 0:
        return Change(None, f"old_string not found in {path}", is_error=True)
    if count > 1:
        message = (
            f"old_string occurs {count} times in {path}; it must occur exactly once "
            "(include more surrounding context)"
        )
        return Change(None, message, is_error=True)
    return Change(text.replace(old, new, 1), f"patched {path}: replaced 1 occurrence of old_string")



# -- search --------------------------------------------------------------------------
def compile_pattern(pattern: str) -> re.Pattern[str] | str:
    """The compiled regex, or the error message for an invalid one."""
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"invalid regex {pattern!r}: {exc}"


def in_hidden_dir(rel_to_base: str) -> bool:
    """True when a folder on the way from the search base to the file starts with '.'."""
    return any(part.startswith(".") for part in rel_to_base.split("/")[:-1])


def search_text(regex: re.Pattern[str], relpath: str, text: str) -> Iterator[str]:
    """``"relpath:line:text"`` for every line of ``text`` that ``regex`` matches."""
    for number, line in enumerate(_lines(text), start=1):
        if regex.search(line):
            yield f"{relpath}:{number}:{line[:SEARCH_LINE_CHARS_MAX]}"


def format_matches(matches: list[str], pattern: str) -> str:
    """The match list; at most ``SEARCH_MATCHES_MAX`` lines, then a capped note."""
    if not matches:
        return f"no matches for {pattern!r}"
    body = "\n".join(matches[:SEARCH_MATCHES_MAX])
    if len(matches) > SEARCH_MATCHES_MAX:
        body += f"\n[results capped at {SEARCH_MATCHES_MAX} matches]"
    return body


# -- todo and memory -----------------------------------------------------------------
def _is_todo(item: object) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("text"), str)
        and isinstance(item.get("done"), bool)
    )


def decode_todos(raw: str | None) -> list[dict[str, Any]] | None:
    """The stored todo list (no file: empty), or None when the stored text is corrupt."""
    if raw is None:
        return []
    try:
        items = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(items, list) or not all(_is_todo(item) for item in items):
        return None
    return items


def _encode_todos(items: list[dict[str, Any]]) -> str:
    return json.dumps(items, ensure_ascii=False, indent=1) + "\n"


def _listing(items: list[dict[str, Any]]) -> str:
    if not items:
        return "(no todos)"
    marks = {True: "[x]", False: "[ ]"}
    rows = (f"{i}. {marks[item['done']]} {item['text']}" for i, item in enumerate(items, 1))
    return "\n".join(rows)


def apply_todo(raw: str | None, args: dict[str, Any]) -> Change:
    """The todo action applied to the stored list text (``None``: no list yet)."""
    items = decode_todos(raw)
    if items is None:
        return Change(None, f"the todo store {TODO_PATH} is corrupt", is_error=True)
    if args["action"] == "add":
        items = [*items, {"text": args["text"], "done": False}]
        message = f"added todo {len(items)}: {args['text']}\n{_listing(items)}"
        return Change(_encode_todos(items), message)
    if args["action"] == "complete":
        index: int = args["index"]
        if index > len(items):
            message = f"no todo with index {index} (there are {len(items)})"
            return Change(None, message, is_error=True)
        items[index - 1] = {**items[index - 1], "done": True}
        message = f"completed todo {index}: {items[index - 1]['text']}\n{_listing(items)}"
        return Change(_encode_todos(items), message)
    return Change(None, _listing(items))


def apply_memory(raw: str | None, args: dict[str, Any]) -> Change:
    """The memory action applied to the stored notes (``None``: no notes yet)."""
    existing = raw or ""
    if args["action"] == "append":
        text: str = args["text"]
        line = text if text.endswith("\n") else text + "\n"
        return Change(existing + line, f"appended {len(text)} characters to memory")
    return Change(None, existing if existing else "(memory is empty)")
