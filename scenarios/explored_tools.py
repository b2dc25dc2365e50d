"""Stories the explorer found in tool rounds that a pause, an interrupt, a full context, a
redaction or a held answer ended or delayed: each a shrunk seed (``hermes-ref explore
--shrink SEED``) on which a checker asked for what the engine may not do, red on the
checkers before their fix. The calls are the explorer's own (``sim.explore.run.stage``),
so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase, jump_clock
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


def _calm(s: Story) -> None:
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


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
