"""Tool-call ids out of a stored ``tool_calls`` column, in either schema's JSON.

Theory of operation
-------------------
Both schemas store an assistant row's calls as a JSON list of objects: this project's as
``{"id", "name", "arguments"}``, Hermes Agent's as the wire object with two more keys
(``{"id", "call_id", "response_item_id", "type", "function"}``). ``call_ids`` returns the
ids in order (``id``, else ``call_id``); ``None`` when the column is not such a list,
which the pairing judge reports, because a call it cannot read is a call it cannot pair.
"""

from __future__ import annotations

import json


def call_ids(text: str | bytes) -> tuple[str, ...] | None:
    try:
        calls: object = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(calls, list):
        return None
    ids: list[str] = []
    for call in calls:
        if not isinstance(call, dict):
            return None
        found = call.get("id") or call.get("call_id")
        if not isinstance(found, str):
            return None
        ids.append(found)
    return tuple(ids)
