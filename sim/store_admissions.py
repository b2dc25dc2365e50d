"""The admission door's part of the in-memory store (a mixin of ``MemoryStore``).

Theory of operation
-------------------
Rows, bindings, every process's runtime epoch (``EpochRecord``: holder, start,
retirement) and the admission clock (``tick``, one count per transition) live here.
Every method is one "transaction" that commits before it returns, as in the SQLite
stores: it reads what it needs, asks ``hermes_ref.admission`` what to do (``decide_admit``,
``next_claim``, ``apply_move``, ``retirable``, ``recover``: the same functions the
SQLite ops call, reached through the module so that one rule governs every store), then
writes the answer and commits the pending events. Nothing here decides a rule itself.

Rows are frozen values; a transition replaces the row with the value ``apply_move``
returned, keyed by admission id, so the insertion order is ``seq`` order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_ref import admission
from hermes_ref.admission import (
    AdmissionRow,
    AdmitAnswer,
    Binding,
    ClaimAnswer,
    EpochRecord,
    EpochStart,
    Move,
    Outcome,
)
from hermes_ref.errors import PersistenceError
from hermes_ref.ports import DurableRecord

if TYPE_CHECKING:
    from collections.abc import Callable

    from hermes_ref.models import SessionRecord


class AdmissionsMixin:
    """ADM store methods over plain dicts; see the module docstring."""

    if TYPE_CHECKING:
        _sessions: dict[str, SessionRecord]
        _holder_alive: Callable[[str], bool]

        def _commit_events(self) -> None: ...
        def watermark(self) -> int: ...

    def _init_admissions(self) -> None:
        self._admissions: dict[str, AdmissionRow] = {}
        self._by_request: dict[tuple[str, str], list[str]] = {}  # (session, request) -> ids
        self._bindings: dict[tuple[str, str], Binding] = {}
        self._epoch = 0  # the highest epoch begun
        self._epochs: dict[int, EpochRecord] = {}
        self._tick = 0

    def bind_principal(self, binding: Binding) -> None:
        if binding.session_id not in self._sessions:
            raise PersistenceError(f"no session {binding.session_id!r}", cause="foreign_key")
        self._bindings[(binding.principal_id, binding.session_id)] = binding
        self._commit_events()

    def get_binding(self, principal_id: str, session_id: str) -> Binding | None:
        return self._bindings.get((principal_id, session_id))

    def _numbered(self, epoch: int) -> tuple[EpochRecord, ...]:
        """The record of epoch number ``epoch``, if there is one: the records are keyed by
        their number, so the fence (asked at every claim) reads one record, not them all."""
        record = self._epochs.get(epoch)
        return () if record is None else (record,)

    def begin_epoch(self, now: float, holder: str) -> EpochStart:
        epoch = self._epoch + 1
        self._epochs[epoch] = EpochRecord(epoch=epoch, holder=holder, started_at=now)
        self._epoch = epoch
        return self.recover_epochs(epoch, now)

    def recover_epochs(self, epoch: int, now: float) -> EpochStart:
        dead = admission.retirable(self._epochs.values(), epoch, self._holder_alive)
        for number in dead:
            self._epochs[number] = self._epochs[number].model_copy(update={"retired_at": now})
        changed = admission.recover(self._admissions.values(), dead, now, self._tick)
        for row in changed:
            self._admissions[row.admission_id] = row
        self._tick += len(changed)
        self._commit_events()
        return EpochStart(epoch=epoch, retired=tuple(dead), orphaned=tuple(changed))

    def admit_input(self, candidate: AdmissionRow) -> AdmitAnswer:
        key = (candidate.session_id, candidate.request_id)
        same = [self._admissions[i] for i in self._by_request.get(key, ())]
        existing = next((r for r in same if admission.same_request(r, candidate)), None)
        verdict = admission.decide_admit(existing, candidate)
        if verdict == "new" and candidate.session_id not in self._sessions:
            verdict = "not_found"
        row = existing if verdict == "hit" else None
        if verdict == "new":
            seq = max((r.seq for r in self._admissions.values()), default=0) + 1
            row = candidate.model_copy(update={"seq": seq})
            if row.admission_id in self._admissions:
                raise PersistenceError(f"admission {row.admission_id} exists", cause="duplicate")
            self._admissions[row.admission_id] = row
            self._by_request.setdefault(key, []).append(row.admission_id)
        self._commit_events()
        return AdmitAnswer(verdict=verdict, row=row)

    def claim_admission(self, session_id: str, epoch: int, now: float) -> ClaimAnswer:
        admission.fence(self._numbered(epoch), epoch)
        rows = [r for r in self._admissions.values() if r.session_id == session_id]
        answer = admission.next_claim(rows)
        if answer.row is not None:
            claimed = admission.apply_move(
                answer.row, Move.CLAIM, epoch=epoch,
                live=admission.epoch_live(self._numbered(epoch), epoch), now=now,
                tick=self._tick + 1, claim_mark=self.watermark())
            self._admissions[claimed.admission_id] = claimed
            self._tick += 1
            answer = ClaimAnswer(row=claimed)
        self._commit_events()
        return answer

    def move_admission(
        self, admission_id: str, session_id: str, move: Move, epoch: int, now: float,
        outcome: Outcome | None = None, turn_id: str | None = None,
    ) -> AdmissionRow:
        row = self._admissions.get(admission_id)
        if row is None or row.session_id != session_id:
            raise PersistenceError(f"no admission {admission_id!r} in session {session_id!r}",
                                   cause="not_found")
        moved = admission.apply_move(
            row, move, epoch=epoch, live=admission.epoch_live(self._numbered(epoch), epoch),
            now=now, tick=self._tick + 1, outcome=outcome, turn_id=turn_id)
        self._admissions[admission_id] = moved
        self._tick += 1
        self._commit_events()
        return moved

    def admission_mark(self) -> int:
        return max((r.seq for r in self._admissions.values()), default=0)

    def admission_rows(self) -> tuple[AdmissionRow, ...]:
        """The door's rows in seq order: ``snapshot().admissions``, without building the rest
        of the record (the harness reads them after every drain)."""
        return tuple(sorted(self._admissions.values(), key=lambda r: r.seq))

    def _with_admissions(self, record: DurableRecord) -> DurableRecord:
        """``record`` with the door's rows (seq order), bindings and epoch added."""
        bindings = sorted(self._bindings.values(), key=lambda b: (b.session_id, b.principal_id))
        return record.model_copy(update={
            "admissions": self.admission_rows(),
            "bindings": tuple(bindings), "epoch": self._epoch,
            "epochs": tuple(self._epochs[n] for n in sorted(self._epochs))})
