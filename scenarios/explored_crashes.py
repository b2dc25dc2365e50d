"""Stories the explorer found on the intact engine where the run stopped with a store's
fencing error, or a checker refused what the spec allows: each a shrunk seed
(``hermes-ref explore --shrink SEED``), red before its fix. The calls are the explorer's
own (``sim.explore.run.stage``), so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from scenarios._explored_common import calm as _calm
from sim.explore.model import ExploreModel
from sim.explore.plan import BIG_LOG_TEXT, FaultKind, ReplyFault
from sim.explore.run import jump_clock
from sim.explore.terminal import SECRET, redact_later
from sim.harness import Story, scenario

NOTES = {"memory": "memory: last week the user asked for every change to be written to its own file",
         "log": "memory: the build log is long; the user wants only its last line",
         "ana": "memory: the user signs notes as Ana and works from the Lisbon office"}


def _world(s: Story, seed: int, *faults: ReplyFault, parts: int = 0) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model, its notes and chore files."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)}
            | {f"part-{k}.txt": f"part {k} of seed {seed}: in order" for k in range(1, parts + 1)})
    return model


def _door(s: Story, session: str) -> None:
    s.bind(f"p-{session[-1]}", session=session)
    s.bind(f"op-{session}", session=session, role="operator", kind="operator")


@scenario("An operator redacts a card number from a terminal session that compaction has "
          "rotated away: the redaction lands in the lineage's tip (explored seed 1308)",
          invariants=("WIRE-2", "CMP-5", "CMP-2"), stage="explore")
def redaction_of_a_rotated_session(s: Story) -> None:
    """The fourth terminal turn pastes a card number; its preflight rotates ``t-1`` twice,
    so the live conversation, the row with the card among it, is in the tip. The
    operator's tool took the lease of ``t-1`` (the store grants the tip's, CMP-5), then
    rewrote the row of the ended parent with the tip's token, and the store's fence
    raised LeaseLost out of the world: the run stopped as an engine crash, though no turn
    wrote. The tool now redacts the tip's row, the one the next turn sends."""
    _world(s, 1308)
    s.limits(context_window_tokens=320)
    s.files({"t-1-build.log": "build of t-1: ok"})
    _door(s, "s-1")
    one = s.main_process()
    s.start_turn("Read notes-2.txt.", session="t-1", process=one, after_s=10.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=11.0,
                 injected=NOTES["memory"])
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=16.0,
                 injected=NOTES["log"])
    s.start_turn(f"Say hello 4. {SECRET}", session="t-1", process=one, after_s=21.0,
                 injected=NOTES["memory"])
    s.start_turn("Write note 5 to t-1-out-5.txt.", session="t-1", process=one, after_s=25.0,
                 injected=NOTES["memory"])
    redact_later(s, SECRET, after_s=32.0, session="t-1")
    s.start_submit(one, "p-1", "r-cd1072", {"text": "Say hello 1."}, session="s-1", after_s=34.0)
    _calm(s)


@scenario("A row redacted after the compaction that copied it is judged as the compaction "
          "wrote it, and later turns of the lineage must send its new text (explored seed 2186)",
          invariants=("WIRE-2", "CMP-2"), stage="explore")
