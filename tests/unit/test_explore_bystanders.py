"""The explored world's bystanders: a terminal beside the door, recovery rounds, chat clients."""

from __future__ import annotations

from sim.explore.plan import (
    Drain,
    FaultKind,
    FaultMix,
    Kill,
    ReplyFault,
    Submit,
    WorldPlan,
    generate,
)
from sim.explore.render import render
from sim.explore.run import Verdict, run_plan
from sim.explore.terminal import MEMORIES, SECRET, Direct, Redact
from sim.explore.watch import Client, Recover
from tests.unit.explore_replay import replay_rendered, same_timeline

# a drained turn dies mid-call and a survivor's round makes it unknown (its queue pauses);
# a terminal's turns contend for t-1's lease while one reads the slow build log, the
# pasted card number is redacted, and a client of t-1 drops and replays what it missed
BYSTANDERS = WorldPlan(
    seed=5, processes=2, sessions={"s-1": "p-1"}, files={"notes-1.txt": "one"},
    terminals=("t-1",), build_log_s=20.0, replies=(
        ReplyFault(call=1, kind=FaultKind.SLOW_REPLY, seconds=90.0),),
    clients=(Client(session="t-1", name="client-1", disconnect_after=2, away_for=2),),
    steps=(Submit(at_s=0.0, process=0, principal="p-1", session="s-1", request_id="r-1",
                  text="Read notes-1.txt."),
           Submit(at_s=0.5, process=0, principal="p-1", session="s-1", request_id="r-2",
                  text="Say hello 2."),
           Drain(at_s=1.0, process=1, session="s-1"),
           Kill(at_s=5.0, process=1),
           Recover(at_s=10.0, process=0),
           Drain(at_s=12.0, process=0, session="s-1"),
           Direct(at_s=20.0, process=0, session="t-1", text=f"Say hello 1. {SECRET}",
                  memory=MEMORIES[0]),
           Direct(at_s=20.5, process=0, session="t-1", text="Read t-1-build.log.",
                  memory=MEMORIES[1]),
           Redact(at_s=21.0, session="t-1", secret=SECRET),
           Direct(at_s=22.0, process=0, session="t-1", text="Say hello 3.")))


def test_the_bystanders_take_their_paths_and_hold() -> None:
    """The intact engine holds: the queue paused on the unknown admission, the waiting
    terminal turn ran once the log was read, the redaction waited for the lease, and the
    client came back with a replay."""
    report = run_plan(BYSTANDERS)
    assert report.verdict is Verdict.PASSED, report.violations
    assert FaultKind.DISCONNECT in report.fired
    for line in ("pid=1 looks for dead peers", "unknown", "paused", "t-1 busy",
                 "a turn holds the lease, asks again", "rewrite  #", "client-1 reconnects"):
        assert line in report.timeline, line


def test_a_short_lease_wait_refuses_and_hands_the_message_back() -> None:
    """With a 3 s wait, the turn that finds the log being read is refused, not lost."""
    plan = BYSTANDERS.model_copy(update={"lease_wait_s": 3.0})
    report = run_plan(plan)
    assert report.verdict is Verdict.PASSED, report.violations
    assert "session_turn_lease_timeout" in report.timeline


def test_the_bystanders_render_as_story_calls_and_replay() -> None:
    """Terminal turns, the redaction, the recovery round and the client render as Story
    calls, and the scenario replays the run."""
    report = run_plan(BYSTANDERS)
    source = render(BYSTANDERS, report)
    for call in ("s.start_turn('Read t-1-build.log.', session='t-1', process=one",
                 "redact_later(s, 'My card is", "recover_later(s, one, after_s=10.0)",
                 "SimClient.join(s.world, 't-1', name='client-1', disconnect_after=2",
                 "s.world.tools.slow('read_file', 20.0, path='t-1-build.log')"):
        assert call in source, call
    outcome = replay_rendered(BYSTANDERS, report, source)
    assert same_timeline(outcome, report)


def test_the_bystanders_have_streams_of_their_own() -> None:
    """Without the disconnect fault a plan draws the same steps and the same clients,
    who then never drop; the terminal, rounds and clients come in some worlds of 40."""
    calm = FaultMix(kinds=FaultMix().kinds - {FaultKind.DISCONNECT})
    plans = [(generate(seed), generate(seed, calm)) for seed in range(40)]
    for every, fewer in plans:
        assert every.steps == fewer.steps
        assert [c.session for c in every.clients] == [c.session for c in fewer.clients]
        assert not any(c.disconnect_after for c in fewer.clients)
    assert any(p.terminals for p, _ in plans) and any(p.clients for p, _ in plans)
    assert any(any(s.op == "recover" for s in p.steps) for p, _ in plans)
    assert any(p.lease_wait_s for p, _ in plans)


def _followed(*steps: object, replies: tuple[ReplyFault, ...] = (),
              client: Client | None = None) -> WorldPlan:
    """A one-process world whose terminal session t-1 a client follows."""
    return WorldPlan(seed=3, processes=1, sessions={"s-1": "p-1"}, terminals=("t-1",),
                     replies=replies, steps=steps,  # type: ignore[arg-type]
                     clients=(client or Client(session="t-1", name="client-1"),))


def test_a_client_away_for_a_whole_turn_replays_it_from_its_first_event() -> None:
    """The second turn commits all its events while the client is away: on its return the
    client replays that turn too, so it has every durable event, without a gap."""
    plan = _followed(Direct(at_s=0.0, process=0, session="t-1", text="Say hello 1."),
                     Direct(at_s=5.0, process=0, session="t-1", text="Say hello 2."),
                     Direct(at_s=9.0, process=0, session="t-1", text="Say hello 3."),
                     client=Client(session="t-1", name="client-1", disconnect_after=1,
                                   away_for=12))
    report = run_plan(plan)
    assert report.verdict is Verdict.PASSED, report.violations
    assert "client-1 reconnects" in report.timeline


def test_a_client_is_shown_a_slow_answer_with_its_think_block_folded() -> None:
    """A slow reply thinks aloud inline; the client's text, read as a client renders it,
    is the stored answer."""
    plan = _followed(Direct(at_s=0.0, process=0, session="t-1", text="Say hello 1."),
                     replies=(ReplyFault(call=1, kind=FaultKind.SLOW_REPLY, seconds=5.0),))
    report = run_plan(plan)
    assert report.verdict is Verdict.PASSED, report.violations
    assert "<think>" in report.timeline


def test_a_client_of_a_session_whose_only_turn_died_unstarted_is_not_silent() -> None:
    """The only turn of the followed session dies before its first commit: there is
    nothing durable to hand out, and the client handed nothing is right."""
    plan = _followed(Direct(at_s=2.0, process=0, session="t-1", text="Say hello 1."),
                     Kill(at_s=1.0, process=0))
    report = run_plan(plan)
    assert report.verdict is Verdict.PASSED, report.violations
