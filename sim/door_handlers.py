"""The simulator's side of the admission door: its store writes, narration and ack log.

Theory of operation
-------------------
``AdmissionHandlers`` is the part of ``SimDriver`` that performs the door's effects. The
writes (``BeginEpoch``, ``AdmitInput``, ``ClaimAdmission``, ``MoveAdmission``) are store
writes of the process, carrying its pending events like every write, and each may be
failed by the fault plan at its site (``epoch``, ``admit``, ``claim``, ``settle``); the
crash points ``before:<site>`` / ``after:<site>`` come with the sites for free.

``Acknowledge`` is the submitter receiving the door's answer. The world writes it to its
ack log (``World.acks``) together with the store's committed admission high-water mark at
that instant, read from the store and not from the answer: that pair is what lets a
checker say that nothing was acknowledged before its row was committed (ADM-1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hermes_ref import effects as fx
from hermes_ref.admission import Ack, AdmissionRow, AdmitAnswer, ClaimAnswer, EpochStart
from hermes_ref.effects import Site

if TYPE_CHECKING:
    from sim.world import SimProcess, World


class AdmissionHandlers:
    """Mixed into ``SimDriver``; relies on its ``world``, ``_write`` and ``_fail_if_planned``."""

    world: World
    process: SimProcess

    _write: Callable[..., Any]                # SimDriver's (declared here, defined there)
    _fail_if_planned: Callable[[Site], None]

    def admission_handlers(self) -> dict[type[Any], Callable[[Any], Any]]:
        return {
            fx.LoadBinding: lambda e: self.world.store.get_binding(e.principal_id, e.session_id),
            fx.BeginEpoch: self._begin_epoch,
            fx.RecoverEpochs: self._recover_epochs,
            fx.AdmitInput: self._admit_input,
            fx.Acknowledge: self._acknowledge,
            fx.ClaimAdmission: self._claim_admission,
            fx.MoveAdmission: self._move_admission,
        }

    def _begin_epoch(self, effect: fx.BeginEpoch) -> EpochStart:
        self._fail_if_planned(Site.EPOCH)
        holder = effect.holder or self.world.holder_of(self.process.pid)
        start: EpochStart = self._write(self.world.store.begin_epoch, effect.now, holder)
        self._narrate_recovery(f"epoch     {start.epoch}", start)
        return start

    def _recover_epochs(self, effect: fx.RecoverEpochs) -> EpochStart:
        self._fail_if_planned(Site.EPOCH)
        start: EpochStart = self._write(self.world.store.recover_epochs, effect.epoch,
                                        effect.now)
        self._narrate_recovery(f"recover   epoch {start.epoch}", start)
        return start

    def _narrate_recovery(self, head: str, start: EpochStart) -> None:
        orphans = " ".join(r.admission_id for r in start.orphaned)
        self.world.timeline.add("write", head + (f" unknown: {orphans}" if orphans else ""))

    def _admit_input(self, effect: fx.AdmitInput) -> AdmitAnswer:
        self._fail_if_planned(Site.ADMIT)
        answer: AdmitAnswer = self._write(self.world.store.admit_input, effect.candidate)
        row, key = answer.row, effect.candidate
        what = f"{row.admission_id} seq={row.seq}" if row is not None else key.request_id
        self.world.timeline.add("write", f"admit     {what} {key.session_id} "
                                f"from {key.principal_id}: {answer.verdict}")
        return answer

    def _acknowledge(self, effect: fx.Acknowledge) -> None:
        from sim.world import AckRecord

        world, answer = self.world, effect.answer
        world.acks.append(AckRecord(answer=answer, mark=world.store.admission_mark()))
        if isinstance(answer, Ack):
            again = "" if answer.fresh else " (again)"
            world.timeline.add("ack", f"{answer.admission_id} seq={answer.seq} to "
                               f"{answer.principal_id}{again}")
        else:
            world.timeline.add("refuse", f"{answer.code} to {answer.principal_id!r}, "
                               "input handed back")

    def _claim_admission(self, effect: fx.ClaimAdmission) -> ClaimAnswer:
        self._fail_if_planned(Site.CLAIM)
        answer: ClaimAnswer = self._write(self.world.store.claim_admission, effect.session_id,
                                          effect.epoch, effect.now)
        row, timeline = answer.row, self.world.timeline
        if timeline.enabled:  # a drain polls its claim: no narration made for no timeline
            what = (f"{row.admission_id} seq={row.seq}" if row is not None
                    else "paused: an admission is unknown" if answer.paused
                    else "busy: an admission is in flight" if answer.busy else "nothing queued")
            timeline.add("write", f"claim     {effect.session_id} {what}")
        return answer

    def _move_admission(self, effect: fx.MoveAdmission) -> AdmissionRow:
        self._fail_if_planned(Site.SETTLE)
        row: AdmissionRow = self._write(
            self.world.store.move_admission, effect.admission_id, effect.session_id,
            effect.move, effect.epoch, effect.now, effect.outcome, effect.turn_id)
        outcome = row.outcome.value if row.outcome is not None else row.status.value
        turn = f" {row.turn_id}" if row.turn_id else ""
        self.world.timeline.add("write", f"{effect.move.value:<9} {row.admission_id} "
                                f"{outcome}{turn}")
        return row
