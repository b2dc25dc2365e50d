"""Stories the explorer found in tool rounds that a pause, an interrupt, a full context, a
redaction or a held answer ended or delayed: each a shrunk seed (``hermes-ref explore
--shrink SEED``) on which a checker asked for what the engine may not do, red on the
checkers before their fix. The calls are the explorer's own (``sim.explore.run.stage``),
so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from scenarios._explored_common import calm as _calm
from sim.explore.edges import FlakySummarizer
from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import jump_clock
from sim.explore.terminal import redact_later
from sim.harness import Story, scenario


def _world(s: Story, seed: int, *faults: ReplyFault) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model and its notes files."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    return model


def _member(s: Story, principal: str, session: str) -> None:
    s.bind(principal, session=session)
    s.bind(f"op-{session}", session=session, role="operator", kind="operator")


# ---- TOOL-5: a frozen process keeps no gate --------------------------------------------------


@scenario("A process that stalls while a read waits at the start gate lets it pass as it "
          "wakes, past the gate's 120 s (explored seed 245)",
          invariants=("TOOL-5",), stage="explore")
def start_gate_waits_out_a_stall(s: Story) -> None:
    """Two reads side by side; notes-1.txt may start only 300 s after its turn, so the read of
    notes-2.txt waits at the start gate. Its process stalls from 73 s to 273 s, over the
    instant (131 s) the gate expires, and passes the read the moment it wakes, 262 s after
    it was ready. A frozen process runs nothing, its gate included; TOOL-5's checker
    counted the stall as the engine's own wait, and now lets the gate's due time move to
    the end of a pause of the batch's process (its ledger entries name it)."""
    _world(s, 245)
    s.world.tools.slow("read_file", 1.0, path="notes-1.txt", start_delay_s=300.0)
    _member(s, "p-1", "s-1")
    one, two = s.main_process(), s.process()
    s.start_submit(one, "p-1", "r-63ad86", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=5.0)
    s.start_drain(two, "s-1", after_s=11.0)
    s.stall(two, 200.0, after_s=73.0)
    _calm(s)


@scenario("A clock jump while a read waits at the start gate lets it pass when the clock "
          "lands, past the gate's 120 s (explored seed 478)",
          invariants=("TOOL-5",), stage="explore")
def start_gate_waits_out_a_clock_jump(s: Story) -> None:
    """The same two reads; the clock leaps 60 s at 80 s, a pause of every live process, and
    the gate, due at 127 s, passes the read of notes-2.txt at 140 s, as the process comes
    back. TOOL-5's checker called that a wait of 133 s at a gate of 120 s."""
    _world(s, 478)
    s.world.tools.slow("read_file", 1.0, path="notes-1.txt", start_delay_s=300.0)
    _member(s, "p-1", "s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-b5bc77", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=7.0)
    jump_clock(s, 60.0, after_s=80.0)
    _calm(s)


# ---- TOOL-3: a redaction is no turn -----------------------------------------------------------


@scenario("A redaction under the lease of a session whose turn died mid-round leaves the "
          "dead turn's call open for the next turn (explored seed 319)",
          invariants=("TOOL-3", "WIRE-2"), stage="explore")
def redaction_after_a_dead_turns_open_call(s: Story) -> None:
    """A terminal session: the first turn pastes a card number, the second calls read_file
    and its process is killed before the result. The operator's redaction takes the
    session's lease from the dead holder, rewrites the row and releases the lease; nobody
    runs another turn of the session, so the call stays open for the next turn's prologue
    to close. TOOL-3's checker took the released redaction's grant for a turn at rest that
    should have closed it; it now reads the grants of the turn that opened the calls."""
    _world(s, 319, ReplyFault(call=2, kind=FaultKind.EMPTY_REPLY),
           ReplyFault(call=5, kind=FaultKind.RATE_LIMIT, seconds=20.0))
    s.files({"t-1-build.log": "build of t-1: ok"})
    _member(s, "p-2", "s-2")
    one, two = s.main_process(), s.process()
    jump_clock(s, 400.0, after_s=34.7)
    s.start_turn("Say hello 1. My card is 4417 2210 9932 0071.", session="t-1", process=two,
                 after_s=40.4,
                 injected="memory: the user signs notes as Ana and works from the Lisbon office")
    s.start_turn("Read t-1-build.log.", session="t-1", process=two, after_s=49.0,
                 injected="memory: the build log is long; the user wants only its last line")
    redact_later(s, "My card is 4417 2210 9932 0071.", after_s=49.6, session="t-1")
    s.kill(two, after_s=137.6)
    s.start_submit(one, "p-2", "r-9da867", {"text": "Read notes-1.txt."}, session="s-2",
                   after_s=374.8)
    s.start_drain(one, "s-2", after_s=387.9)
    _calm(s)


# ---- TOOL-6: what else ends a turn after a tool error -----------------------------------------


@scenario("A tool error whose turn the user interrupts mid-call is ended by the interrupt "
          "(explored seed 997)",
          invariants=("TOOL-6", "FIN-4"), stage="explore")
