"""Spilling an oversized tool result to a file (TOOL-7): the words and the names.

Theory of operation
-------------------
A result whose text is longer than the runner's cap (``Limits.tool_result_spill_chars``,
50,000 characters by default) is not sent to the model whole and is not cut either: the
runner writes the whole text to a spill file and the model gets ``spill_summary``: the
total size, the file's workspace-relative path (readable with ``read_file`` and its
``offset``/``limit``), and a bounded head and tail of the text. The summary never
exceeds the cap, so no tool message is longer than it.

A runner that streams (the workspace ``terminal``) keeps only the head and a bounded
tail in memory and writes the rest straight to the file; it builds the same summary
from those pieces. Names are ``.hermes/spill/<n>-<call id>.txt`` (``spill_name``): the
sequence number keeps a call id that repeats across turns from overwriting an earlier
spill. Nothing here performs I/O.
"""

from __future__ import annotations

import re

SPILL_DIR = ".hermes/spill"
PREVIEW_CHARS_MAX = 2_000  # of the head, and of the tail, shown in a summary
SPILL_PATH_RE = re.compile(r"the whole output is in (\S+) \(")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def spill_name(seq: int, call_id: str) -> str:
    """The workspace-relative path of the ``seq``-th spill, for call ``call_id``."""
    safe = _UNSAFE.sub("_", call_id)[:64].strip(".") or "call"
    return f"{SPILL_DIR}/{seq:04d}-{safe}.txt"


def _header(total_chars: int, path: str) -> str:
    return (f"[output too large to show: {total_chars} characters; the whole output is in "
            f"{path} (read it with read_file and offset/limit)]")


def preview_chars(cap_chars: int, path: str) -> int:
    """How many characters of head (and of tail) a summary under ``cap_chars`` may show."""
    room = cap_chars - len(_header(10 ** 12, path)) - 80  # the section lines, generously
    return max(0, min(PREVIEW_CHARS_MAX, room // 2))


def spill_summary(path: str, head: str, tail: str, total_chars: int) -> str:
    """What the model gets instead of a spilled result: size, path, head and tail."""
    lines = [_header(total_chars, path)]
    if head:
        lines += [f"--- the first {len(head)} characters ---", head]
    if tail:
        lines += [f"--- the last {len(tail)} characters ---", tail]
    return "\n".join(lines)


def summarize(path: str, text: str, cap_chars: int) -> str:
    """``spill_summary`` of a whole text already in memory."""
    keep = preview_chars(cap_chars, path)
    return spill_summary(path, text[:keep], text[-keep:] if keep else "", len(text))


def spilled_path(content: str | None) -> str | None:
    """The spill file a summary names, or None when ``content`` is not a summary."""
    found = SPILL_PATH_RE.search(content or "")
    return found.group(1) if found else None
