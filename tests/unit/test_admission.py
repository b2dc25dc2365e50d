"""The admission door's pure rules and coroutines: table, digest, authority, FIFO, fencing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_ref import admission, door
from hermes_ref import effects as fx
from hermes_ref.admission import (
    Ack,
    AdmissionRefused,
    AdmissionRow,
    AdmissionStatus,
    AdmitAnswer,
    Binding,
    BindingRole,
    EpochRecord,
    Intent,
    Move,
    Outcome,
    PrincipalKind,
    Refusal,
)
from hermes_ref.errors import BadInput, PersistenceError
from hermes_ref.limits import Limits
from hermes_ref.shell import liveness

DOCS = Path(__file__).resolve().parents[2] / "docs"
LIMITS = Limits()


def row(seq: int = 1, status: AdmissionStatus = AdmissionStatus.QUEUED, **kw: Any) -> AdmissionRow:
    payload = {"text": f"input {seq}"}
    values: dict[str, Any] = {
        "admission_id": f"adm-{seq}", "seq": seq, "principal_id": "alice",
        "principal_kind": PrincipalKind.USER, "session_id": "s-1", "request_id": f"r-{seq}",
        "payload_json": admission.canonical_json(payload),
        "payload_digest": admission.payload_digest("s-1", payload, Intent.QUEUE),
        "intent": Intent.QUEUE, "role": BindingRole.MEMBER, "status": status,
        "owner_epoch": 1, "created_at": 0.0, "updated_at": 0.0}
    values.update(kw)
    return AdmissionRow(**values)


def binding(role: BindingRole = BindingRole.MEMBER,
            kind: PrincipalKind = PrincipalKind.USER) -> Binding:
    return Binding(principal_id="alice", kind=kind, session_id="s-1", role=role)


# ---- the status machine ----------------------------------------------------------------


def test_the_docs_carry_the_rendered_status_machine() -> None:
    """docs/admission.md holds render_mermaid()'s output verbatim (regenerate it if this fails)."""
    assert admission.render_mermaid() in (DOCS / "admission.md").read_text(encoding="utf-8")


def test_unknown_is_left_only_by_reconcile_and_nothing_returns_to_queued() -> None:
    """No move leads back to queued, and the only way out of unknown is a reconcile."""
    assert AdmissionStatus.QUEUED not in admission.TRANSITIONS.values()
    exits = {move for (source, move) in admission.TRANSITIONS if source is AdmissionStatus.UNKNOWN}
    assert exits == {Move.RECONCILE}
    assert not any(source is AdmissionStatus.TERMINAL for source, _ in admission.TRANSITIONS)


@given(st.sampled_from(list(AdmissionStatus)), st.sampled_from(list(Move)),
       st.sampled_from([None, *Outcome]))
def test_apply_move_follows_the_table_exactly(status: AdmissionStatus, move: Move,
                                              outcome: Outcome | None) -> None:
    """A move is applied iff the table allows it with an outcome of its own; else nothing moves."""
    before = row(status=status)
    allowed = admission.MOVE_OUTCOMES.get(move, frozenset())
    legal = (status, move) in admission.TRANSITIONS and (
        outcome in allowed if allowed else outcome is None)
    try:
        after = admission.apply_move(before, move, epoch=1, live=True, now=5.0, tick=9,
                                     outcome=outcome)
    except PersistenceError as error:
        assert not legal and error.cause == "illegal_move"
        return
    assert legal
    assert after.status is admission.TRANSITIONS[(status, move)]
    assert after.outcome == (outcome if allowed else None)
    assert after.claims == before.claims + (move is Move.CLAIM)


def test_a_stale_epoch_moves_nothing() -> None:
    """Settle is fenced by a live caller epoch that is the row's owner epoch."""
    started = row(status=AdmissionStatus.STARTED, owner_epoch=1)
    for epoch, live in ((1, False), (2, True)):
        with pytest.raises(PersistenceError) as info:
            admission.apply_move(started, Move.SETTLE, epoch=epoch, live=live,
                                 now=1.0, tick=1, outcome=Outcome.COMPLETED)
        assert info.value.cause == "stale_epoch"


def test_another_live_epoch_does_not_fence_a_claim() -> None:
    """A process claims under its own live epoch whatever other processes began since."""
    claimed = admission.apply_move(row(owner_epoch=5), Move.CLAIM, epoch=2, live=True, now=1.0,
                                   tick=1)
    assert claimed.owner_epoch == 2 and claimed.status is AdmissionStatus.STARTED


