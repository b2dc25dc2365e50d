"""The simulator's side of the turn lease: grants, refreshes, the refresher actor, interrupts.

Theory of operation
-------------------
``LeaseHandlers`` is the part of ``SimDriver`` that performs the lease effects. Taking,
refreshing and releasing a lease are store writes of the process (they carry its pending
events, like every write). ``StartRefresher`` makes ``hermes_ref.lease.keep_lease`` an
actor of the same process, a child of the turn actor that started it; ``StopRefresher``
closes that actor wherever it waits (in the simulator every effect is atomic, so closing
it is also joining it). ``InterruptTurn``, the refresher's move on a loss, marks the turn
actor interrupted and, if the turn is waiting in a model call, a tool batch or a sleep,
cuts the wait short with ``TurnInterrupted``.

Every step is also written to the world's lease log (``World.lease_log``), the world's own
account of what each holder did and when, which the lease checkers read beside the
store's durable grants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hermes_ref import effects as fx
from hermes_ref import lease as lease_rules
from hermes_ref.effects import Site
from hermes_ref.errors import LeaseLost, PersistenceError, TurnInterrupted
from hermes_ref.models import Closed, Closing, Event, EventKind, Lease, LeaseGrant
from sim.world import LeaseStep

if TYPE_CHECKING:
    from sim.scheduler import Actor
    from sim.world import World


_TIMED: frozenset[type[Any]] = frozenset({fx.CallProvider, fx.ExecuteTools, fx.Sleep})


class LeaseHandlers:
    """Mixed into ``SimDriver``; relies on its ``world``, ``current`` and ``_write``."""

    world: World
    current: Actor | None
    _refreshers: dict[int, Actor]   # handle -> the refresher actor
    _kept: dict[int, Lease]          # handle -> the lease as last granted or refreshed
    _lost: set[int]                  # handles whose refresher reported a loss

    # SimDriver's own steps, which these handlers use (declared here, defined there)
    _write: Callable[..., Any]
    _fail_if_planned: Callable[[Site], None]
    _show: Callable[[Event], None]
    _narrate_exit: Callable[[Event], None]
    spawn: Callable[..., Actor]
    stop_actor: Callable[[Actor], None]

    def lease_handlers(self) -> dict[type[Any], Callable[[Any], Any]]:
        return {
            fx.OpenTurn: self._open_turn,
            fx.AcquireLease: self._acquire_lease,
            fx.ReleaseLease: self._release_lease,
            fx.CloseTurn: self._close_turn,
            fx.RefreshLease: self._refresh_lease,
            fx.LeaveLeaseQueue: self._leave_queue,
            fx.StartRefresher: self._start_refresher,
            fx.StopRefresher: self._stop_refresher,
            fx.InterruptTurn: self._interrupt_turn,
            fx.ClearInterrupt: self._clear_interrupt,
        }

    def log_lease(self, what: str, lease: Lease) -> None:
        self._log_step(what, lease.session_id, lease.holder, lease.token)

    def _log_step(self, what: str, session_id: str, holder: str, token: int) -> None:
        world = self.world
        world.lease_log.append(LeaseStep(what, session_id, holder, token, world.clock.now(),
                                         world.effects_performed))

    # -- grants -----------------------------------------------------------------------
    def _open_turn(self, effect: fx.OpenTurn) -> LeaseGrant:
        self._fail_if_planned(Site.LEASE)
        seqs = self.world.turn_seqs  # the opening's events numbered now, as Emits (DEL-1)
        opening = seqs.number_opening(effect.opening, self.world.clock.now())
        committed = False
        try:
            grant: LeaseGrant = self._write(
                self.world.store.open_turn, effect.record, effect.holder, effect.now,
                effect.ttl_s, effect.poll_s, opening, lambda: self._fail_if_planned(Site.USER),
                effect.create, carried=lambda g: opening.events if g.opened and opening else ())
            committed = bool(grant.opened)
        finally:
            seqs.settle_opening(opening, committed)
        if committed and opening is not None:  # in the world's stream as emitted events are
            for event in opening.events:
                self._show(event)
        timeline = self.world.timeline
        if grant.created:
            timeline.add("write", f"session   {effect.record.id} created")
        got = f"token {grant.lease.token}" if grant.lease else "busy"
        timeline.add("write", f"lease     {effect.record.id} {got}")
        if timeline.enabled:
            from sim.driver import describe_row  # the driver mixes this class in

            for row in grant.opened:  # the user row, in the grant's commit (Opening)
                timeline.add("write", f"{Site.USER:<9} #{row.row_id} {describe_row(row)} "
                             "(with the lease)")
        if grant.lease is not None:
            self.log_lease("granted", grant.lease)
        else:
            self._log_busy(effect.record.id, effect.holder)
        return grant

    def _acquire_lease(self, effect: fx.AcquireLease) -> Lease | None:
        self._fail_if_planned(Site.LEASE)
        lease: Lease | None = self._write(self.world.store.acquire_lease, effect.session_id,
                                          effect.holder, effect.now, effect.ttl_s, effect.poll_s)
        timeline = self.world.timeline
        if timeline.enabled:  # a turn waiting for the lease asks every poll
            got = f"token {lease.token}" if lease else "busy"
            timeline.add("write", f"lease     {effect.session_id} {got}")
        if lease is not None:
            self.log_lease("granted", lease)
        else:
            self._log_busy(effect.session_id, effect.holder)
        return lease

    def _log_busy(self, session_id: str, asker: str) -> None:
        """A refused ask: the lease log keeps who asked, for when and when (LEASE-3)."""
        self._log_step("busy", session_id, asker, 0)

    def _release_lease(self, effect: fx.ReleaseLease) -> None:
        try:
            self._fail_if_planned(Site.RELEASE)
        except PersistenceError:
            self.log_lease("release_failed", effect.lease)  # the store refused it (LEASE-6)
            raise
        self._write(self.world.store.release_lease, effect.lease)
        self.world.timeline.add("write", f"release   token {effect.lease.token}")
        self.log_lease("released", effect.lease)

    def _close_turn(self, effect: fx.CloseTurn) -> Closed:
        """The final rows, the ending and the release as one commit (``Closing``).

        The closing's events are numbered now, as ``Emit`` would number them (DEL-1); if
        the rows did not commit, those events never existed. A planned failure at
        ``final`` fails the whole commit, one at ``release`` the release alone.
        """
        world, lease = self.world, effect.lease
        seqs = world.turn_seqs
        closing = seqs.number_closing(effect.closing, world.clock.now())
        committed = False
        try:
            self._fail_if_planned(Site.FINAL)  # after numbering, as a store's refusal comes
            closed: Closed = self._write(world.store.close_turn, lease, closing,
                                         lambda: self._fail_if_planned(Site.RELEASE),
                                         carried=lambda _: closing.events)
            committed = True
        except LeaseLost:
            world.timeline.add("FENCED", f"{Site.FINAL} write with token {lease.token} refused: "
                               "the lease is gone")
            raise
        finally:
            seqs.settle_closing(closing, committed)
        self._narrate_closed(closing, closed, lease)
        self.log_lease("released" if closed.release_failure is None else "release_failed", lease)
        return closed

    def _narrate_closed(self, closing: Closing, closed: Closed, lease: Lease) -> None:
        """What committed, in the order it was written: the rows, the ending, the release."""
        timeline = self.world.timeline
        if timeline.enabled:
            from sim.driver import describe_row  # the driver mixes this class in

            for row in closed.stored:
                timeline.add("write", f"{Site.FINAL:<9} #{row.row_id} {describe_row(row)}")
        for event in closing.events:  # in the world's stream as emitted events are
            self._show(event)
            if event.kind is EventKind.TURN_EXIT:
                self._narrate_exit(event)
        if closed.release_failure is None:
            timeline.add("write", f"release   token {lease.token} (with the final row)")
        else:
            timeline.add("write", f"release   token {lease.token} failed alone: the final row and "
                         "the ending committed")

    def _leave_queue(self, effect: fx.LeaveLeaseQueue) -> None:
        self._fail_if_planned(Site.LEASE)
        self._write(self.world.store.leave_lease_queue, effect.session_id, effect.holder)
        self.world.timeline.add("write", f"lease     {effect.session_id} gave up waiting")
        self.log_lease("left", Lease(session_id=effect.session_id, holder=effect.holder, token=0,
                                     acquired_at=0.0, expires_at=0.0))  # its place is gone (LEASE-3)

    def _refresh_lease(self, effect: fx.RefreshLease) -> Lease:
        world = self.world
        try:
            self._fail_if_planned(Site.REFRESH)
            lease: Lease = self._write(world.store.refresh_lease, effect.lease, effect.now,
                                       effect.ttl_s)
        except LeaseLost:
            self.log_lease("refresh_failed", effect.lease)
            world.timeline.add("lease", f"refresh   {effect.lease.session_id} "
                               f"token {effect.lease.token} lost")
            raise
        except Exception:
            self.log_lease("refresh_failed", effect.lease)
            raise
        if self.current is not None:
            self._kept[self.current.seq] = lease
        self.log_lease("refreshed", lease)
        until = lease.expires_at - world.timeline.start_s
        world.timeline.add("lease", f"refresh   {lease.session_id} token {lease.token} "
                           f"until {until:.0f} s")
        return lease

    # -- the refresher actor ----------------------------------------------------------------
    def _start_refresher(self, effect: fx.StartRefresher) -> int:
        coro = lease_rules.keep_lease(effect.lease, effect.interval_s, effect.ttl_s,
                                      effect.first_s)
        child = self.spawn(coro, name=f"refresher of {effect.lease.holder}", parent=self.current)
        self._refreshers[child.seq] = child
        self._kept[child.seq] = effect.lease
        self.log_lease("refresher_started", effect.lease)
        return child.seq

    def _stop_refresher(self, effect: fx.StopRefresher) -> bool:
        self.stop_actor(self._refreshers.pop(effect.handle))
        lost = effect.handle in self._lost
        self._lost.discard(effect.handle)
        self.log_lease("refresher_stopped", self._kept.pop(effect.handle))
        return lost

    def _interrupt_turn(self, effect: fx.InterruptTurn) -> None:
        refresher = self.current
        assert refresher is not None
        self._lost.add(refresher.seq)
        turn = refresher.parent
        self.log_lease("interrupted", self._kept[refresher.seq])
        self.world.timeline.add("INTERRUPT", f"{lease_rules.holder_fields(effect.holder).get('turn')}"
                                f": {effect.reason}")
        if turn is None or turn.done:
            return
        turn.interrupt = effect.reason
        if turn.wait is not None and type(turn.pending) in _TIMED:  # cut its wait short
            pending = turn.pending
            if isinstance(pending, fx.CallProvider):
                self.world.mark_pending_call(turn.turn_id, stopped="lease")
            self.world.scheduler.unpark(turn)
            turn.driver._complete(turn, pending, None, TurnInterrupted(effect.reason))

    def _clear_interrupt(self, effect: fx.ClearInterrupt) -> None:
        if self.current is not None:
            self.current.interrupt = None