def interrupt_during_a_failing_read(s: Story) -> None:
    """A clock jump of an hour brings the turn and the user's interrupt to one instant:
    the read of a missing file runs, and the interrupt stops the turn before its result
    comes back, so the call is closed as unknown (FIN-4) and no model call follows. TOOL-6's
    checker called that a turn the tool error ended; it now spares a turn the user or a
    lost lease stopped."""
    _world(s, 997, ReplyFault(call=1, kind=FaultKind.TOOL_ERROR))
    _member(s, "p-1", "s-1")
    one = s.main_process()
    jump_clock(s, 3600.0, after_s=11.3)
    s.start_submit(one, "p-1", "r-f4488c", {"text": "Say hello 3."}, session="s-1", after_s=12.4)
    s.start_drain(one, "s-1", after_s=30.1)
    s.interrupt(after_s=30.3, session="s-1")
    _calm(s)


@scenario("A tool error whose result fills a small window, with the summary in its cooldown, "
          "ends the turn at preflight (explored seed 501)",
          invariants=("TOOL-6", "CMP-7"), stage="explore")
def tool_error_then_a_full_window(s: Story) -> None:
    """A window of 250 tokens: the fourth turn reads a missing file twice; the summary request
    after the first fails, so compaction cools down, and after the second error the next
    request does not fit. Preflight fails closed (``context_compression_exhausted``, CMP-7)
    and no model call follows. TOOL-6's checker called that a turn the tool error ended; it
    now spares a turn preflight refused to go on."""
    model = _world(s, 501, ReplyFault(call=2, kind=FaultKind.RUN_CODE),
                   ReplyFault(call=3, kind=FaultKind.UNKNOWN_TOOL),
                   ReplyFault(call=6, kind=FaultKind.SERVER_ERROR),
                   ReplyFault(call=7, kind=FaultKind.TOOL_ERROR),
                   ReplyFault(call=8, kind=FaultKind.TOOL_ERROR))
    s.limits(context_window_tokens=250)
    model.summarizer = FlakySummarizer((1,), model)  # this summary request fails
    _member(s, "p-1", "s-1")
    one = s.main_process()
    for request, text, after in (("r-7ccebc", "Say hello 5.", 40.0), ("r-9f0a4c", "Say hello 4.", 65.0),
                                 ("r-b31ccb", "Say hello 3.", 79.0)):
        s.start_submit(one, "p-1", request, {"text": text}, session="s-1", after_s=after)
    s.start_drain(one, "s-1", after_s=84.0)
    s.start_drain(one, "s-1", after_s=98.0)
    s.start_submit(one, "p-1", "r-d00ab6", {"text": "Say hello 1."}, session="s-1", after_s=102.0)
    s.start_drain(one, "s-1", after_s=104.0)
    s.start_drain(one, "s-1", after_s=113.0)
    _calm(s)


@scenario("A tool error in the round that spends the last unit, after the verification gate "
          "held the answer, ends the turn on the held answer (explored seed 870)",
          invariants=("TOOL-6", "FIN-1"), stage="explore")
def tool_error_after_the_held_answer(s: Story) -> None:
    """A budget of three and the verification gate: the write spends one unit, its answer a
    second, and the gate holds it back; asked to check its work, the model reads a file that
    is not there with the last unit. No unit is left, and FIN-1 delivers the held answer
    instead of a grace call. TOOL-6's checker, which knew only a grace call switched off
    or too long for its window, asked for another model call after the error."""
    _world(s, 870, ReplyFault(call=3, kind=FaultKind.TOOL_ERROR))
    s.limits(verify_before_answer=True)
    s.limits(iteration_budget=3)
    _member(s, "p-1", "s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-10b4df", {"text": "Write note 4 to s-1-out-4.txt."},
                   session="s-1", after_s=52.0)
    s.start_drain(one, "s-1", after_s=96.0)
    _calm(s)


# ---- FIN-1, FIN-8: the held answer carries TOOL-9's note -------------------------------------


@scenario("An answer the verification gate held is delivered at the budget's end with the "
          "note of the write that did not apply (explored seed 870)",
          invariants=("FIN-1", "FIN-8", "TOOL-6", "TOOL-9"), stage="explore")
def held_answer_with_the_failed_write_note(s: Story) -> None:
    """A budget of three and the verification gate: the write spends one unit, its answer a
    second, and the gate holds it back; asked to check its work, the model writes under a
    file as if it were a folder with the last unit (refused, TOOL-9). The budget's end
    delivers the held answer, and TOOL-9 adds the note of the write that did not apply.
    FIN-1's and FIN-8's checkers knew the held answer only as the very text, and called
    the noted one an answer no gate held and a turn that stopped silently on a tool
    result; TOOL-6's asked for a model call after the refused write."""
    _world(s, 870, ReplyFault(call=3, kind=FaultKind.REFUSED_WRITE))
    s.limits(verify_before_answer=True)
    s.limits(iteration_budget=3)
    _member(s, "p-1", "s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-10b4df", {"text": "Write note 4 to s-1-out-4.txt."},
                   session="s-1", after_s=52.0)
    s.start_drain(one, "s-1", after_s=96.0)
    _calm(s)
