"""Broken compaction durability: a rotation that leaves its parent live, a lock taken as a
hint or given back before the write, a turn that goes on writing to the rotated parent, a
route that does not walk to the tip, a lease that stays with the session it was granted
on, a turn that asks for a rotated child without the compression memory of its lineage,
and a line of waiters left with the rotated parent."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import prologue, rotation, router
from hermes_ref.context import TurnContext
from hermes_ref.effects import TakeCompressionLock
from hermes_ref.models import Compacted, SessionRecord
from hermes_ref.session import Route
from hermes_ref.shell import sqlite_leases
from hermes_ref.transcript import Transcript
from sim.sabotage.base import edited_in_place, sabotage
from sim.store_compaction import CompactionStoreMixin

# ---- CMP-5: the child is created, the parent is not ended ------------------------------------


def _parent_left_live() -> list[AbstractContextManager[Any]]:
    def not_yet(parent: SessionRecord, at: float) -> SessionRecord:
        return parent  # "the parent is ended when its turn ends"
    return [mock.patch.object(rotation, "ended_by_rotation", not_yet)]


sabotage("rotation_leaves_the_parent_live", ("CMP-5",),
         "a rotation creates the child but leaves the parent session live")(_parent_left_live)


# ---- CMP-6: a refused lock is taken as a hint --------------------------------------------------


def _lock_as_hint() -> list[AbstractContextManager[Any]]:
    async def hint(ctx: TurnContext, session_id: str, holder: str, now: float) -> bool:
        await TakeCompressionLock(session_id, holder, now, ctx.limits.compression_lock_ttl_s)
        return True  # "the lock only says someone else might be compacting"
    return [mock.patch.object(rotation, "_take_lock", hint)]


sabotage("compression_lock_ignored", ("CMP-6",),
         "a compaction goes ahead when another holder has the session's compression lock")(
    _lock_as_hint)


# ---- CMP-6: the lock is given back before the compaction is written ------------------------


def _unlock_before_the_write() -> list[AbstractContextManager[Any]]:
    original = rotation._stop_refresher

    async def stop_and_unlock(ctx: TurnContext) -> bool:
        lost = await original(ctx)
        # "the child is all set up: nothing else needs the lock"
        await rotation._release_lock(ctx, ctx.session_id, ctx.lease.holder)
        return lost
    return [mock.patch.object(rotation, "_stop_refresher", stop_and_unlock)]


sabotage("lock_released_before_the_write", ("CMP-6",),
         "a rotation gives its compression lock back once the child is set up, before the "
         "compaction is written")(_unlock_before_the_write)


# ---- CMP-5: after a rotation the turn keeps writing to the parent ----------------------------


def _stay_on_parent() -> list[AbstractContextManager[Any]]:
    def half_switch(ctx: TurnContext, done: Compacted) -> None:
        ctx.lease = done.lease  # the session id is left as it was
        ctx.transcript = Transcript(done.rows)
    return [mock.patch.object(rotation, "switch_to", half_switch)]


sabotage("turn_stays_on_the_rotated_parent", ("CMP-5",),
         "after a rotation the rest of the turn writes to the parent, not the child")(
    _stay_on_parent)


# ---- CMP-5: a route to a rotated incarnation is decided on it, not on its tip ----------------


def _no_tip_walk() -> list[AbstractContextManager[Any]]:
    async def same(current: Route, record: SessionRecord) -> tuple[Route, SessionRecord]:
        return current, record
    return [mock.patch.object(router, "_tip_of", same)]


sabotage("route_does_not_walk_the_tip", ("CMP-5",),
         "the router decides on the rotated incarnation itself, so the lane starts over")(
    _no_tip_walk)


# ---- LEASE-1: the lease stays with the session it was granted on ------------------------------


def _lease_per_session() -> list[AbstractContextManager[Any]]:
    def never(end_reason: str | None) -> bool:
        return False  # "a lease is per session"
    return [mock.patch.object(rotation, "lease_follows_tip", never)]


sabotage("lease_stays_on_the_rotated_parent", ("LEASE-1",),
         "a turn waiting on a rotated session gets that session's lease, not its tip's")(
    _lease_per_session)


# ---- CMP-4 across CMP-5: a turn that asks for a rotated child forgets its lineage's memory ----


def _child_without_lineage_memory() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(prologue, "_lineage_memory", "if not (deps.caches or deps.carried):",
                            "if True:  # \"a session this engine has no cache of starts afresh\"")]


sabotage("child_forgets_the_lineage_memory", ("CMP-4",),
         "a turn that asks for a rotated child this engine holds no cache of starts with a "
         "fresh compression memory, unless a turn of it rotated into that very child, so the "
         "cooldown or the two ineffective passes the engine remembers on the child's parent "
         "no longer hold")(_child_without_lineage_memory)


# ---- LEASE-1 per lineage: the waiters' places stay with the rotated parent --------------------


def _line_left_behind() -> list[AbstractContextManager[Any]]:
    def stays(*args: Any) -> None:
        return None  # "the child is a new session: whoever asks there first is first"
    return [mock.patch.object(sqlite_leases, "carry_line", stays),
            mock.patch.object(CompactionStoreMixin, "_carry_line", stays)]


sabotage("rotation_leaves_the_line_behind", ("LEASE-3",),
         "a rotation carries the lease to the child but not its line of waiters, so a turn "
         "that first asks after the rotation is served before one that waited through it")(
    _line_left_behind)


# ---- CMP-4 across CMP-5: a turn that waited for a child's lease keeps its memory from before ----


def _memory_from_before_the_wait() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(
        prologue, "_take_lease",
        "if unserved is not None and taken.lease is not None and taken.cache is cache:",
        "if unserved is not None and taken.lease is not None and taken.cache is cache "
        "and not waited:  # \"what it found as it asked still holds\"")]


sabotage("child_waiter_keeps_the_memory_from_before", ("CMP-4",),
         "a turn that asked for a rotated child and waited for its lease keeps the compression "
         "memory it had as it asked, so the passes the turn it waited behind made there no "
         "longer block it")(_memory_from_before_the_wait)


# ---- CMP-4 across CMP-5: the lineage walk trusts a row read before the turn waited ----------


def _parent_from_before_the_wait() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(
        prologue, "_lineage_memory", "parent = await LoadSession(row.parent_session_id)",
        "parent = rows.get(row.parent_session_id) or await LoadSession(row.parent_session_id)"
        "  # \"every row read already is fresh enough\"")]


sabotage("walk_reads_the_parent_from_before_the_wait", ("CMP-4",),
         "the lineage walk takes a parent's row as the turn read it when it asked, before it "
         "waited for the lease, so a child another process rotated meanwhile looks unended and "
         "the walk stops short of the memory above it")(_parent_from_before_the_wait)
