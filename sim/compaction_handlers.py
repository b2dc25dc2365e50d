"""The simulator's side of compaction (CMP-5, CMP-6): the lock, the rotation, the tip.

Theory of operation
-------------------
``CompactionHandlers`` is the part of ``SimDriver`` that performs ``hermes_ref.rotation``'s
effects. The lock and the compaction are store writes of the process (they carry its
pending events, and a planned store failure at their site fails them before they reach
the store); ``LoadTip`` is a read. Each is narrated as one line, so a snapshot shows who
took the lock, what a compaction moved where, and who was refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hermes_ref import effects as fx
from hermes_ref.effects import Site
from hermes_ref.errors import LeaseLost
from hermes_ref.lease import holder_fields
from hermes_ref.models import Compacted

if TYPE_CHECKING:
    from sim.world import World


class CompactionHandlers:
    """Mixed into ``SimDriver``; relies on its ``world``, ``_write`` and ``_fail_if_planned``."""

    world: World

    process: Any  # SimDriver's process (declared here, defined there)
    _write: Callable[..., Any]  # SimDriver's (declared here, defined there)
    _fail_if_planned: Callable[[Site], None]

    def compaction_handlers(self) -> dict[type[Any], Callable[[Any], Any]]:
        store = self.world.store
        return {
            fx.TakeCompressionLock: self._take_lock,
            fx.ReleaseCompressionLock: self._release_lock,
            fx.CompactSession: self._compact,
            fx.LoadTip: lambda e: store.compression_tip(e.session_id),
        }

    def _take_lock(self, effect: fx.TakeCompressionLock) -> bool:
        self._fail_if_planned(Site.COMPRESSION_LOCK)
        taken: bool = self._write(self.world.store.take_compression_lock, effect.session_id,
                                  effect.holder, effect.now, effect.ttl_s)
        self.world.timeline.add("lock", f"{effect.session_id} "
                                f"{'taken by' if taken else 'REFUSED to'} {_who(effect.holder)}")
        if taken:
            self._log_lock("lock_taken", effect.session_id, effect.holder)
        if taken and effect.session_id in self.world.lock_stalls:
            self._stall_holding(effect.session_id, self.world.lock_stalls.pop(effect.session_id))
        return taken

    def _stall_holding(self, session_id: str, seconds: float) -> None:
        """The process that was just granted the lock freezes, holding it (``lock_stalls``):
        none of its actors runs for ``seconds``, its lease refresher neither."""
        world = self.world
        pid = self.process.pid
        world.stall(pid, seconds)
        world.timeline.add("FAULT", f"pid={pid} stalls for {seconds:g} s holding the "
                           f"compression lock of {session_id}")

    def _release_lock(self, effect: fx.ReleaseCompressionLock) -> None:
        self._fail_if_planned(Site.COMPRESSION_UNLOCK)
        self._write(self.world.store.release_compression_lock, effect.session_id,
                    effect.holder, effect.now)
        self.world.timeline.add("unlock", f"{effect.session_id} by {_who(effect.holder)}")
        self._log_lock("lock_released", effect.session_id, effect.holder)

    def _log_lock(self, what: str, session_id: str, holder: str, token: int = 0) -> None:
        """CMP-6: the compression lock's holder took it, gave it back, or compacted, in the
        world's effect order (the durable lock log has only times, which one instant shares)."""
        from sim.world import LeaseStep

        world = self.world
        world.lease_log.append(LeaseStep(what, session_id, holder, token, world.clock.now(),
                                         world.effects_performed))

    def _compact(self, effect: fx.CompactSession) -> Compacted:
        self._fail_if_planned(effect.site)
        try:
            done: Compacted = self._write(
                self.world.store.compact_session, effect.session_id, effect.lease_token,
                effect.messages, effect.child, effect.at, effect.flush)
        except LeaseLost:
            self.world.timeline.add("FENCED", f"{effect.site} write with token "
                                    f"{effect.lease_token} refused: the lease is gone")
            raise
        if effect.rotate:
            text = (f"{effect.session_id} -> {done.session.id} ({len(done.rows)} rows; "
                    f"{effect.session_id} ended compression, lease token {done.lease.token} "
                    "carried)")
        else:
            text = f"{effect.session_id} in place ({len(done.rows)} rows, the rest archived)"
        self.world.timeline.add(str(effect.site), text)
        self._log_lock("compacted", effect.session_id, done.lease.holder, effect.lease_token)
        if effect.rotate:
            for watcher in list(self.world.rotation_watchers):
                watcher(effect.session_id, done.session.id)
        return done


def _who(holder: str) -> str:
    fields = holder_fields(holder)
    return f"pid={fields.get('pid', '?')} {fields.get('turn', holder)}"
