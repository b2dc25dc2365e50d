"""The turn's working list of messages, with a running token count.

Theory of operation
-------------------
The working list is what the next request is built from: durable rows (with row ids),
the not-yet-persisted final answer and, briefly, scaffolding. It keeps a running token
total so that building a request costs O(new messages), not O(history): history values
are frozen, so their token counts never change once added (WIRE-1 makes their wire bytes
immutable too). The total is of what a request carries (``Message.sent_tokens``): a
hidden row (the mark a correction leaves where it cut a reply that showed nothing,
LOOP-4) stays in the list but never goes on the wire, so it counts for nothing; counted,
it made preflight refuse a request that fits (CMP-7, LOOP-6).

``durable_tail`` is the last message that has a row id: the tail of the durable
transcript, which is what tail closure (FIN-3) inspects.
"""

from __future__ import annotations

from collections.abc import Iterable

from hermes_ref.models import Message, Role


class Transcript:
    """Working list; ``_stable`` counts the leading messages known durable and final.

    Everything before ``_stable`` came from the store and can no longer be pending or
    scaffolding, so the scans a turn makes (pending rows, scaffolding, replacement) start
    there: their cost follows the size of the turn, not the size of the history.
    """

    __slots__ = ("_messages", "_stable", "_tokens")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._messages: list[Message] = []
        self._tokens = 0
        self.extend(messages)
        self._stable = len(self._messages) if all(
            m.row_id is not None and m.scaffold is None for m in self._messages) else 0

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self):  # type: ignore[no-untyped-def]  # plain list iterator
        return iter(self._messages)

    @property
    def tokens(self) -> int:
        return self._tokens

    def messages(self) -> tuple[Message, ...]:
        return tuple(self._messages)

    def sendable(self) -> tuple[Message, ...]:
        """What a request carries of the list: every message but the hidden rows, which are
        never replayed (LOOP-4). Every request is built from this, the loop's and the one
        rebuilt after an overflow alike, and ``tokens`` already counts it so."""
        return tuple(m for m in self._messages if not m.hidden)

    def copy(self) -> Transcript:
        """A copy sharing the (immutable) messages: O(n) pointer copy, no re-counting."""
        twin = Transcript()
        twin._messages = list(self._messages)
        twin._tokens = self._tokens
        twin._stable = self._stable
        return twin

    def settle(self) -> None:
        """Declare the whole list durable and final (called once everything is stored)."""
        self._stable = len(self._messages)

    def append(self, message: Message) -> None:
        self._messages.append(message)
        self._tokens += message.sent_tokens

    def extend(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.append(message)

    def tail(self) -> Message | None:
        return self._messages[-1] if self._messages else None

    def durable_tail(self) -> Message | None:
        for message in reversed(self._messages):
            if message.row_id is not None:
                return message
        return None

    def replace_last(self, message: Message) -> None:
        old = self._messages[-1]
        self._messages[-1] = message
        self._tokens += message.sent_tokens - old.sent_tokens

    def drop_scaffolding(self) -> int:
        """Remove every scaffolding message; returns how many were removed."""
        head = self._stable
        tail = self._messages[head:]
        kept = [m for m in tail if m.scaffold is None]
        removed = len(tail) - len(kept)
        if removed:
            self._tokens -= sum(m.sent_tokens for m in tail if m.scaffold is not None)
            del self._messages[head:]
            self._messages.extend(kept)
        return removed

    def absorb(self, stored: tuple[Message, ...]) -> None:
        """Take in freshly stored rows: each replaces its pending twin (the same values
        without a row id), and a row that has no pending twin is appended.

        A writer that appended its rows before storing them finds them at the end, and
        they are replaced there; so an older pending row whose own write failed (with the
        same text, say) is never taken for a newer one's twin. Otherwise twins are matched
        in order from the start of the turn.
        """
        count = len(stored)
        tail = self._messages[len(self._messages) - count:] if count else []
        if count and len(self._messages) - self._stable >= count and all(
                _twins(row, mine) for row, mine in zip(stored, tail, strict=True)):
            self._messages[len(self._messages) - count:] = list(stored)
            return
        start = self._stable
        for row in stored:
            index = next((k for k in range(start, len(self._messages))
                          if _twins(row, self._messages[k])), None)
            if index is None:
                self.append(row)
                continue
            self._messages[index] = row
            start = index + 1

    def current_turn(self) -> list[Message]:
        """The messages after the durable, final prefix: this turn's own (O(turn))."""
        return self._messages[self._stable:]

    def pending(self) -> tuple[Message, ...]:
        """Messages that are neither stored nor scaffolding: what the next flush writes."""
        return tuple(m for m in self._messages[self._stable:]
                     if m.row_id is None and m.scaffold is None)

    def trailing_open_calls(self) -> tuple[Message | None, list[str]]:
        """The last assistant tool-call row and its call ids that have no result yet.

        Only the trailing group is inspected (the assistant row and the tool rows after
        it): every earlier group was closed when the turn or recovery that wrote it ended,
        so this stays O(tail) however long the history is.
        """
        answered: set[str] = set()
        for index in range(len(self._messages) - 1, -1, -1):
            message = self._messages[index]
            if message.role is Role.TOOL:
                answered.add(message.tool_call_id or "")
                continue
            if message.role is Role.ASSISTANT and message.tool_calls:
                missing = [c.id for c in message.tool_calls if c.id not in answered]
                return (message, missing) if missing else (None, [])
            break
        return None, []


def _twins(row: Message, message: Message) -> bool:
    """``message`` is ``row`` not yet stored: pending, not scaffolding, the same values."""
    return message.row_id is None and message.scaffold is None and (
        row.role, row.content, row.tool_calls, row.tool_call_id) == (
        message.role, message.content, message.tool_calls, message.tool_call_id)
