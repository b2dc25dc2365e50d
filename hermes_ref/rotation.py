"""The durable side of compaction: the lock, the rotation (or in place) and the lineage tip.

Theory of operation
-------------------
``commit_compaction(ctx, compacted)`` makes a compacted message list the session's record,
in this order (every step an effect, so each is a crash point):

1. take the session's compression lock in the name of this turn (``ctx.lease.holder``:
   pid, pid namespace, turn, platform), expiring after ``compression_lock_ttl_s``. Held by
   another live holder: False, and nothing changes (CMP-6);
2. rotation (the default): mint the child's id (an incarnation id from the driver's clock
   and random bits), stop the lease refresher (the rotation carries the lease away from
   the session it keeps), then ``CompactSession`` in one transaction: the turn's pending
   rows flushed to the old session, which is ended ``compression``; the child created with
   ``parent_session_id``; the lease carried to the child whole (same holder, token and
   expiry); the compacted rows written there. In place (``compression_in_place``): the
   live rows are archived and the compacted rows take their place under the same id;
3. start the refresher again on the lease that now fences the turn, keeping the lease's
   cadence (the first refresh is due an interval after its last one: LEASE-2), release
   the lock;
4. switch the turn to the session the messages now live in: its id, lease, cache and
   working list, so the rest of the turn writes there.

LEASE-1 per compression lineage root: a lineage has one lease at a time, held where its
live tip is. The rotation carries it to the child in the same commit that ends the
parent, so there is never a moment with two live grants in one lineage, and the token
never goes back. A turn that asks for a rotated session's lease (a route or a waiter that
still names the parent) is answered with the tip's: the store follows
``parent_session_id`` forward through every session ended ``compression`` (``LoadTip``),
and the prologue runs the turn on the session the lease names.

A write that fails changes nothing (one transaction), so a failed compaction loses no
message: the turn goes on with its uncompacted list. A fenced one (``LeaseLost``) means
the lease is gone, and the turn ends as it does on any fenced write. Nothing is awaited
inside an ``except``: the failure is kept, and what follows runs after it.

The pure rules both stores share (what a compaction may not write) live here too.
"""

from __future__ import annotations

import dataclasses

from hermes_ref import lease as lease_rules
from hermes_ref import session as lanes
from hermes_ref.context import SessionCache, TurnContext
from hermes_ref.effects import (
    CompactSession,
    LoadSession,
    Now,
    RandomBits,
    ReleaseCompressionLock,
    Site,
    StartRefresher,
    StopRefresher,
    TakeCompressionLock,
)
from hermes_ref.errors import LeaseLost, PersistenceError
from hermes_ref.models import Compacted, Lease, Message, Role, SessionRecord
from hermes_ref.transcript import Transcript

COMPRESSION = "compression"  # the end reason of a rotated session (CMP-5)
ROTATED = "rotated"  # how a lease grant ends when a rotation carries it to the child
ID_DRAWS_MAX = 3  # fresh child ids drawn before giving up on a collision (practically never)


async def commit_compaction(ctx: TurnContext, compacted: tuple[Message, ...], *,
                            prompt: str | None = None) -> bool:
    """Make ``compacted`` the session's durable record; True when it is, and the turn now
    runs on the session it lives in (see the module docstring). False: nothing changed.

    ``prompt``: a rebuilt system prompt for a rotation's child (CTX-3); written in the
    child's row and then replayed from it. A compaction in place keeps the stored prompt.
    """
    holder, session_id = ctx.lease.holder, ctx.session_id
    now = await Now()
    if not await _take_lock(ctx, session_id, holder, now):
        return False  # CMP-6: another compressor has it: the messages stay as they are
    rotate = not ctx.limits.compression_in_place
    child = await _child_record(ctx, now, prompt) if rotate else None
    if rotate and child is None:
        await _release_lock(ctx, session_id, holder)
        return False
    lost = rotate and await _stop_refresher(ctx)
    done: Compacted | None = None
    failure: PersistenceError | None = None
    if not lost:
        try:
            done = await CompactSession(ctx.token, session_id, compacted, rotate, child, now,
                                        ctx.transcript.pending())
        except PersistenceError as error:
            failure = error
    if rotate and not lost and not isinstance(failure, LeaseLost):
        ctx.refresher = await _restart_refresher(ctx, done.lease if done is not None else ctx.lease)
    await _release_lock(ctx, session_id, holder)
    if isinstance(failure, LeaseLost):
        ctx.write_failed(Site.ROTATE if rotate else Site.COMPACT, failure)
    if done is None:
        return False
    switch_to(ctx, done)
    if done.session.system_prompt != ctx.cache.system_prompt:
        ctx.cache.replace_system_prompt(done.session)
    return True


async def _take_lock(ctx: TurnContext, session_id: str, holder: str, now: float) -> bool:
    """CMP-6: the session's compression lock for this turn; False while another holds it, or
    when the store cannot say (then nothing is compacted: a skipped compaction loses nothing)."""
    try:
        return await TakeCompressionLock(session_id, holder, now,
                                         ctx.limits.compression_lock_ttl_s)
    except PersistenceError:
        return False


