"""How compaction reshapes the record, read from the record itself (CMP-5).

Theory of operation
-------------------
A rotation moves a conversation to a child session mid-turn: the turn's first rows and
events are filed under the parent, the rest under the child, and the child opens with a
copy of the rows the compaction kept. A compaction in place copies the kept rows under
the same id and archives the old ones. Checkers that judge *turns* must see one turn, and
must not take a compaction's copies for rows a turn wrote again. Two readings do that,
from the durable record alone:

* ``roots``: each session's lineage root (``parent_session_id`` followed back while the
  parent ended ``compression``); a turn is keyed by the root of the session it ran on;
* ``copied_row_ids``: the rows each committed compaction inserted (its ``first_row_id``
  and the ``rows_after - 1`` after it), which are copies, not writes of their turns;
* ``written``: every row a turn wrote, live or since archived, in row order;
* ``rows_at``: a session's rows as they stood at a watermark (a row archived later was
  still live then; one archived by then was not);
* ``healed``: a route revision's predecessor as the lane saw it, when the route moved from
  a rotated incarnation to its lineage's tip (the same conversation, not a new one).

Without any compaction both are trivial (every session its own root, nothing copied), so
nothing changes for a record that never compacted.
"""

from __future__ import annotations

from hermes_ref.models import Message
from hermes_ref.ports import DurableRecord, StoredMessage
from hermes_ref.rotation import COMPRESSION
from hermes_ref.session import Route


def roots(record: DurableRecord) -> dict[str, str]:
    """Session id -> its lineage root; only sessions whose root is another are listed."""
    by_id = {s.id: s for s in record.sessions}
    found: dict[str, str] = {}
    for record_ in record.sessions:
        current, seen = record_, {record_.id}
        while current.parent_session_id is not None:
            parent = by_id.get(current.parent_session_id)
            if parent is None or parent.end_reason != COMPRESSION or parent.id in seen:
                break
            current = parent
            seen.add(parent.id)
        if current.id != record_.id:
            found[record_.id] = current.id
    return found


def copied_row_ids(record: DurableRecord) -> frozenset[int]:
    """The row ids every committed compaction inserted as its compacted set."""
    return frozenset(row for done in record.compactions
                     for row in range(done.first_row_id, done.first_row_id + done.rows_after))


def written(record: DurableRecord) -> list[StoredMessage]:
    """Every row written, live or archived by a compaction in place, in row order."""
    if not record.archived:
        return list(record.messages)
    return sorted((*record.messages, *record.archived), key=lambda m: m.message.row_id or 0)


def rows_at(record: DurableRecord, session_id: str, watermark: int) -> list[Message]:
    """``session_id``'s live rows when the store's high-water mark was ``watermark``."""
    cuts = [c.first_row_id for c in record.compactions
            if c.child_id is None and c.session_id == session_id and c.first_row_id <= watermark]
    floor = max(cuts, default=0)  # the last compaction in place by then archived what was before
    return [m.message for m in written(record) if m.session_id == session_id
            and floor <= (m.message.row_id or 0) <= watermark]


def healed(record: DurableRecord, before: Route | None, route: Route) -> Route | None:
    """``before`` naming ``route``'s session when the route healed from a rotated session to
    its lineage's tip; ``before`` itself otherwise."""
    if before is None or before.session_id == route.session_id or not record.compactions:
        return before
    root = roots(record)
    if root.get(before.session_id, before.session_id) != root.get(route.session_id,
                                                                  route.session_id):
        return before
    return before.model_copy(update={"session_id": route.session_id})