def test_recovery_makes_only_dead_epochs_started_rows_unknown() -> None:
    """Queued rows and the started rows of live epochs are left as they are (ADM-5, ADM-7)."""
    rows = [row(1, AdmissionStatus.STARTED, owner_epoch=1), row(2, owner_epoch=1),
            row(3, AdmissionStatus.STARTED, owner_epoch=2)]
    changed = admission.recover(rows, {1}, 3.0, 10)
    assert [(r.admission_id, r.status, r.unknown_tick) for r in changed] == [
        ("adm-1", AdmissionStatus.UNKNOWN, 11)]


def test_only_dead_holders_and_a_same_holder_predecessor_are_retired() -> None:
    """Recovery retires a dead holder's epoch and an older one of its own holder, no other."""
    epochs = [EpochRecord(epoch=1, holder="pid=7", started_at=0.0),
              EpochRecord(epoch=2, holder="pid=8", started_at=0.0),
              EpochRecord(epoch=3, holder="pid=9", started_at=0.0),
              EpochRecord(epoch=4, holder="pid=6", started_at=0.0, retired_at=1.0),
              EpochRecord(epoch=5, holder="pid=9", started_at=2.0)]
    assert admission.retirable(epochs, 5, lambda holder: holder != "pid=7") == [1, 3]
    assert admission.epoch_live(epochs, 5) and not admission.epoch_live(epochs, 4)
    with pytest.raises(PersistenceError):
        admission.retirable(epochs, 4, lambda holder: True)


# ---- FIFO -------------------------------------------------------------------------------


def test_the_claim_is_the_lowest_seq_and_waits_for_the_one_in_flight() -> None:
    """Lowest seq queued; none while one is started; paused while one is unknown (ADM-4/5)."""
    queued = [row(3), row(1), row(2)]
    answer = admission.next_claim(queued)
    assert answer.row is not None and answer.row.seq == 1
    assert admission.next_claim([*queued, row(9, AdmissionStatus.STARTED)]) == \
        admission.ClaimAnswer(busy=True)
    paused = admission.next_claim([*queued, row(9, AdmissionStatus.UNKNOWN)])
    assert paused.row is None and paused.paused
    assert admission.next_claim([row(1, AdmissionStatus.TERMINAL)]).row is None


# ---- digest and normalization ----------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@given(st.dictionaries(st.text(max_size=5), JSON, max_size=4), st.randoms())
def test_the_digest_ignores_key_order(extra: dict[str, Any], rnd: Any) -> None:
    """Equal payloads built in any key order have one canonical JSON and one digest."""
    payload = {"text": "hi", **extra}
    keys = list(payload)
    rnd.shuffle(keys)
    shuffled = {k: payload[k] for k in keys}
    assert admission.canonical_json(shuffled) == admission.canonical_json(payload)
    assert admission.payload_digest("s", shuffled, Intent.QUEUE) == \
        admission.payload_digest("s", payload, Intent.QUEUE)


@given(st.text(min_size=1, max_size=20).filter(str.strip))
def test_the_digest_binds_target_and_intent(text: str) -> None:
    """Another session or another intent is another request, with another digest."""
    payload = {"text": text}
    one = admission.payload_digest("s-1", payload, Intent.QUEUE)
    assert one != admission.payload_digest("s-2", payload, Intent.QUEUE)
    assert one != admission.payload_digest("s-1", payload, Intent.STEER)
    body = {"payload": {"input": payload, "intent": "queue"}, "target": "s-1"}
    import hashlib
    expected = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                         ensure_ascii=False).encode()).hexdigest()
    assert one == expected


@pytest.mark.parametrize("payload", [
    "{not json", [1, 2], {"text": ""}, {"text": "   "}, {"note": "no text"},
    {"text": float("nan")}, {"text": "x" * 70_000}, {"text": "hi", "bad": {1, 2}},
    {"text": "lone \ud800 surrogate"},
])
def test_unusable_payloads_are_invalid_params(payload: Any) -> None:
    """A payload that is not a JSON object with text, or too large, is refused in one line."""
    with pytest.raises(AdmissionRefused) as info:
        admission.normalize_payload(payload, LIMITS)
    assert info.value.code == "invalid_params" and "\n" not in str(info.value)
    assert isinstance(info.value, BadInput)


def test_a_json_text_payload_normalizes_like_its_object() -> None:
    """JSON text and the object it encodes are one payload; line ends become \\n."""
    as_text = admission.normalize_payload('{"text": "a\\r\\nb", "k": 1}', LIMITS)
    assert as_text == admission.normalize_payload({"k": 1, "text": "a\nb"}, LIMITS)


