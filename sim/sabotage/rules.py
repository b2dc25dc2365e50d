"""Broken rules that a checker borrowing the engine's function would share.

Each sabotage here edits one line inside one of the engine's small deciding functions
(the token estimate, the text rule of reply intake, the lexical path scope, the admission
payload's normalization) in place (``edited_in_place``): every holder of the function runs
the broken line, as it would after a real edit. A checker that called the same function to
judge the engine would agree with it and stay green; the checkers restate these rules
(``sim.checkers.measure``, ``sim.checkers.rules``), so each of these must turn one red.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from hermes_ref import admission, reply_intake, tokens, tool_specs
from sim.sabotage.base import edited_in_place, sabotage

# ---- CMP: the token estimate -----------------------------------------------------------------


def _calls_cost_nothing() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(tokens, "count_message", "total += TOOL_CALL_OVERHEAD_TOKENS + ",
                            "total += ")]


sabotage("tool_call_overhead_uncounted", ("CMP-1", "CMP-4", "CMP-7"),
         "the token estimate drops the fixed overhead of each tool call, so a conversation of "
         "tool rounds looks smaller than it is and is compressed too late")(_calls_cost_nothing)


# ---- DEL-2, FIN-6: the text rule of reply intake --------------------------------------------------


def _lone_halves_dropped() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(reply_intake, "clean_text", '.decode("utf-16-le", "replace")',
                            '.decode("utf-16-le", "ignore")')]


sabotage("lone_surrogates_dropped", ("DEL-2", "FIN-6"),
         "reply intake drops a surrogate it cannot pair instead of showing U+FFFD, so the "
         "answer recorded is not the text the client was shown")(_lone_halves_dropped)


# ---- TOOL-9: the lexical scope of a path ------------------------------------------------------


def _case_for_path() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(tool_specs, "scoped_path", "posixpath.normpath(path)",
                            "posixpath.normcase(path)")]


sabotage("path_scope_left_as_written", ("TOOL-9",),
         "the path scope calls normcase where it meant normpath, which on POSIX changes "
         "nothing, so ./a.txt and a.txt are two files and a failed write redone under the "
         "other spelling stays reported")(_case_for_path)


# ---- ADM-3: the payload the admission digest is computed over -------------------------------


def _text_field_only() -> list[AbstractContextManager[Any]]:
    fold = r'message.replace("\r\n", "\n").replace("\r", "\n")'
    return [edited_in_place(admission, "normalize_payload", f'plain["text"] = {fold}',
                            f'plain = {{"text": {fold}}}')]


sabotage("payload_normalized_to_its_text", ("ADM-3",),
         "normalization keeps only the payload's text, the one field a turn reads, so the "
         "stored payload loses its other fields and a resubmission that changed one of them "
         "is taken for the same request")(_text_field_only)
