"""A broken planner that compares path strings, not where the tools act (TOOL-4)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import tool_round
from hermes_ref.models import ToolCall, ToolSpec
from hermes_ref.tool_specs import scoped_path
from sim.sabotage.base import sabotage


def _compare_strings() -> list[AbstractContextManager[Any]]:
    def path_as_written(call: ToolCall, spec: ToolSpec, resolved: Any) -> str | None:
        path = scoped_path(call, spec)  # the tool world's answer is ignored
        if path is None or not path.strip():
            return None
        return "." if path in (".", "..") or path.startswith("../") else path
    return [mock.patch.object(tool_round, "_path_of", path_as_written)]


sabotage("planner_compares_unresolved_paths", ("TOOL-4",),
         "the segment planner compares the path strings the model wrote, not where the tools "
         "resolve them, so a write through an absolute path or a symlink runs alongside a read "
         "of the same file")(_compare_strings)
