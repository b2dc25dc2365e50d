"""Stories the explorer found in compacting worlds, second lot: each a shrunk seed
(``hermes-ref explore --shrink SEED``) red before its fix, on the engine or on a checker,
as each story says. The calls are the explorer's own (``sim.explore.run.stage``), so each
replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from sim.explore.edges import FlakySummarizer
from sim.explore.lanes import LaneWorld
from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.terminal import redact_later
from sim.harness import Story, scenario


def _world(s: Story, seed: int, *faults: ReplyFault, parts: int = 0) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model, its notes and part files."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel(faults, ids=s.world.chooser)
    s.use_provider(model)
    files = {f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)}
    files.update({f"part-{k}.txt": f"part {k} of seed {seed}: in order" for k in range(1, parts + 1)})
    s.files(files)
    return model


def _member(s: Story, *sessions: str) -> None:
    """The door's member ``p-N`` and operator of each session ``s-N``."""
    for session in sessions:
        s.bind(f"p-{session[2:]}", session=session)
        s.bind(f"op-{session}", session=session, role="operator", kind="operator")


@scenario("A dropped call's scaffolding at the start of a turn takes no place in the protected "
          "head (explored seed 1535)", invariants=("CMP-2",), stage="explore")
def scaffolding_takes_no_place_in_the_head(s: Story) -> None:
    """A chore's first reply drops its call, so the turn's working list opens with its user
    row, then the refused reply and the re-prompt, both scaffolding that is never stored.
    Six reads later the 400-token window fills and a pass summarizes the middle. The engine
    counted the head's three protected messages in the working list, scaffolding included,
    so the stored head it kept was the user row alone and the first read's call and result
    went into the summary (CMP-2: the head is protected). The head now counts the
    conversation's messages, as the tail's floor already did, and keeps the scaffolding
    among them as it was."""
    _world(s, 1535, ReplyFault(call=1, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=3, kind=FaultKind.TOOL_ERROR),
           ReplyFault(call=4, kind=FaultKind.TOOL_ERROR), parts=6)
    s.limits(context_window_tokens=400)
    _member(s, "s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-92f46c", {"text": "Go through part-1.txt to part-6.txt in order."},
                   session="s-1", after_s=2.0)
    s.start_drain(one, "s-1", after_s=21.0)
    _calm(s)


@scenario("An idle compaction summarizes though pruning alone would have brought the request "
          "under the threshold (explored seed 2169)", invariants=("CMP-2", "CTX-5"), stage="explore")
def an_idle_compaction_summarizes(s: Story) -> None:
    """A 320-token window with idle compaction after 300 s: the session's fourth turn comes
    317 s after its third, over the idle floor, and its request of 277 tokens is just over
    the threshold of 272. Pruning the one long tool output (an unknown tool's error) would
    have brought it to 254, and the idle pass summarized anyway, as it should: an idle
    compaction compacts the conversation down to the tail's budget (CTX-5), not only under
    the threshold. CMP-2's checker demanded that every pass over the threshold stop after
    pruning when that was enough, excusing only manual compactions and overflows; it now
    excuses the turn's idle pass too."""
    _world(s, 2169, ReplyFault(call=2, kind=FaultKind.UNKNOWN_TOOL))
    s.world.tools.slow("read_file", 1.0, path="notes-1.txt", start_delay_s=300.0)
    s.limits(context_window_tokens=320)
    s.limits(idle_compact_after_s=300.0)
    _member(s, "s-1", "s-3")
    s.bind("q-3", session="s-3")
    one = s.main_process()
    s.start_submit(one, "p-3", "r-224e1d", {"text": "Write note 3 to s-3-out-3.txt."},
                   session="s-3", after_s=4.0)
    s.start_drain(one, "s-3", after_s=25.0)
    s.start_submit(one, "q-3", "r-c79a1e", {"text": "Say hello c79a1e from q-3."},
                   session="s-3", after_s=33.0)
    s.start_drain(one, "s-3", after_s=37.0)
    s.start_submit(one, "p-3", "r-b2643a", {"text": "Write note 1 to s-3-out-1.txt."},
                   session="s-3", after_s=68.0)
    s.start_drain(one, "s-3", after_s=76.0)
    s.start_submit(one, "q-3", "r-b2643a", {"text": "Say hello b2643a from q-3."},
                   session="s-3", after_s=76.0)
    s.start_submit(one, "p-1", "r-c79a1e", {"text": "Read notes-1.txt."}, session="s-1", after_s=92.0)
    _calm(s)


