"""Stories the explorer found once the user could correct a turn at any moment of it (LOOP-4):
during a tool round, during the grace call, during a call that prepares a tool call. Each
was a checker reading the record too narrowly, red before its fix; the calls are the
explorer's own (``correct_at_a_moment``), the first and third from shrunk seeds
(``hermes-ref explore --shrink SEED``), the second written from its seed by hand.
"""

from __future__ import annotations

from scenarios._explored_common import calm as _calm
from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.harness import Story, scenario
from sim.interventions import correct_at_a_moment


def _world(s: Story, seed: int, *faults: ReplyFault,
           grace_outages: tuple[int, ...] = ()) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model and its notes files."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser, grace_outages=grace_outages)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    return model


@scenario("A correction taken in at the loop's bound leaves the user's word at the tail: a "
          "grace call that fails then ends the turn unanswered, not pending_tool_result "
          "(explored seed 162)", invariants=("FIN-8", "LOOP-4", "FIN-5"), stage="explore")
def correction_at_the_bound_then_no_grace_answer(s: Story) -> None:
    """``max_iterations`` 1: the turn's one call reads both notes, and the user corrects the
    turn while they are read. Leaving the loop at its bound, the turn takes the correction
    in (a hidden row for the work under way, then the user's row), and its grace call
    meets an outage with no route to fall back to. The turn ends ``max_iterations_reached``
    with its boundary row, which is right: FIN-8's pending_tool_result is for a turn whose
    tail is a tool result, and this one's tail is the user's word. FIN-8's checker looked
    only at the last budgeted reply (a landed tool round) and called the stop silent."""
    _world(s, 162, grace_outages=(1,))
    s.limits(max_iterations=1)
    s.bind("p-1", session="s-1")
    one = s.main_process()
    correct_at_a_moment(s, "Say hello 47 instead.", after_s=149.0, session="s-1",
                        during="tools", calls=1)
    s.start_submit(one, "p-1", "r-cab239", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=169.0)
    s.start_drain(one, "s-1", after_s=192.0)
    _calm(s)


@scenario("Two corrections sent during one tool round are taken in as one user row, which "
          "is no second opening of the turn (explored seed 622)",
          invariants=("CTX-8", "LOOP-4"), stage="explore")
def two_corrections_in_one_row(s: Story) -> None:
    """The turn reads a note and rewrites it in one round; the planner runs the two calls
    one after the other, and the user corrects the turn during each. The next iteration
    drains both and stores them as one user row, the two texts joined. CTX-8's checker
    excused a correction only when a row held exactly one, so it counted two user rows."""
    _world(s, 622)
    s.bind("p-1", session="s-1")
    one = s.main_process()
    correct_at_a_moment(s, "Say hello 49 instead.", after_s=0.0, session="s-1", during="tools")
    correct_at_a_moment(s, "Say hello 56 instead.", after_s=0.0, session="s-1", during="tools")
    s.start_submit(one, "p-1", "r-1", {"text": "Read notes-2.txt and rewrite it as note 70 "
                                               "at notes-2.txt."}, session="s-1", after_s=2.0)
    s.start_drain(one, "s-1", after_s=4.0)
    _calm(s)


@scenario("A reply the engine could not process, cut by a correction before it arrived, "
          "never reached the loop (explored seed 960)", invariants=("LOOP-5", "LOOP-4"),
          stage="explore")
def correction_cuts_an_unprocessable_reply(s: Story) -> None:
    """The user corrects the turn twice, each time while a slow call prepares a tool call:
    the first cut leaves a hidden row and the correction; the second call answers with
    arguments nested past the parser's limit, and the second correction cuts it before it
    arrived. The loop never got that reply, only the correction, which it takes in and
    answers. LOOP-5's checker took every reply in the world's log for one the loop
    received, so it said the local bug did not end the turn at once."""
    _world(s, 960, ReplyFault(call=2, kind=FaultKind.DEEP_ARGUMENTS))
    s.bind("p-1", session="s-1")
    one = s.main_process()
    correct_at_a_moment(s, "Say hello 84 instead.", after_s=52.0, session="s-1", during="call",
                        slow_s=30.0)
    s.start_submit(one, "p-1", "r-b0172fx", {"text": "Read notes-2.txt.", "role": "operator"},
                   session="s-1", after_s=88.0)
    s.start_drain(one, "s-1", after_s=99.0)
    correct_at_a_moment(s, "Say hello 80 instead.", after_s=103.0, session="s-1", during="call",
                        slow_s=5.0)
    _calm(s)


@scenario("A turn the user stops while an unprocessable reply is on its way ends interrupted "
          "(explored seed 3843)", invariants=("LOOP-5", "FIN-4"), stage="explore")
def interrupt_before_an_unprocessable_reply_arrives(s: Story) -> None:
    """The turn's call is slow to answer with arguments nested past the parser's limit, and
    the user stops the turn before the reply arrived. The turn ends interrupted, with no
    later call and no tool run; it never got the reply. LOOP-5's checker demanded
    local_processing_error of every turn whose last call the world logged as unprocessable,
    though the loop only ends that way on a reply it received."""
    _world(s, 3843, ReplyFault(call=1, kind=FaultKind.DEEP_ARGUMENTS))
    s.bind("p-1", session="s-1")
    one = s.main_process()
    correct_at_a_moment(s, "Say hello 92 instead.", after_s=0.0, session="s-1", during="call",
                        slow_s=90.0)
    s.start_submit(one, "p-1", "r-1", {"text": "Read notes-2.txt."}, session="s-1", after_s=2.0)
    s.start_drain(one, "s-1", after_s=4.0)
    s.interrupt(after_s=10.0, session="s-1")
    _calm(s)


@scenario("A model call the user's interrupt stops before it is sent costs no call and no "
          "budget unit (explored seed 2125)", invariants=("LOOP-1", "LOOP-2", "FIN-4"),
          stage="explore")
def interrupt_before_the_call_is_sent(s: Story) -> None:
    """A chore's first call is slow, and its process freezes for 200 s. Meanwhile the user
    corrects the turn, which cuts the call, then stops the turn. When the process wakes,
    the turn takes the correction in and goes on to its next call, which the interrupt
    stops before it is sent. The engine had counted that call and spent its budget unit
    already: the exit line said two calls and two units where the provider saw one
    request (LOOP-1, LOOP-2: a request never sent costs nothing). A call stopped before
    it went out is now given back, as a request preflight refused is."""
    _world(s, 2125)
    s.files({f"part-{k}.txt": f"part {k} of seed 2125: in order" for k in range(1, 10)})
    s.bind("p-2", session="s-2")
    s.main_process()  # the story's own process, idle: the turn runs on the second
    two = s.process()
    correct_at_a_moment(s, "Say hello 83 instead.", after_s=0.0, session="s-2", during="call",
                        slow_s=30.0)
    s.start_submit(two, "p-2", "r-4c066d", {"text": "Go through part-1.txt to part-9.txt in "
                                                    "order."}, session="s-2", after_s=9.0)
    s.start_drain(two, "s-2", after_s=23.0)
    s.stall(two, 200.0, after_s=30.0)
    s.interrupt(after_s=115.0, session="s-2")
    _calm(s)