@pytest.mark.parametrize("key", ["", None, 7, "x" * 1025, "tab\there"])
def test_malformed_keys_are_refused(key: Any) -> None:
    """Ids are non-empty printable strings within the bound."""
    with pytest.raises(AdmissionRefused):
        admission.check_key("request_id", key, LIMITS)


# ---- authority --------------------------------------------------------------------------


def test_the_role_is_the_bindings_whatever_the_payload_says() -> None:
    """ADM-2: authorize reads the binding only; intents follow the role."""
    assert admission.authorize(binding(), "alice", "s-1", Intent.QUEUE) is BindingRole.MEMBER
    with pytest.raises(AdmissionRefused) as info:
        admission.authorize(binding(), "alice", "s-1", Intent.REDIRECT)
    assert info.value.code == "forbidden"
    with pytest.raises(AdmissionRefused) as info:
        admission.authorize(None, "alice", "s-1", Intent.QUEUE)
    assert info.value.code == "not_bound"
    operator = binding(BindingRole.OPERATOR)
    assert admission.authorize(operator, "alice", "s-1", Intent.REDIRECT) is BindingRole.OPERATOR


def test_idempotency_is_judged_by_the_digest() -> None:
    """Same key: same digest is a hit, another a conflict (ADM-3)."""
    first = row(1)
    assert admission.decide_admit(None, first) == "new"
    assert admission.decide_admit(first, first.model_copy(update={"admission_id": "x"})) == "hit"
    assert admission.decide_admit(first, first.model_copy(update={"payload_digest": "0"})) \
        == "conflict"


# ---- the coroutines, stepped by hand -----------------------------------------------------


def drive(coro: Any, answers: dict[type, Any]) -> tuple[Any, list[Any]]:
    """Run a door coroutine, answering each effect from ``answers``; returns result and effects."""
    seen: list[Any] = []
    value: Any = None
    while True:
        try:
            effect = coro.send(value)
        except StopIteration as stop:
            return stop.value, seen
        seen.append(effect)
        answer = answers.get(type(effect))
        value = answer(effect) if callable(answer) else answer


def test_admit_acknowledges_only_after_the_commit() -> None:
    """The ack is the last effect, after AdmitInput returned the committed row (ADM-1)."""
    def commit(effect: fx.AdmitInput) -> AdmitAnswer:
        return AdmitAnswer(verdict="new", row=effect.candidate.model_copy(update={"seq": 4}))
    sub = door.Submission("alice", "s-1", "r-1", {"text": "hi", "role": "operator"})
    result, seen = drive(door.admit(sub, LIMITS, 1), {
        fx.LoadBinding: binding(), fx.Now: 1.0, fx.MintId: "adm-1", fx.AdmitInput: commit})
    kinds = [type(e) for e in seen]
    assert kinds[-2:] == [fx.AdmitInput, fx.Acknowledge]
    assert isinstance(result, Ack) and result.seq == 4 and result.fresh
    assert seen[-2].candidate.role is BindingRole.MEMBER  # the payload's claim gained nothing


def test_bad_input_is_refused_before_any_write() -> None:
    """A malformed payload is refused after the binding read and before any write."""
    payload = "{broken"
    result, seen = drive(door.admit(door.Submission("alice", "s-1", "r", payload), LIMITS, 1),
                         {fx.LoadBinding: binding()})
    assert [type(e) for e in seen] == [fx.LoadBinding, fx.Acknowledge]
    assert isinstance(result, Refusal) and result.carried is payload
    assert result.code == "invalid_params" and isinstance(result.error(), BadInput)


def test_a_malformed_key_is_refused_before_any_effect() -> None:
    """An empty request id is refused with no read and no write at all."""
    result, seen = drive(door.admit(door.Submission("alice", "s-1", "", {"text": "hi"}), LIMITS,
                                    1), {})
    assert [type(e) for e in seen] == [fx.Acknowledge]
    assert isinstance(result, Refusal) and result.code == "invalid_params"


def test_a_conflict_is_refused_with_the_input_handed_back() -> None:
    """admission_conflict carries the submitted payload back (ADM-3, ADM-6)."""
    payload = {"text": "other"}
    result, _ = drive(door.admit(door.Submission("alice", "s-1", "r", payload), LIMITS, 1), {
        fx.LoadBinding: binding(), fx.Now: 1.0, fx.MintId: "adm-1",
        fx.AdmitInput: AdmitAnswer(verdict="conflict")})
    assert isinstance(result, Refusal) and result.code == "admission_conflict"
    assert result.carried is payload


