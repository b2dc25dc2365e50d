"""Stories the explorer found once its world drew the parts of ``sim.explore.edges``: each a
shrunk seed (``hermes-ref explore --shrink SEED``) on which a checker asked for what the
engine may not do, red on the checkers before their fix. The calls are the explorer's own
(``sim.explore.run.stage``), so each replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from scenarios._explored_common import calm as _calm
from sim.explore.edges import FlakySummarizer
from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.harness import Story, scenario


def _world(s: Story, seed: int, *faults: ReplyFault, parts: int = 0) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model, its notes and chore files."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)}
            | {f"part-{k}.txt": f"part {k} of seed {seed}: in order" for k in range(1, parts + 1)})
    return model


@scenario("A turn that comes back idle to a conversation too short to compact compacts "
          "nothing, and leaves no pass to see (explored seed 12)",
          invariants=("CTX-5",), stage="explore")
def idle_turn_on_a_short_conversation(s: Story) -> None:
    """A six-read chore, a write asked for, and the process stalls 900 s: the write's turn
    begins idle past 300 s, above the idle floor, but its eleven messages are fewer than
    the head, the tail floor and a group's slack hold. The engine's idle pass finds
    nothing to summarize and writes nothing; CTX-5's checker called that silence a missed
    compaction, and now excuses it as CMP-1's does."""
    _world(s, 12, ReplyFault(call=5, kind=FaultKind.RATE_LIMIT, seconds=1.0),
           ReplyFault(call=6, kind=FaultKind.RATE_LIMIT, seconds=20.0), parts=6)
    s.limits(context_window_tokens=600)
    s.limits(idle_compact_after_s=300.0)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-93e73f", {"text": "Go through part-1.txt to part-6.txt in order."},
                   session="s-1", after_s=2.0)
    s.start_drain(one, "s-1", after_s=10.0)
    s.start_submit(one, "p-1", "r-6181eb", {"text": "Write note 4 to s-1-out-4.txt."},
                   session="s-1", after_s=18.0)
    s.stall(one, 900.0, after_s=19.0)
    _calm(s)


@scenario("A failed summary cools down the process that saw it; the calm phase's new process "
          "starts without the cooldown (explored seed 118)",
          invariants=("CMP-4",), stage="explore")
def cooldown_is_the_processs_own(s: Story) -> None:
    """The first summary request fails; the process's session cache holds the cooldown.
    The calm phase restarts the world on a new process, whose cache starts without it
    (docs/compaction.md), and it compacts within 600 s of the failure. CMP-4's checker
    counted the failure against every later summary of the lineage; it now counts it
    against the same process's."""
    model = _world(s, 118)
    s.limits(context_window_tokens=320)
    model.summarizer = FlakySummarizer((1,), model)  # this summary request fails
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("q-1", session="s-1")
    one = s.main_process()
    for request, text, after in (
            ("r-b9e610", "Read notes-2.txt and rewrite it as note 70 at notes-2.txt.", 11.0),
            ("r-59b3fe", "Write note 3 to s-1-out-3.txt.", 17.0)):
        s.start_submit(one, "p-1", request, {"text": text}, session="s-1", after_s=after)
    s.start_drain(one, "s-1", after_s=23.0)
    s.start_drain(one, "s-1", after_s=41.0)
    s.start_submit(one, "p-1", "r-7d0005", {"text": "Read notes-2.txt."}, session="s-1", after_s=70.0)
    s.start_drain(one, "s-1", after_s=75.0)
    s.start_submit(one, "q-1", "r-7d0005", {"text": "Say hello 7d0005 from q-1."}, session="s-1",
                   after_s=79.0)
    s.start_submit(one, "p-1", "r-d70603", {"text": "Read notes-1.txt."}, session="s-1", after_s=82.0)
    s.start_drain(one, "s-1", after_s=86.0)
    _calm(s)


@scenario("An answer the verification gate holds when the budget leaves no request after it "
          "is the answer delivered (explored seed 50)",
          invariants=("FIN-1", "LOOP-3"), stage="explore")
def held_answer_at_the_budgets_end(s: Story) -> None:
    """A budget of two: the write round spends one unit, the answer the other, and the gate
    holds that answer back; no unit is left to ask the model to check, so the budget's end
    delivers it. The checkers knew a held answer only by the request after it and called
    the turn one that ran out without an answer or a grace call (FIN-1) and delivered an
    answer no grace summary gave (LOOP-3)."""
    _world(s, 50)
    s.limits(verify_before_answer=True)
    s.limits(iteration_budget=2)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-86119e", {"text": "Write note 6 to s-1-out-6.txt."},
                   session="s-1", after_s=79.0)
    _calm(s)


@scenario("A tool error in the last round a call cap allows, with the grace call off, ends "
          "the turn on its result: no call is left (explored seed 55)",
          invariants=("TOOL-6", "FIN-8"), stage="explore")
def tool_error_at_the_bound_without_grace(s: Story) -> None:
    """``max_iterations=2`` and no grace call: the chore's second call reads a file that is
    not there, and the loop may call the model no more. TOOL-6's checker asked for another
    model call after the error; it now excuses a turn stopped at its bound with the grace
    call off, and FIN-8 sees the stop explained (``pending_tool_result``)."""
    _world(s, 55, ReplyFault(call=1, kind=FaultKind.BAD_ARGUMENTS),
           ReplyFault(call=4, kind=FaultKind.TOOL_ERROR), parts=7)
    s.limits(max_iterations=2)
    s.limits(grace_call_enabled=False)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-e3b5e1", {"text": "Say hello 1."}, session="s-1", after_s=86.0)
    s.start_drain(one, "s-1", after_s=1004.0)
    s.start_submit(one, "p-1", "r-be8fb1", {"text": "Go through part-1.txt to part-7.txt in order."},
                   session="s-1", after_s=1025.0)
    s.start_drain(one, "s-1", after_s=1039.0)
    _calm(s)


@scenario("A dropped call at the end of the budget, with the grace call off, is not "
          "re-prompted: no unit is left (explored seed 129)",
          invariants=("LOOP-7", "FIN-8"), stage="explore")
def dropped_call_at_the_bound_without_grace(s: Story) -> None:
    """A budget of three: a read, then two replies that promise a call and carry none; the
    second comes on the last unit, so no re-prompt can be sent, and the turn stops on the
    read's result (FIN-8 renames the budget's end ``pending_tool_result``). LOOP-7's
    checker took that exit for a turn that chose not to re-prompt."""
    _world(s, 129, ReplyFault(call=2, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=3, kind=FaultKind.DROPPED_CALL))
    s.limits(iteration_budget=3, grace_call_enabled=False)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-bc38e1", {"text": "Read notes-2.txt."}, session="s-1", after_s=101.0)
    s.start_drain(one, "s-1", after_s=102.0)
    _calm(s)
