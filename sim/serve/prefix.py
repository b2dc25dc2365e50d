"""The served simulator's prompt cache: how many leading messages a request repeats.

Theory of operation
-------------------
A provider reuses the work it did for a prompt prefix it has seen and reports how much of
a new prompt it served that way (``usage.prompt_tokens_details.cached_tokens``). The
served simulator sees only request bodies, as a provider does, so that is all this reads:
``PrefixCache.observe(view)`` returns how many leading messages the request shares, as
JSON values, with an earlier answered request of the same model and tools, and then
remembers the request. ``sim.serve.wire`` counts those messages' tokens with the same rule
as the prompt's own count. It is ``sim.provider.PromptCache`` for the wire's message
dicts, which may hold any shape the API accepts; a trie of the messages' canonical JSON
keeps each request at one dict step per message.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from sim.serve.request import View


class PrefixCache:
    """Leading messages shared with any earlier request of the same model and tools."""

    def __init__(self) -> None:
        self._root: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # the server answers from one thread per connection

    def observe(self, view: View) -> int:
        """The number of leading messages of ``view`` an earlier request had; then keep it."""
        head = json.dumps([view.model, list(view.tools)], sort_keys=True)
        with self._lock:
            node = self._root.setdefault(head, {})
            shared, hit = 0, True
            for message in view.messages:
                key = json.dumps(message, sort_keys=True)
                child = node.get(key)
                if child is None:
                    hit, child = False, node.setdefault(key, {})
                elif hit:
                    shared += 1
                node = child
            return shared