@scenario("A turn that waited in line for the session's lease keeps the cooldown the turn "
          "ahead of it started (explored seed 2256)", invariants=("CMP-4",), stage="explore")
def a_waiting_turn_keeps_the_cooldown(s: Story) -> None:
    """Two terminal turns wait on process 2 for the session's lease while process 1's turn
    holds it through a slow batch. The first of them to get it finds the session over the
    threshold, and its summary request fails: the cooldown starts, in the session cache of
    process 2. The second, whose cache had been built before its wait (the engine had not
    served the session yet), went on with that fresh cache, no cooldown in it, and asked
    for a summary 0 s after the failed one (CMP-4). After a wait the turn now goes on with
    the cache its engine holds for the session by then."""
    model = _world(s, 2256, ReplyFault(call=6, kind=FaultKind.WIDE_BATCH))
    s.world.tools.slow("read_file", 1.0, path="notes-2.txt", start_delay_s=300.0)
    s.limits(context_window_tokens=500)
    s.files({"t-1-build.log": "build of t-1: ok"})
    model.summarizer = FlakySummarizer((2,), model)  # these summary requests fail
    _member(s, "s-1")
    one, two = s.main_process(), s.process()
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=15.0,
                 injected="memory: the user signs notes as Ana and works from the Lisbon office")
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=16.0)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=31.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=two, after_s=40.0)
    s.start_turn("Say hello 9.", session="t-1", process=two, after_s=53.0)
    _calm(s)


@scenario("Two ineffective passes block idle compaction too (explored seed 2989)",
          invariants=("CMP-4", "CTX-5"), stage="explore")
def ineffective_passes_block_idle_compaction(s: Story) -> None:
    """A 400-token window with idle compaction after 300 s. A wide batch fills the session;
    the next two preflights find the request over the threshold with no middle to
    summarize, two ineffective passes, which block automatic compaction (CMP-4). Eighteen
    minutes later a turn comes after the idle gap, and the engine ran the idle compaction
    anyway: its predicate looked only at the cooldown. An idle compaction is automatic, so
    it now honours the anti-thrash block as well."""
    _world(s, 2989, ReplyFault(call=1, kind=FaultKind.WIDE_BATCH))
    s.limits(context_window_tokens=400)
    s.limits(idle_compact_after_s=300.0)
    _member(s, "s-2")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-0932bd", {"text": "Write note 6 to s-2-out-6.txt."},
                   session="s-2", after_s=46.0)
    s.start_submit(one, "p-2", "r-36fa6d", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-2", after_s=50.0)
    s.start_drain(one, "s-2", after_s=50.0)
    s.start_drain(one, "s-2", after_s=51.0)
    s.start_submit(one, "p-2", "r-00a157", {"text": "Read notes-1.txt."}, session="s-2", after_s=76.0)
    s.start_drain(one, "s-2", after_s=93.0)
    s.start_submit(one, "p-2", "r-2a7e11", {"text": "Say hello 40."}, session="s-2", after_s=1154.0)
    s.start_drain(one, "s-2", after_s=1170.0)
    _calm(s)


@scenario("A dropped call's re-prompt is not taken for the turn's own message when compaction "
          "re-locates it (explored seed 2545)", invariants=("CMP-5", "CTX-7"), stage="explore")
def a_reprompt_is_not_the_users_message(s: Story) -> None:
    """A lane's second message, hours after its first, reads a missing file, has its next
    call dropped (the refused reply and the re-prompt ride in the working list as
    scaffolding) and then a wide batch fills the 400-token window. The pass re-located the
    turn's own message by the last user message of the turn, and that was the re-prompt, a
    user message of the turn's but scaffolding: it kept the re-prompt after the summary and
    summarized the user's row (CTX-7, CMP-5: the last user input lost). The re-location now
    skips scaffolding."""
    _world(s, 2545, ReplyFault(call=5, kind=FaultKind.RATE_LIMIT, seconds=20.0),
           ReplyFault(call=10, kind=FaultKind.TOOL_ERROR),
           ReplyFault(call=11, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=12, kind=FaultKind.WIDE_BATCH), parts=6)
    s.limits(context_window_tokens=400)
    s.limits(session_reset_mode="none", session_idle_minutes=30, session_reset_at_hour=3,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=0.0, stuck_restart_threshold=3)
    s.files({"t-1-build.log": "build of t-1: ok"})
    _member(s, "s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-3fcc60", {"text": "Write note 1 to s-1-out-1.txt."},
                   session="s-1", after_s=78.0)
    s.start_drain(one, "s-1", after_s=105.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=119.0,
                 injected="memory: the build log is long; the user wants only its last line")
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=129.0,
                 injected="memory: the user signs notes as Ana and works from the Lisbon office")
    lanes = LaneWorld(s, [one], job_s=400.0)
    alice = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                          participant="alice")
    lanes.message(0, alice, "Read notes-1.txt.", after_s=2619.5)
    lanes.message(0, alice, "Say hello 6.", after_s=18610.3)
    _calm(s)