def redaction_after_a_compaction(s: Story) -> None:
    """The card's turn rotates ``t-1``, keeping its row in the child's tail; the operator
    then redacts that row in the tip. CMP-2's checker read the tail as the record holds it
    now and found it changed by the compaction; it now judges each row as it was when the
    compaction ran (``RewriteRun.was``). WIRE-2's checker looked for the later turns under
    the tip's id, while a turn is run under the id it was asked for: it now follows the
    lineage, so the last turn must still send the redacted text."""
    _world(s, 2186)
    s.limits(context_window_tokens=320)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 20.0, path="t-1-build.log")
    _door(s, "s-2")
    one = s.main_process()
    s.start_turn("Say hello 1.", session="t-1", process=one, after_s=13.0, injected=NOTES["log"])
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=22.0,
                 injected=NOTES["memory"])
    s.start_turn("Read notes-2.txt.", session="t-1", process=one, after_s=26.0,
                 injected=NOTES["log"])
    s.start_turn(f"Say hello 4. {SECRET}", session="t-1", process=one, after_s=32.0)
    s.start_turn("Write note 5 to t-1-out-5.txt.", session="t-1", process=one, after_s=40.0,
                 injected=NOTES["ana"])
    redact_later(s, SECRET, after_s=41.0, session="t-1")
    s.start_turn("Write note 6 to t-1-out-6.txt.", session="t-1", process=one, after_s=41.0,
                 injected=NOTES["memory"])
    s.start_drain(one, "s-2", after_s=66.0)
    _calm(s)


@scenario("A turn refused a dead holder's lease because a living waiter was first in line, "
          "killed right after, is not blocked by the dead (explored seed 2897)",
          invariants=("LEASE-3",), stage="explore")
def waiter_ahead_dies_after_the_ask(s: Story) -> None:
    """A clock jump brings every step to one instant: pid 3's turn takes ``t-1``, pid 1's
    first turn asks and waits in line, pid 3 is killed, pid 1's second turn asks and is
    refused, since the first is ahead of it in line (the store keeps a place for two
    polls); then pid 1 is killed too, so the waiter never asks again. LEASE-3's checker
    took "asks again later" as the only sign of a waiter still in line and called the
    refusal a dead holder blocking the lease; it now also counts a waiter whose place had
    not lapsed, who had not left the line and whose process was still alive at the ask."""
    _world(s, 2897, parts=8)
    s.files({"t-1-build.log": "build of t-1: ok"})
    _door(s, "s-1")
    one, _, three = s.main_process(), s.process(), s.process()
    jump_clock(s, 400.0, after_s=2.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=three, after_s=16.0,
                 injected=NOTES["memory"])
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=19.0,
                 injected=NOTES["memory"])
    s.kill(three, after_s=25.0)
    s.start_turn(f"Say hello 4. {SECRET}", session="t-1", process=one, after_s=25.0,
                 injected=NOTES["log"])
    s.kill(one, after_s=58.0)
    s.start_turn("Say hello 5.", session="t-1", process=s.process(), after_s=70.0)
    _calm(s)  # the last turn ends: its ending must be on record


@scenario("A huge read whose process dies before its result is stored leaves a recovered "
          "'unknown' result, which names no spill file (explored seed 1594)",
          invariants=("TOOL-7", "TOOL-10"), stage="explore")
def huge_read_cut_by_a_crash(s: Story) -> None:
    """The model reads the 120,000-character log; the tool spills the output, and the
    process dies right after the tools ran, before the round's results were written. The
    new process's recovery closes the call with the 'unknown' result (TOOL-10): the model
    never saw the output. TOOL-7's checker demanded that this row name the spill file;
    it now judges only a result the engine stored, not a closure row written in its place."""
    _world(s, 1594, ReplyFault(call=4, kind=FaultKind.HUGE_READ))
    s.files({"big.log": BIG_LOG_TEXT})  # a log of 120,000 characters
    _door(s, "s-1")
    one = s.main_process()
    s.faults(crash="after:tools#2", crash_at_effect=None, fail_writes={})
    for request, text, after in (("r-948f41", "Read notes-1.txt and notes-2.txt.", 67.0),
                                 ("r-7c32df", "Say hello 2.", 82.0),
                                 ("r-e8de13", "Say hello 4.", 83.0)):
        s.start_submit(one, "p-1", request, {"text": text}, session="s-1", after_s=after)
    s.start_drain(one, "s-1", after_s=87.0)
    s.start_drain(one, "s-1", after_s=91.0)
    s.start_submit(one, "p-1", "r-43cebe", {"text": "Say hello 54."}, session="s-1", after_s=154.0)
    s.start_drain(one, "s-1", after_s=180.0)
    _calm(s)
