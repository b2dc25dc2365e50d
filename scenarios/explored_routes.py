"""Stories the explorer found where a checker misread a turn whose session had rotated: each
a shrunk seed (``hermes-ref explore --shrink SEED``), red on the checkers before their fix.
The calls are the explorer's own (``sim.explore.run.stage``), so each replays the run it
came from, then the calm phase.
"""

from __future__ import annotations

from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase
from sim.harness import Story, scenario


@scenario("A write that fails in a rotated child session is reported by its turn's answer, "
          "and that report is the turn's own (explored seed 4600)",
          invariants=("TOOL-9",), stage="explore")
def failed_write_after_a_rotation_is_the_turns_own(s: Story) -> None:
    """A chore over a 500-token window rotates s-1 into a child; the next turn's write to
    notes-1.txt/draft.txt fails (a parent is a file), and its answer ends with the footer
    naming that write, as TOOL-9 asks. The checker filed the failed write under the child
    session the call row is in, while the turn is keyed by its lineage root, so it found
    no failed write for the turn and called the footer a report of writes that did not
    fail. It now files each write under the lineage root."""
    s.seed = 4600  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    faults = (ReplyFault(call=5, kind=FaultKind.BAD_ARGUMENTS),
              ReplyFault(call=6, kind=FaultKind.BAD_ARGUMENTS),
              ReplyFault(call=7, kind=FaultKind.EMPTY_REPLY),
              ReplyFault(call=8, kind=FaultKind.BAD_ARGUMENTS),
              ReplyFault(call=9, kind=FaultKind.SERVER_ERROR),
              ReplyFault(call=11, kind=FaultKind.DROPPED_CALL),
              ReplyFault(call=13, kind=FaultKind.UNKNOWN_TOOL),
              ReplyFault(call=19, kind=FaultKind.DROPPED_CALL),
              ReplyFault(call=28, kind=FaultKind.REFUSED_WRITE))
    s.use_provider(ExploreModel(faults, ids=s.world.chooser))
    s.files({f"notes-{k}.txt": f"note {k} of seed 4600" for k in (1, 2)}
            | {f"part-{k}.txt": f"part {k} of seed 4600: in order" for k in range(1, 10)})
    s.limits(context_window_tokens=500)
    for n in (1, 2):
        s.bind(f"p-{n}", session=f"s-{n}")
        s.bind(f"op-s-{n}", session=f"s-{n}", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-606728", {"text": "Read notes-2.txt."}, session="s-2", after_s=5.0)
    s.start_submit(one, "p-1", "r-d2cde1", {"text": "Go through part-1.txt to part-9.txt in order."},
                   session="s-1", after_s=13.0)
    s.start_drain(one, "s-2", after_s=14.0)
    s.start_submit(one, "p-1", "r-ac07e4", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=15.0)
    s.start_drain(one, "s-1", after_s=25.0)
    s.start_drain(one, "s-1", after_s=27.0)
    s.start_submit(one, "p-1", "r-ac07e4x", {"text": "Read notes-1.txt and notes-2.txt.", "role": "operator"},
                   session="s-1", after_s=27.0)
    s.start_submit(one, "p-2", "r-6a40b0", {"text": "Write note 2 to s-2-out-2.txt."},
                   session="s-2", after_s=41.0)
    s.start_submit(one, "p-1", "r-78a38c", {"text": "Write note 1 to s-1-out-1.txt."},
                   session="s-1", after_s=53.0)
    s.start_drain(one, "s-2", after_s=64.0)
    s.start_drain(one, "s-1", after_s=80.0)
    s.start_drain(one, "s-1", after_s=189.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A narrated call at the end of the budget is no answer for the gate to hold back: "
          "the turn stops on its tool result (explored seed 4461)",
          invariants=("FIN-1", "LOOP-7", "FIN-8"), stage="explore")
def narrated_call_at_the_budget_is_no_held_answer(s: Story) -> None:
    """With the verification gate on, a budget of 2 and no grace call, a turn reads
    notes-2.txt and rewrites it, then its second call says 'Let me read notes-1.txt now.'
    with finish_reason tool_calls and no call. That is a dropped call with re-prompts
    left (LOOP-7): the engine re-prompts, the budget is spent, and the turn stops on its
    tool result (FIN-8). The checker took the narration for an answer the gate held
    back at the budget's end and wanted it delivered (FIN-1); it now leaves out a
    dropped call whose re-prompt was due, as the engine's reading of an answer does."""
    s.seed = 4461  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    s.use_provider(ExploreModel((ReplyFault(call=5, kind=FaultKind.NARRATED_CALL),), ids=s.world.chooser))
    s.files({f"notes-{k}.txt": f"note {k} of seed 4461" for k in (1, 2)})
    s.limits(verify_before_answer=True)
    s.limits(iteration_budget=2, grace_call_enabled=False)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-cd554d",
                   {"text": "Read notes-2.txt and rewrite it as note 71 at link-notes-2.txt."},
                   session="s-1", after_s=7.0)
    s.start_submit(one, "p-1", "r-65f90c", {"text": "Say hello 1."}, session="s-1", after_s=17.0)
    s.start_submit(one, "p-1", "r-bfbf47",
                   {"text": "Read notes-2.txt and rewrite it as note 70 at ./notes-2.txt."},
                   session="s-1", after_s=22.0)
    s.start_drain(one, "s-1", after_s=27.0)
    s.start_drain(one, "s-1", after_s=36.0)
    s.start_drain(one, "s-1", after_s=36.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")