async def _child_record(ctx: TurnContext, now: float,
                        prompt: str | None) -> SessionRecord | None:
    """The child's row: the parent's lane and prompt (or ``prompt``), a fresh incarnation id,
    its parent."""
    parent = await LoadSession(ctx.session_id)
    if parent is None:
        return None
    for _ in range(ID_DRAWS_MAX):
        candidate = lanes.incarnation_id(now, await RandomBits(32, "rotation"))
        if candidate != parent.id and await LoadSession(candidate) is None:
            return SessionRecord(id=candidate, key=parent.key, platform=parent.platform,
                                 chat_type=parent.chat_type, parent_session_id=parent.id,
                                 system_prompt=prompt or parent.system_prompt, started_at=now)
    return None


async def _stop_refresher(ctx: TurnContext) -> bool:
    """Stop the refresher of the lease a rotation is about to carry; True if it had lost it."""
    if ctx.refresher is None:
        return False
    handle, ctx.refresher = ctx.refresher, None
    return await StopRefresher(handle)


async def _restart_refresher(ctx: TurnContext, lease: Lease) -> int:
    """Start the refresher again on ``lease``, keeping the lease's cadence (LEASE-2): its
    first refresh is due one interval after the lease's last grant or refresh, not one
    interval from now (the stopped refresher may have refreshed it just short of an
    interval ago, and a turn that compacts again and again would never refresh it).

    A rotation's ``lease`` bears the expiry the store carried to the child, so its last
    refresh. After a compaction that did not commit, ``lease`` is the turn's own copy (as
    granted, or as its last rotation carried it): if the stopped refresher refreshed it
    since, its due moment has passed, and the new refresher refreshes at once, early
    rather than late."""
    interval_s, ttl_s = ctx.limits.lease_refresh_s, ctx.limits.lease_ttl_s
    first_s = lease_rules.first_refresh_in(lease, await Now(), interval_s, ttl_s)
    return await StartRefresher(lease, interval_s, ttl_s, first_s)


async def _release_lock(ctx: TurnContext, session_id: str, holder: str) -> None:
    """Give the lock back; a release that fails leaves it to expire on its own (its ttl)."""
    now = await Now()
    try:
        await ReleaseCompressionLock(session_id, holder, now)
    except PersistenceError as error:
        ctx.cleanup_errors.append(f"compression lock release: {error.cause}: {error}")


def switch_to(ctx: TurnContext, done: Compacted) -> None:
    """The rest of the turn reads and writes where the messages now live."""
    rows = Transcript(done.rows)
    if done.session.id != ctx.session_id:  # rotated: the child gets the session's cache
        ctx.cache = dataclasses.replace(ctx.cache, session_id=done.session.id,
                                        history=rows.copy(), last_lease_token=0)
    else:
        ctx.cache.history = rows.copy()
    ctx.session_id = done.session.id
    ctx.lease = done.lease
    ctx.transcript = rows


def ended_by_rotation(parent: SessionRecord, at: float) -> SessionRecord:
    """The old session's row as a rotation leaves it: ended ``compression`` at the rotation's
    instant, in the commit that creates the child (an ended row keeps its first reason)."""
    if parent.ended_at is not None:
        return parent
    return parent.model_copy(update={"ended_at": at, "end_reason": COMPRESSION})


def lease_follows_tip(end_reason: str | None) -> bool:
    """Does a session that ended this way hand its turns and its lease to its lineage's tip?
    Only a rotation does (LEASE-1 per lineage root): any other end is the end."""
    return end_reason == COMPRESSION


def tip_cache(cache: SessionCache, tip_id: str, tip: SessionRecord | None) -> SessionCache:
    """The prologue's cache for a lineage's tip, when the lease it got names the tip and not
    the session it asked for (a rotation since): the tip row's stored prompt (CTX-3, the
    row ``tip`` as the prologue read it), the same counters and the same compression memory
    (CMP-4: the lineage's, whichever of its sessions the engine served), no history (it is
    loaded from the tip's record)."""
    prompt = tip.system_prompt if tip is not None else cache.system_prompt
    return dataclasses.replace(cache, session_id=tip_id, history=Transcript(),
                               last_lease_token=0, system_prompt=prompt,
                               system_message=Message(role=Role.SYSTEM, content=prompt))


# ---- what a compaction may not write (both stores ask) -----------------------------------


def lock_refusal(session_id: str, holder: str, ttl_s: float) -> str | None:
    """Why a lock ask is malformed (one line), or None."""
    if not session_id or not holder or not ttl_s > 0:
        return (f"compression lock of {session_id!r} for {holder!r} with ttl {ttl_s:g} s: "
                "a session, a holder and a positive ttl are needed")
    return None


def compaction_refusal(old: SessionRecord, messages: tuple[Message, ...],
                       flush: tuple[Message, ...], child: SessionRecord | None,
                       child_exists: bool) -> tuple[str, str] | None:
    """Why this compaction must not be written (cause, one line), or None."""
    if old.ended_at is not None:
        return "ended", f"session {old.id!r} has ended ({old.end_reason}): nothing to compact"
    if not messages:
        return "bad_input", f"compaction of {old.id!r} would leave no message"
    if any(m.scaffold is not None for m in (*messages, *flush)):
        return "scaffolding", "refusing to persist scaffolding in a compaction"
    if child is None:
        return None
    if child.parent_session_id != old.id:
        return "foreign_key", (f"child {child.id!r} names parent {child.parent_session_id!r}, "
                               f"not the compacted session {old.id!r}")
    if child_exists or child.id == old.id:
        return "duplicate", f"session {child.id!r} already exists"
    if child.ended_at is not None or child.end_reason is not None:
        return "bad_input", f"child {child.id!r} must begin live"
    return None
