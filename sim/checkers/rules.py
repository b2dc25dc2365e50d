"""Small rules of the spec, restated for the checkers instead of borrowed from the engine.

Theory of operation
-------------------
A checker judges whether the engine obeyed a rule. If it asked the engine's own function
what the rule says, a broken function would break the engine and the checker in the same
way, and the two would agree: the checker would be blind to exactly the bug it exists for.
So every rule a checker decides by is written out here a second time, from the spec and
the docs, in its own words and code. What may be shared with the engine is data: prompt
texts, marks, tool tables, enums and value types. Functions that decide may not (a test,
``tests/unit/test_checker_independence.py``, keeps it so).

The token estimate has a module of its own (``measure``), and the text rule of reply
intake lives with its checker (``intake.taken_in_text``). Here are the rest:

* ``named_path`` and ``scoped_path``: the path a file tool's call names, and that path
  collapsed as a string (TOOL-4, TOOL-9);
* ``says_timed_out``: whether a tool result is the batch deadline's own (TOOL-5, TOOL-7);
* ``spill_named``: the spill file a spilled result's summary names (TOOL-7);
* ``normalized_payload``: the payload the admission digest is computed over (ADM-3, ADM-6);
* ``holder_fields``: the parts of a lease or lock holder's identity (LEASE-2).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from hermes_ref.models import ToolCall, ToolKind
from hermes_ref.tool_batch import TIMED_OUT_MARK
from hermes_ref.tool_specs import TOOLS_BY_NAME


def named_path(call: ToolCall) -> str | None:
    """The path a file reader's or writer's call names, as the model wrote it (TOOL-4).

    Only READER and WRITER tools of the catalog name paths. Their arguments must be a JSON
    object (empty arguments are an empty object); a reader that names no path reads the
    workspace (``"."``); a ``path`` that is not a string names nothing.
    """
    spec = TOOLS_BY_NAME.get(call.name)
    if spec is None or spec.kind not in (ToolKind.READER, ToolKind.WRITER):
        return None
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except (ValueError, RecursionError):
        return None
    if not isinstance(args, dict):
        return None
    path = args.get("path")
    if path is None and spec.kind is ToolKind.READER:
        return "."
    return path if isinstance(path, str) else None


def scoped_path(call: ToolCall) -> str | None:
    """The named path with ``.`` and ``..`` collapsed as a string: the one key under which
    TOOL-9 files a write, so ``./a.txt``, ``a.txt`` and ``d/../a.txt`` are one file.
    Lexical only: no workspace root and no symlinks (those are where the tool lands)."""
    path = named_path(call)
    return None if path is None else posixpath.normpath(path)


def says_timed_out(content: str | None, deadline_s: float) -> bool:
    """Is this tool result the batch deadline's own (TOOL-5)? Both of its wordings carry
    the mark and the deadline in seconds, written shortest (``420s``, ``0.5s``)."""
    return content is not None and f"{TIMED_OUT_MARK} {deadline_s:g}s" in content


SPILL_MARK = "the whole output is in "  # the summary's wording before the spill file's path


def spill_named(content: str | None) -> str | None:
    """The spill file a result's summary names (TOOL-7: the model gets a summary and the
    path), or None when ``content`` names none. The summary says the whole output is in
    the file, and the path, which holds no whitespace, is followed by `` (`` and how to
    read it; the first such mention counts."""
    text = content or ""
    at = text.find(SPILL_MARK)
    while at >= 0:
        begin = end = at + len(SPILL_MARK)
        while end < len(text) and not text[end].isspace():
            end += 1
        if end > begin and text.startswith(" (", end):
            return text[begin:end]
        at = text.find(SPILL_MARK, at + 1)
    return None


def normalized_payload(payload: object, bytes_max: int) -> dict[str, Any] | None:
    """The payload the admission digest is computed over (ADM-3), or None when the door
    must refuse it as ``invalid_params`` (docs/admission.md, step 3).

    The payload is a JSON object, or the JSON text of one. Its canonical JSON (sorted
    keys, no spaces, no NaN) must be valid Unicode of at most ``bytes_max`` UTF-8 bytes,
    and it needs a ``text`` that is a string with something besides whitespace. Every
    field is kept; only the line ends of ``text`` change, each CR LF or lone CR to LF.
    """
    if isinstance(payload, str | bytes):
        try:
            payload = json.loads(payload)
        except ValueError:
            return None
    if not isinstance(payload, Mapping):
        return None
    try:
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False, allow_nan=False)
        if len(canonical.encode("utf-8")) > bytes_max:
            return None
    except (TypeError, ValueError):  # not JSON, or a lone surrogate no store could keep
        return None
    plain: dict[str, Any] = json.loads(canonical)
    text = plain.get("text")
    if not isinstance(text, str) or not text.strip():
        return None
    plain["text"] = "\n".join(text.replace("\r\n", "\n").split("\r"))
    return plain


def holder_fields(holder: str) -> dict[str, str]:
    """The named parts of a holder identity (LEASE-2: it names pid, pid namespace, turn id
    and platform): ``:``-separated parts written ``key=value``; a part without ``=`` (a
    bare process tag) names nothing."""
    fields: dict[str, str] = {}
    for part in holder.split(":"):
        if "=" in part:
            key, value = part.split("=", 1)
            fields[key] = value
    return fields
