"""Property: wherever a process dies while inputs pass the door, nothing admitted is lost or run twice.

Hypothesis picks how many inputs two submitters send (some resubmitted), one crash point
among the door's sites and the turn's (with an occurrence), and whether a tool round is
in the first turn. The process dies there; a new one recovers, an operator reconciles
whatever is unknown, the submitters resend anything that got no answer, and the queue is
drained. Then every checker must pass, every admission must be terminal, each input must
be in the transcript at most once (exactly once when completed), and no admission may
have been claimed twice. The world is seeded, so a shrunk example replays exactly.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_ref.admission import AdmissionStatus, Outcome
from hermes_ref.models import ProviderReply, Role
from hermes_ref.wire import ProviderRequest
from sim.harness import Story
from sim.provider import FunctionProvider, text, tool_calls

MAX_EXAMPLES = int(os.environ.get("HERMES_REF_PROPERTY_EXAMPLES", "60"))
SITES = ("admit", "claim", "settle", "epoch", "user", "tool_calls", "tools", "final", "release")

crash_points = st.tuples(st.sampled_from(("before", "after")), st.sampled_from(SITES),
                         st.integers(1, 2)).map(lambda t: f"{t[0]}:{t[1]}#{t[2]}")
inputs = st.lists(st.tuples(st.sampled_from(("alice", "bob")), st.booleans()),
                  min_size=1, max_size=4)


def _provider(with_tools: bool) -> FunctionProvider:
    """A read before the first answer, if asked; then one short answer per request."""
    def reply(request: ProviderRequest) -> ProviderReply:
        if with_tools and not any(m.role is Role.TOOL for m in request.messages):
            return tool_calls(("read_file", {"path": "notes.txt"}))
        return text("noted")
    return FunctionProvider(reply)


def _story(s: Story, sent: list[tuple[str, bool]], crash: str, with_tools: bool) -> None:
    s.bind("alice")
    s.bind("bob")
    s.bind("olga", role="operator", kind="operator")
    s.files({"notes.txt": "milk"})
    s.use_provider(_provider(with_tools))
    s.recover()
    s.faults(crash=crash)
    unanswered = []
    for n, (who, again) in enumerate(sent):
        for _ in range(2 if again else 1):
            if s.submit(who, f"r-{n}", {"text": f"input {n} from {who}"}) is None:
                unanswered.append((who, n))
                s.restart()
    s.drain()
    s.restart()
    s.faults()
    s.recover()
    for row in s.admissions():
        if row.status is AdmissionStatus.UNKNOWN:
            s.reconcile("olga", row.admission_id)
    for who, n in unanswered:
        s.submit(who, f"r-{n}", {"text": f"input {n} from {who}"})
    s.drain()


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs, crash_points, st.booleans())
def test_no_crash_loses_or_repeats_an_admitted_input(sent: list[tuple[str, bool]], crash: str,
                                                     with_tools: bool) -> None:
    """After any one crash and recovery, every admission ends, once, and every checker passes."""
    with tempfile.TemporaryDirectory() as tmp:
        s = Story(store_kind="memory", workdir=Path(tmp), trace=False)
        _story(s, sent, crash, with_tools)
        s.check()
        assert [str(v) for v in s.violations] == []
        rows = s.admissions()
        assert len(rows) == len(sent)
        users = [m.content for m in s.transcript() if m.role is Role.USER]
        for row in rows:
            assert row.status is AdmissionStatus.TERMINAL and row.claims == 1
            count = users.count(row.text)
            assert count == 1 if row.outcome is Outcome.COMPLETED else count <= 1


def _swarm_story(s: Story, per_session: int, kill_after_s: float, delay_s: float) -> None:
    """Two sessions, three processes draining both; one is killed mid-way; the survivors
    recover, an operator reconciles, and everything left is drained."""
    for session in ("s-1", "s-2"):
        s.bind("alice", session=session)
        s.bind("olga", session=session, role="operator", kind="operator")
    s.use_provider(_provider(False))
    procs = [s.main_process(), s.process(), s.process()]
    s.delay_reply(1, delay_s)
    s.delay_reply(2, delay_s)
    for n in range(per_session):
        for i, session in enumerate(("s-1", "s-2")):
            s.start_submit(procs[(n + i) % 3], "alice", f"{session}-r{n}",
                           {"text": f"input {n} of {session}"}, session=session)
    for n in range(per_session):
        for session in ("s-1", "s-2"):
            s.start_drain(procs[n % 3], session, after_s=1.0, poll_s=3.0)
    s.kill(procs[1], after_s=kill_after_s)
    s.run_all()
    s.recover(procs[2])
    for session in ("s-1", "s-2"):  # every synchronous step before the next actors
        for row in s.admissions(session):
            if row.status is AdmissionStatus.UNKNOWN:
                s.reconcile("olga", row.admission_id, session=session)
    for session in ("s-1", "s-2"):
        for _ in range(per_session):
            s.start_drain(procs[2], session)
    s.run_all()


@settings(max_examples=MAX_EXAMPLES // 2, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.floats(0.0, 40.0), st.sampled_from((0.0, 5.0, 20.0)),
       st.integers(0, 2**16))
def test_a_killed_peer_loses_nothing_and_takes_no_live_admission(
        per_session: int, kill_after_s: float, delay_s: float, seed: int) -> None:
    """A peer killed at any time: only its own started admission goes unknown; all else ends."""
    with tempfile.TemporaryDirectory() as tmp:
        s = Story(store_kind="memory", workdir=Path(tmp), seed=seed, trace=False)
        _swarm_story(s, per_session, kill_after_s, delay_s)
        s.check()
        assert [str(v) for v in s.violations] == []
        record = s.world.store.snapshot()
        victim = s.world.holder_of(2)  # the first process started after the main one
        for row in record.admissions:
            assert row.status is AdmissionStatus.TERMINAL and row.claims <= 1
            owner = next(e for e in record.epochs if e.epoch == row.owner_epoch)
            if row.unknown_tick is not None:
                assert owner.holder == victim