_MEMORY = {
    "figures": "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers",
    "log": "memory: the build log is long; the user wants only its last line",
    "ana": "memory: the user signs notes as Ana and works from the Lisbon office",
}
# seed 2133's steps, in the order the explorer staged them: (seconds, process index, what),
# what being ("turn", text, recalled notes) for the terminal's session t-1, ("submit",
# member, request id, text, session) or ("drain", session) at the door
_STEPS: tuple[tuple[float, int, tuple[str | None, ...]], ...] = (
    (0.0, 0, ("submit", "p-1", "r-384c2e", "Go through part-1.txt to part-10.txt in order.", "s-1")),
    (3.0, 2, ("submit", "p-2", "r-886e50", "Say hello 2.", "s-2")),
    (5.0, 2, ("drain", "s-1")),
    (7.0, 0, ("turn", "Say hello 1. My card is 4417 2210 9932 0071.", "figures")),
    (16.0, 1, ("turn", "Say hello 2.", None)),
    (18.0, 2, ("drain", "s-2")),
    (18.0, 2, ("submit", "p-1", "r-12fdfb", "Read notes-1.txt and notes-2.txt.", "s-1")),
    (20.0, 2, ("submit", "p-1", "r-12fdfb", "Say hello 99.", "s-1")),
    (22.0, 1, ("turn", "Write note 3 to t-1-out-3.txt.", None)),
    (26.0, 0, ("turn", "Write note 4 to t-1-out-4.txt.", "log")),
    (27.0, 2, ("submit", "p-2", "r-bde37a",
               "Read notes-1.txt and rewrite it as note 70 at notes-1.txt.", "s-2")),
    (28.0, 0, ("drain", "s-2")),
    (30.0, 0, ("turn", "Say hello 5.", "ana")),
    (30.0, 0, ("submit", "p-1", "r-886e50", "Write note 2 to s-1-out-2.txt.", "s-1")),
    (34.0, 2, ("turn", "Say hello 6.", None)),
    (35.0, 1, ("turn", "Write note 7 to t-1-out-7.txt.", None)),
    (45.0, 0, ("turn", "Read notes-1.txt.", None)),
    (46.0, 1, ("turn", "Say hello 9.", None)),
    (47.0, 1, ("drain", "s-1")),
    (96.0, 1, ("submit", "p-1", "r-300292", "Read notes-2.txt.", "s-1")),
    (103.0, 1, ("submit", "p-1", "r-5c7561", "Read notes-1.txt.", "s-1")),
    (104.0, 1, ("drain", "s-1")),
    (110.0, 0, ("drain", "s-1")),
    (111.0, 0, ("submit", "p-1", "r-f29d31", "Read notes-2.txt.", "s-1")),
    (126.0, 0, ("drain", "s-1")),
    (135.0, 1, ("drain", "s-1")),
)


@scenario("Passes a fallback route's preflight found nothing to compact count in the streak "
          "that blocks the next turn's compaction (explored seed 2133)",
          invariants=("CMP-1", "CMP-4"), stage="explore")