def test_an_internal_event_needs_a_binding_of_its_kind() -> None:
    """A cron tick from a principal bound as a user is refused (ADM-2)."""
    sub = door.internal_submission(PrincipalKind.CRON, "alice", "s-1", "run-1", "tick")
    result, _ = drive(door.admit(sub, LIMITS, 1), {fx.LoadBinding: binding()})
    assert isinstance(result, Refusal) and result.code == "not_bound"
    with pytest.raises(AdmissionRefused):
        door.internal_submission(PrincipalKind.USER, "alice", "s-1", "e", "not internal")


# ---- the production driver ---------------------------------------------------------------


async def test_the_asyncio_driver_runs_the_door_on_sqlite(tmp_path: Path) -> None:
    """Admit, an idempotent retry, drain and recovery through AsyncDriver on AsyncSqliteStore."""
    import httpx

    from hermes_ref.engine import Engine
    from hermes_ref.models import SessionRecord
    from hermes_ref.shell.driver import AsyncDriver
    from hermes_ref.shell.http_provider import HttpProvider
    from hermes_ref.shell.sqlite_store import AsyncSqliteStore
    from sim.provider import ScriptedProvider, text
    from sim.provider_http import fake_transport
    from sim.tools import SimTools

    script = ScriptedProvider([text("Hello back.")])
    store = await AsyncSqliteStore.open(tmp_path / "door.db")
    acks: list[Ack | Refusal] = []
    async with httpx.AsyncClient(transport=fake_transport(script)) as client:
        driver = AsyncDriver(store=store, provider=HttpProvider("http://p.test/v1", client=client),
                             tools=SimTools({}), on_ack=acks.append)
        await store.create_session(SessionRecord(id="s-1", key="k", system_prompt="p",
                                                 started_at=0.0))
        await store.bind_principal(binding())
        epoch = (await driver.run(door.recover())).epoch
        sub = door.Submission("alice", "s-1", "r-1", {"text": "Hello!"})
        first = await driver.run(door.admit(sub, LIMITS, epoch))
        again = await driver.run(door.admit(sub, LIMITS, epoch))
        assert isinstance(first, Ack) and isinstance(again, Ack) and not again.fresh
        assert acks == [first, again]
        step = await driver.run(door.drain_step(Engine(), "s-1", epoch))
        assert step.admission is not None and step.admission.outcome is Outcome.COMPLETED
        record = await store.snapshot()
        assert [m.content for m in record.transcript("s-1")] == ["Hello!", "Hello back."]
        assert record.admissions[0].turn_id == step.admission.turn_id
        assert [e.holder for e in record.epochs] == [liveness.holder_identity()]
    await store.close()


async def test_a_dead_pid_s_epoch_is_retired_on_sqlite_and_a_live_one_kept(
        tmp_path: Path) -> None:
    """Production liveness: a killed child's started admission goes unknown, a live one's stays."""
    import subprocess
    import sys

    from hermes_ref.models import SessionRecord
    from hermes_ref.shell.sqlite_store import AsyncSqliteStore

    def holder(pid: int) -> str:  # the child's identity, as it would name itself
        ns = liveness.own_pid_namespace()
        return f"pid={pid}" + (f":pidns={ns}" if ns else "")

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                for _ in range(2)]
    store = await AsyncSqliteStore.open(tmp_path / "door.db")
    try:
        epochs = []
        for n, child in enumerate(children, start=1):
            sid = f"s-{n}"
            await store.create_session(SessionRecord(id=sid, key=sid, system_prompt="p",
                                                     started_at=0.0))
            await store.bind_principal(binding().model_copy(update={"session_id": sid}))
            epochs.append((await store.begin_epoch(1.0, holder(child.pid))).epoch)
            await store.admit_input(row(n, session_id=sid, owner_epoch=epochs[-1]))
            assert (await store.claim_admission(sid, epochs[-1], 2.0)).row is not None
        children[0].kill()
        children[0].wait()
        start = await store.begin_epoch(3.0, liveness.holder_identity())
        assert start.retired == (epochs[0],)
        assert [r.admission_id for r in start.orphaned] == ["adm-1"]
        status = {r.session_id: r.status for r in (await store.snapshot()).admissions}
        assert status == {"s-1": AdmissionStatus.UNKNOWN, "s-2": AdmissionStatus.STARTED}
    finally:
        for child in children:
            child.kill()
            child.wait()
        await store.close()


