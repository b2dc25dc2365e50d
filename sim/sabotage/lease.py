"""Broken leases: a turn that runs without one, a refresher that wakes too late (or, started
again, counts its interval from its own start), extends by too little or shrugs off a loss,
a wait for a busy lease cut to one TTL, a reclaim that waits out a dead holder, a release
before the refresher stops or never after an interrupt, a late start that says nothing, and
a tool call that begins late on its batch's vouch."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import finalizer, lease, prologue, rotation, tool_batch
from hermes_ref.context import TurnContext
from hermes_ref.effects import (
    ClearInterrupt,
    FlushEvents,
    Now,
    RefreshLease,
    ReleaseLease,
    Sleep,
    StopRefresher,
)
from hermes_ref.errors import PersistenceError
from hermes_ref.models import Closing, Lease, Role
from hermes_ref.outcomes import ExitReason
from sim.sabotage.base import edited_in_place, sabotage

# ---- LEASE-1: the wait times out and the turn runs anyway ("fail open") ---------------------


def _fail_open() -> list[AbstractContextManager[Any]]:
    original = prologue._take_lease

    async def fail_open(inp: Any, deps: Any, cache: Any, holder: str, now: float,
                        opening: Any = None) -> Any:
        taken = await original(inp, deps, cache, holder, now, opening)
        if taken.lease is None:  # "better to answer unserialized than not at all"
            taken.lease = Lease(session_id=inp.session_id, holder=holder, token=0,
                                acquired_at=now, expires_at=now + deps.limits.lease_ttl_s)
        return taken
    return [mock.patch.object(prologue, "_take_lease", fail_open)]


sabotage("fail_open_on_lease_timeout", ("LEASE-1",),
         "a turn whose lease wait times out runs anyway with a made-up grant")(_fail_open)


# ---- LEASE-2: the refresher sleeps a whole TTL between refreshes ----------------------------


def _refresh_every_ttl() -> list[AbstractContextManager[Any]]:
    original = lease.keep_lease

    async def late(grant: Lease, interval_s: float, ttl_s: float,
                   first_s: float | None = None) -> None:
        await original(grant, ttl_s, ttl_s)  # the TTL passed where the interval belongs
    return [mock.patch.object(lease, "keep_lease", late)]


sabotage("refresh_interval_is_the_ttl", ("LEASE-2",),
         "the refresher waits lease_ttl_s between refreshes instead of lease_refresh_s")(
    _refresh_every_ttl)


def _refresh_by_interval() -> list[AbstractContextManager[Any]]:
    original = lease.keep_lease

    async def short(grant: Lease, interval_s: float, ttl_s: float,
                    first_s: float | None = None) -> None:
        await original(grant, interval_s, interval_s, first_s)  # the interval where the TTL belongs
    return [mock.patch.object(lease, "keep_lease", short)]


sabotage("refresh_extends_by_the_interval", ("LEASE-2",),
         "each refresh extends the lease by lease_refresh_s instead of lease_ttl_s, so a "
         "late refresh finds it expired")(_refresh_by_interval)


def _restart_from_scratch() -> list[AbstractContextManager[Any]]:
    return [edited_in_place(rotation, "_restart_refresher",
                            "StartRefresher(lease, interval_s, ttl_s, first_s)",
                            "StartRefresher(lease, interval_s, ttl_s)")]


sabotage("restarted_refresher_waits_a_whole_interval", ("LEASE-2",),
         "the refresher a compaction starts again waits a whole interval from its own start, "
         "though the one it replaced may have refreshed the lease just short of an interval "
         "before")(_restart_from_scratch)


def _wait_one_ttl() -> list[AbstractContextManager[Any]]:
    original = prologue._take_lease

    async def impatient(inp: Any, deps: Any, cache: Any, holder: str, now: float,
                        opening: Any = None) -> Any:
        limits = deps.limits.model_copy(update={"lease_wait_s_max": deps.limits.lease_ttl_s})
        return await original(inp, dataclasses.replace(deps, limits=limits), cache, holder,
                              now, opening)
    return [mock.patch.object(prologue, "_take_lease", impatient)]


sabotage("lease_wait_is_one_ttl", ("LEASE-2",),
         "a turn waits for a busy lease only lease_ttl_s, not lease_wait_s_max, before it "
         "gives up")(_wait_one_ttl)


# ---- LEASE-3: a dead holder's lease is only reclaimed once it expires -----------------------


def _wait_out_the_dead() -> list[AbstractContextManager[Any]]:
    def only_expired(expires_at: float, now: float, holder_dead: Any) -> bool:
        return expires_at <= now
    return [mock.patch.object(lease, "reclaimable", only_expired)]


sabotage("dead_holders_block_the_lease", ("LEASE-3",),
         "the reclaim rule ignores the holder's death and waits for the TTL")(_wait_out_the_dead)


# ---- LEASE-4: a failed refresh is logged and the turn goes on --------------------------------


def _shrug_off_loss() -> list[AbstractContextManager[Any]]:
    async def shrug(grant: Lease, interval_s: float, ttl_s: float,
                    first_s: float | None = None) -> None:
        while True:
            await Sleep(interval_s)
            try:
                grant = await RefreshLease(grant, await Now(), ttl_s)
            except PersistenceError:
                continue  # "the next refresh will probably work"
    return [mock.patch.object(lease, "keep_lease", shrug)]


sabotage("lost_lease_ignored", ("LEASE-4",),
         "a refresh that fails is retried later instead of interrupting the turn")(_shrug_off_loss)


# ---- LEASE-6: the lease is released before the refresher is stopped -------------------------


async def _release_now(ctx: TurnContext, closing: Closing | None) -> bool:
    """The release (with the closing's rows and ending, when given), guarded as the engine's."""
    if closing is not None:
        return await finalizer._close_turn(ctx, closing)
    try:
        await ReleaseLease(ctx.lease)
    except PersistenceError as error:
        ctx.cleanup_errors.append(f"release: {error.cause}: {error}")
    return True


def _release_first() -> list[AbstractContextManager[Any]]:
    async def release_first(ctx: TurnContext, closing: Closing | None = None) -> bool:
        done = await _release_now(ctx, closing)
        if ctx.refresher is not None:
            await StopRefresher(ctx.refresher)
            await ClearInterrupt()
            ctx.refresher = None
        return done
    return [mock.patch.object(finalizer, "_release", release_first)]


sabotage("release_before_stopping_refresher", ("LEASE-6",),
         "the finalizer releases the lease first and stops its refresher afterwards")(
    _release_first)


# ---- CTX-9: a late start says nothing ---------------------------------------------------------


def _no_warning() -> list[AbstractContextManager[Any]]:
    async def silent(ctx: TurnContext) -> None:
        return None
    return [mock.patch.object(prologue, "_warn_if_late", silent)]


sabotage("late_start_unwarned", ("CTX-9",),
         "a turn that starts before its predecessor's final persist logs no warning")(_no_warning)


# ---- LEASE-1: whoever asks when the lease is free gets it ----------------------------------


def _no_queue() -> list[AbstractContextManager[Any]]:
    def anyone(mine: int | None, others: Any) -> bool:
        return True
    return [mock.patch.object(lease, "first_in_line", anyone)]


sabotage("waiters_not_served_in_order", ("LEASE-1",),
         "a free lease goes to whoever asks next, ahead of turns already waiting")(_no_queue)


# ---- LEASE-3: a busy lease is taken from its live holder ------------------------------------


def _take_any() -> list[AbstractContextManager[Any]]:
    def always(expires_at: float, now: float, holder_dead: Any) -> bool:
        return True  # "the holder will notice at its next write"
    return [mock.patch.object(lease, "reclaimable", always)]


sabotage("live_lease_taken", ("LEASE-3",),
         "a held, unexpired lease of a live holder is handed to whoever asks")(_take_any)


# ---- LOOP-3 / FIN-8: the silent-stop guard overrules an interrupt ---------------------------


def _guard_overrules_interrupt() -> list[AbstractContextManager[Any]]:
    def guard(ctx: TurnContext) -> None:
        tail = ctx.transcript.tail()
        if ctx.ending.answer is None and not ctx.ending.failed \
                and tail is not None and tail.role is Role.TOOL:  # forgets "not interrupted"
            ctx.ending.replace(ExitReason.PENDING_TOOL_RESULT,
                               finalizer.PENDING_TOOL_RESULT_TEXT, failed=True)
    return [mock.patch.object(finalizer, "_silent_stop_guard", guard)]


sabotage("interrupt_reported_as_pending_tool_result", ("LOOP-3",),
         "the silent-stop guard replaces an interrupted turn's reason with pending_tool_result")(
    _guard_overrules_interrupt)


# ---- LEASE-4: the fence lets a stale token write -------------------------------------------


def _no_fence() -> list[AbstractContextManager[Any]]:
    def any_token(token: int, current_token: int | None, held: bool, expires_at: float | None,
                  now: float | None) -> bool:
        return True  # "the token is only advisory"
    return [mock.patch.object(lease, "fence_holds", any_token)]


sabotage("fence_ignores_the_token", ("LEASE-4",),
         "the stores' fence lets a write through whatever lease token it carries")(_no_fence)


# ---- LEASE-6: the refresher is left running when the turn ends ------------------------------


def _refresher_left_running() -> list[AbstractContextManager[Any]]:
    async def release_only(ctx: TurnContext, closing: Closing | None = None) -> bool:
        return await _release_now(ctx, closing)  # "the refresher will notice the release by itself"
    return [mock.patch.object(finalizer, "_release", release_only)]


sabotage("refresher_never_stopped", ("LEASE-6",),
         "the finalizer releases the lease and never stops or joins its refresher")(
    _refresher_left_running)


# ---- LEASE-6: an interrupted turn leaves its lease to expire -------------------------------


def _interrupted_keeps_lease() -> list[AbstractContextManager[Any]]:
    original = finalizer._release

    async def release(ctx: TurnContext, closing: Closing | None = None) -> bool:
        if closing is None and ctx.ending.reason is ExitReason.INTERRUPTED:
            if ctx.refresher is not None:
                await StopRefresher(ctx.refresher)
                await ClearInterrupt()
                ctx.refresher = None
            try:  # "an interrupt means the lease is gone anyway": only the ending is written
                await FlushEvents()
            except PersistenceError as error:
                ctx.cleanup_errors.append(f"events: {error.cause}: {error}")
            return True
        return await original(ctx, closing)
    return [mock.patch.object(finalizer, "_release", release)]


sabotage("interrupted_turn_keeps_its_lease", ("LEASE-6",),
         "an interrupted turn stops its refresher and writes its ending but never releases "
         "its lease, so a user's stop blocks the session until the TTL runs out")(
    _interrupted_keeps_lease)


# ---- LEASE-4: a model call that goes out on a lease the store no longer vouches for ----------


def _call_without_token() -> list[AbstractContextManager[Any]]:
    from hermes_ref import effects, loop

    def call(request: Any, session_id: str = "", turn_id: str = "",
             lease_token: int = 0) -> effects.CallProvider:
        return effects.CallProvider(request, session_id, turn_id)  # the token left behind
    return [mock.patch.object(loop, "CallProvider", call)]


sabotage("model_call_without_its_token", ("LEASE-4",),
         "the model call is built without the turn's fencing token, so nothing asks the "
         "store whether the lease still holds before the request goes out")(_call_without_token)


# ---- LEASE-4: a tool call that begins late goes out on its batch's vouch -------------------


def _batch_vouch_only() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(tool_batch, "vouch_again", lambda begins_s: False)]


sabotage("late_tool_call_on_the_batch_vouch", ("LEASE-4",),
         "a tool call that begins after its batch did (it waited for a worker, the start gate "
         "or its own start) is not vouched for again: the store's answer as the batch began "
         "stands for the whole batch, so a process frozen past its lease wakes and runs it")(
    _batch_vouch_only)