def fallback_passes_count_in_the_streak(s: Story) -> None:
    """A chore's turn on process 2 spends its retries on a primary outage and falls back to
    a route of 200 tokens (160 in the primary's estimate, a threshold of 136). The
    iteration starts over for the fallback, so preflight measures the rebuilt request: 143
    tokens, over that threshold, with nothing between the head and the tail's floor to
    compact; one more read, 172 tokens, and another such pass fails the turn closed. The
    engine counts both as ineffective (CMP-4), and a later turn of the session on process 2
    sends 348 tokens, over the primary's threshold of 340, with compaction blocked.
    CMP-1's checker inferred passes that left no record only at preflights of the primary
    route, and none before a fallback's first call (it took that call for a retry, which
    resends without a preflight), so it called that request sent without trying to compact.
    It now infers them on every route, each by its own threshold, and at the first call a
    fallback hop makes."""
    model = _world(s, 2133, ReplyFault(call=2, kind=FaultKind.SERVER_ERROR),
                   ReplyFault(call=13, kind=FaultKind.OUTAGE), parts=10)
    s.world.tools.slow("read_file", 20.0, path="notes-1.txt", start_delay_s=0.0)
    s.limits(context_window_tokens=400)
    s.limits(fallback_providers=(ProviderRoute(model="fallback-small", context_window_tokens=200,
                                               token_ratio=1.25),))
    s.use_provider_for("fallback-small", model.for_fallback())
    s.files({"t-1-build.log": "build of t-1: ok"})
    _member(s, "s-1", "s-2")
    procs = (s.main_process(), s.process(), s.process())
    s.faults(crash=None, crash_at_effect=12, fail_writes={"tool_calls": 1})
    for at, index, what in _STEPS:
        process = procs[index]
        if what[0] == "turn":
            notes = {"injected": _MEMORY[what[2]]} if what[2] else {}
            s.start_turn(str(what[1]), session="t-1", process=process, after_s=at, **notes)
        elif what[0] == "drain":
            s.start_drain(process, str(what[1]), after_s=at)
        else:
            _, member, request, text, session = what
            s.start_submit(process, str(member), str(request), {"text": text}, session=str(session),
                           after_s=at)
    _calm(s)


@scenario("A row rewritten before the session rotated is judged where the child holds it "
          "(explored seed 2266)", invariants=("WIRE-2", "CMP-5"), stage="explore")
def a_rewritten_row_follows_the_rotation(s: Story) -> None:
    """The terminal's user pastes a card number into the first turn and an operator redacts
    that row; the next turn's wide batch fills the 500-token window, and the turn after it
    compacts before its first call and rotates the session, so its requests go to the child,
    which holds the rows the compaction kept. WIRE-2's checker looked for the rewritten row
    only in requests to the session it was rewritten in, found none from that turn, and
    called it a turn that ran after the rewrite and sent the row in no request. It now
    judges the row's copy where the child holds it, and excuses a turn whose request carried
    the row's summary instead."""
    _world(s, 2266, ReplyFault(call=1, kind=FaultKind.TOOL_ERROR),
           ReplyFault(call=3, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=6, kind=FaultKind.WIDE_BATCH), parts=7)
    s.limits(context_window_tokens=500)
    s.files({"t-1-build.log": "build of t-1: ok"})
    _member(s, "s-1")
    one = s.main_process()
    s.start_submit(one, "p-1", "r-d8e81b", {"text": "Say hello 1."}, session="s-1", after_s=7.0)
    s.start_turn("Say hello 1. My card is 4417 2210 9932 0071.", session="t-1", process=one,
                 after_s=9.0,
                 injected="memory: last week the user asked for every change to be written to its own file")
    s.start_drain(one, "s-1", after_s=12.0)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=15.0,
                 injected=_MEMORY["figures"])
    redact_later(s, "My card is 4417 2210 9932 0071.", after_s=15.0, session="t-1")
    s.start_turn("Say hello 3.", session="t-1", process=one, after_s=22.0, injected=_MEMORY["figures"])
    _calm(s)


@scenario("A re-prompt a compaction summarized away still counted in the request it measured "
          "(explored seed 2960)", invariants=("CMP-1",), stage="explore")
def a_summarized_reprompt_still_counted(s: Story) -> None:
    """A chore's sixth call is dropped, so its refused reply and the re-prompt ride in the
    working list from then on. Four reads later the request, 442 tokens with them, is over
    the threshold of 425; the pass summarizes the middle, the re-prompt with it, and keeps
    the turn's own message in the head. CMP-1's checker read the scaffolding of the
    measured request from the turn's next call alone, which no longer carried it, measured
    407 tokens and called the compaction one under the threshold, unasked. It now also
    counts the scaffolding the call before carried and its reply added, the larger of the
    two."""
    _world(s, 2960, ReplyFault(call=6, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=7, kind=FaultKind.UNKNOWN_TOOL), parts=10)
    s.limits(context_window_tokens=500)
    _member(s, "s-2")
    one = s.main_process()
    s.start_submit(one, "p-2", "r-186425", {"text": "Go through part-1.txt to part-10.txt in order."},
                   session="s-2", after_s=27.0)
    s.start_drain(one, "s-2", after_s=29.0)
    _calm(s)