# ---- what each move writes -----------------------------------------------------------------


def test_a_claim_counts_marks_and_takes_the_claiming_epoch() -> None:
    """A claim records the count, the message mark, its tick and the epoch that claimed it."""
    claimed = admission.apply_move(row(owner_epoch=1), Move.CLAIM, epoch=3, live=True,
                                   now=7.0, tick=4, claim_mark=12)
    assert (claimed.status, claimed.claims, claimed.claim_mark, claimed.claimed_tick,
            claimed.owner_epoch, claimed.updated_at) == (
        AdmissionStatus.STARTED, 1, 12, 4, 3, 7.0)
    assert claimed.settled_tick is None and claimed.unknown_tick is None


def test_a_settle_records_how_when_and_which_turn() -> None:
    """Settle writes outcome, turn, the move, the epoch and the tick; orphan only its tick."""
    started = row(status=AdmissionStatus.STARTED, owner_epoch=2)
    done = admission.apply_move(started, Move.SETTLE, epoch=2, live=True, now=9.0,
                                tick=6, outcome=Outcome.FAILED, turn_id="turn-4")
    assert (done.outcome, done.turn_id, done.settled_via, done.settled_epoch, done.settled_tick) \
        == (Outcome.FAILED, "turn-4", Move.SETTLE, 2, 6)
    lost = admission.apply_move(started, Move.ORPHAN, epoch=3, live=True, now=9.0, tick=7)
    assert (lost.status, lost.unknown_tick, lost.outcome, lost.settled_via) == (
        AdmissionStatus.UNKNOWN, 7, None, None)
    ended = admission.apply_move(lost.model_copy(update={"turn_id": "turn-4"}), Move.RECONCILE,
                                 epoch=3, live=True, now=10.0, tick=8,
                                 outcome=Outcome.INTERRUPTED)
    assert ended.turn_id == "turn-4" and ended.settled_via is Move.RECONCILE


def test_authorize_needs_this_principal_and_this_session() -> None:
    """A binding of another principal or session authorizes nothing."""
    for principal, session_id in (("bob", "s-1"), ("alice", "s-2")):
        with pytest.raises(AdmissionRefused) as info:
            admission.authorize(binding(), principal, session_id, Intent.QUEUE)
        assert info.value.code == "not_bound"
    owner = binding(BindingRole.OWNER)
    assert admission.authorize(owner, "alice", "s-1", Intent.STEER) is BindingRole.OWNER
    with pytest.raises(AdmissionRefused):
        admission.authorize(owner, "alice", "s-1", Intent.REDIRECT)


def test_keys_at_the_bound_pass_and_one_more_fails() -> None:
    """admission_key_chars_max is inclusive."""
    assert admission.check_key("k", "x" * 1024, LIMITS) == "x" * 1024
    with pytest.raises(AdmissionRefused):
        admission.check_key("k", "x" * 1025, LIMITS)


def test_normalization_keeps_other_fields_and_fixes_only_line_ends() -> None:
    """Extra fields pass through as plain JSON; a lone CR becomes LF; text is not stripped."""
    plain = admission.normalize_payload({"text": " a\rb ", "tags": ("x", 1)}, LIMITS)
    assert plain == {"text": " a\nb ", "tags": ["x", 1]}
    size = len(admission.canonical_json({"text": "hi"}).encode())
    assert admission.normalize_payload({"text": "hi"}, Limits(admission_payload_bytes_max=size))
    with pytest.raises(AdmissionRefused):
        admission.normalize_payload({"text": "hi"}, Limits(admission_payload_bytes_max=size - 1))


def test_the_outcome_of_a_turn() -> None:
    """Handed back is rejected, interrupted stays interrupted, failed is failed, else completed."""
    from hermes_ref.models import Message, Role
    from hermes_ref.outcomes import ExitReason, TurnResult

    base = TurnResult(session_id="s", turn_id="t", final_response="ok",
                      exit_reason=ExitReason.TEXT_RESPONSE, completed=True)
    handed = base.model_copy(update={"carried_input": Message(role=Role.USER, content="q"),
                                     "failed": True})
    assert door.outcome_of(base) is Outcome.COMPLETED
    assert door.outcome_of(handed) is Outcome.REJECTED
    assert door.outcome_of(base.model_copy(update={"failed": True})) is Outcome.FAILED
    interrupted = base.model_copy(update={"exit_reason": ExitReason.INTERRUPTED, "failed": True})
    assert door.outcome_of(interrupted) is Outcome.INTERRUPTED
