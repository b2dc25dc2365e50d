"""Stories the explorer found (``hermes-ref explore``), shrunk and kept as regression tests.

Each one began as a failing seed of a blind sweep; ``hermes-ref explore --shrink SEED``
reduced it to the few steps that still broke an invariant, and the engine was fixed. The
calls are the explorer's own (``sim.explore.run.stage``), so each story replays the run
it came from exactly, then the calm phase, which must leave every admission terminal.
"""

from __future__ import annotations

from hermes_ref.limits import ProviderRoute
from hermes_ref.session import SessionSource
from sim.explore.lanes import LaneWorld
from sim.explore.model import ExploreModel
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.run import calm_phase, jump_clock, redirect_a_running_turn
from sim.explore.terminal import redact_later
from sim.harness import Story, scenario


@scenario("A holder frozen past its lease's expiry sends no model call when it wakes "
          "(explored seed 291)", invariants=("LEASE-4", "ADM-5"), stage="explore")
def frozen_holder_sends_nothing_after_expiry(s: Story) -> None:
    """The turn is rate limited (Retry-After 20 s) and its process stalls 900 s in the
    backoff sleep; the 300 s lease is long gone when it wakes. The store cannot fence a
    model call, so the driver asks it first: the call is refused and the turn ends
    interrupted (the run found the call going out, and only the final write fenced)."""
    s.seed = 291  # the world's seed: it draws the interleaving of the explored run
    s.use_provider(ExploreModel((ReplyFault(call=1, kind=FaultKind.RATE_LIMIT, seconds=20.0),)))
    s.files({"notes-1.txt": "note 1 of seed 291", "notes-2.txt": "note 2 of seed 291"})
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one, two = s.main_process(), s.process()
    s.start_submit(one, "p-1", "r-2", {"text": "Say hello 2."}, session="s-1", after_s=24.0)
    s.start_drain(two, "s-1", after_s=35.0)
    s.stall(two, 900.0, after_s=38.0)
    s.run_all()
    s.expect(len(s.world.calls) == 1, "the woken turn sent no second model call")
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A session rotated by compaction keeps no copied rows of an earlier turn that CTX-9 "
          "would take for a late start (explored seed 3, small windows)",
          invariants=("CTX-9", "CMP-5"), stage="explore")
def rotated_copies_are_no_late_start(s: Story) -> None:
    """Seven turns fill a 320-token window, so preflight compacts and rotates the session.
    The child starts with copies of earlier turns' rows (a summary, the protected head and
    tail), and an earlier turn's copies there need not end on its final row: that turn made
    its final persist in the parent. The sweep found CTX-9's checker reading those copies
    as a turn the next one started before; copies are not a turn's own writes, and the
    checker now skips them, as CTX-1's does."""
    s.seed = 3  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((), ids=s.world.chooser)
    s.use_provider(model)
    s.files({'notes-1.txt': 'note 1 of seed 3', 'notes-2.txt': 'note 2 of seed 3'})
    s.limits(context_window_tokens=320)
    s.bind('p-3', session='s-3')
    s.bind('op-s-3', session='s-3', role="operator", kind="operator")
    s.bind('q-3', session='s-3')
    one = s.main_process()
    s.start_submit(one, 'p-3', 'r-80d8ac', {'text': 'Read notes-1.txt and notes-2.txt.'},
                   session='s-3', after_s=31.0)
    s.start_submit(one, 'p-3', 'r-bd8c56', {'text': 'Say hello 1.'}, session='s-3', after_s=65.0)
    s.start_submit(one, 'p-3', 'r-deb033', {'text': 'Say hello 2.'}, session='s-3', after_s=69.0)
    s.start_submit(one, 'q-3', 'r-bd8c56', {'text': 'Say hello bd8c56 from q-3.'},
                   session='s-3', after_s=70.0)
    s.start_submit(one, 'q-3', 'r-deb033', {'text': 'Say hello deb033 from q-3.'},
                   session='s-3', after_s=70.0)
    s.start_submit(one, 'p-3', 'r-2d3836', {'text': 'Read notes-2.txt.'}, session='s-3', after_s=87.0)
    s.start_submit(one, 'p-3', 'r-090ad7', {'text': 'Say hello 5.'}, session='s-3', after_s=88.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A correction taken in by a turn that dies before it settles came through the door "
          "with that turn (explored seed 22)", invariants=("ADM-1", "LOOP-4"), stage="explore")
def correction_of_an_unsettled_turn_is_admitted(s: Story) -> None:
    """A turn of s-3 takes in a correction (LOOP-4), answers, releases its lease, and its
    process dies before the admission settles, so the admission never names the turn. The
    turn is still known as the admitted one (its first row carries the claimed text, after
    the claim); the sweep found ADM-1's checker holding the correction row to that same
    text-match and calling it an input that never came through the door. The checker now
    admits every user row of a turn it has matched, as it does for a settled one."""
    s.seed = 22  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((ReplyFault(call=3, kind=FaultKind.SLOW_REPLY, seconds=90.0), ), ids=s.world.chooser)
    s.use_provider(model)
    s.files({'notes-1.txt': 'note 1 of seed 22', 'notes-2.txt': 'note 2 of seed 22'})
    s.limits(verify_before_answer=True)
    s.bind('p-2', session='s-2')
    s.bind('op-s-2', session='s-2', role="operator", kind="operator")
    s.bind('p-3', session='s-3')
    s.bind('op-s-3', session='s-3', role="operator", kind="operator")
    one = s.main_process()
    s.delay_reply(3, 90.0)
    s.faults(crash='after:release#3', crash_at_effect=None, fail_writes={'user': 1})
    s.start_submit(one, 'p-3', 'r-fb8058', {'text': 'Write note 2 to s-3-out-2.txt.'},
                   session='s-3', after_s=5.0)
    s.start_submit(one, 'p-3', 'r-92d744', {'text': 'Write note 3 to s-3-out-3.txt.'},
                   session='s-3', after_s=16.0)
    s.start_drain(one, 's-3', after_s=17.0)
    s.start_submit(one, 'p-2', 'r-fb8058', {'text': 'Read notes-1.txt and notes-2.txt.'},
                   session='s-2', after_s=27.0)
    s.start_drain(one, 's-3', after_s=34.0)
    s.start_drain(one, 's-2', after_s=47.0)
    redirect_a_running_turn(s, 'Say hello 69 instead.', after_s=71.0, session='s-3')
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A turn that fell back to a small window compacts for that window, and may still "
          "fail closed with nothing more to write (explored seed 111)",
          invariants=("CMP-1", "CMP-5", "LOOP-6"), stage="explore")
def fallback_window_compaction_fails_closed(s: Story) -> None:
    """The primary's outage sends a turn to a 120-token fallback route; preflight compacts
    for that window (LOOP-6: the fallback's threshold is its own) and rotates the session,
    and the request still does not fit, so the turn fails closed and writes nothing more
    (FIN-5: no boundary row after context pressure). The sweep found CMP-1's checker
    judging that compaction by the primary's threshold, and CMP-5's asking the turn to
    write in the child after it failed closed; both now read the record as it is."""
    s.seed = 111  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((ReplyFault(call=2, kind=FaultKind.REASONING_ONLY),
                          ReplyFault(call=6, kind=FaultKind.TOOL_ERROR),
                          ReplyFault(call=11, kind=FaultKind.OUTAGE)), ids=s.world.chooser)
    s.use_provider(model)
    s.files({'notes-1.txt': 'note 1 of seed 111', 'notes-2.txt': 'note 2 of seed 111'})
    s.limits(fallback_providers=(ProviderRoute(model='fallback-small', context_window_tokens=120,
                                               token_ratio=1.25),))
    s.use_provider_for('fallback-small', model.for_fallback())
    s.bind('p-2', session='s-2')
    s.bind('op-s-2', session='s-2', role="operator", kind="operator")
    s.bind('p-3', session='s-3')
    s.bind('op-s-3', session='s-3', role="operator", kind="operator")
    s.bind('q-3', session='s-3')
    one = s.main_process()
    s.start_submit(one, 'p-3', 'r-f15b39', {'text': 'Read notes-1.txt.'}, session='s-3', after_s=4.0)
    s.start_submit(one, 'p-2', 'r-4e20d7', {'text': 'Read notes-2.txt.'}, session='s-2', after_s=8.0)
    s.start_drain(one, 's-2', after_s=9.0)
    s.start_submit(one, 'p-3', 'r-e8103b', {'text': 'Say hello 5.'}, session='s-3', after_s=16.0)
    s.start_drain(one, 's-3', after_s=17.0)
    s.start_submit(one, 'p-3', 'r-bf3455', {'text': 'Read notes-1.txt.'}, session='s-3', after_s=19.0)
    s.start_drain(one, 's-3', after_s=21.0)
    s.start_submit(one, 'p-3', 'r-603873', {'text': 'Say hello 4.'}, session='s-3', after_s=24.0)
    s.start_submit(one, 'q-3', 'r-bf3455', {'text': 'Say hello bf3455 from q-3.'},
                   session='s-3', after_s=24.0)
    s.start_drain(one, 's-3', after_s=27.0)
    s.start_drain(one, 's-3', after_s=66.0)
    s.start_drain(one, 's-3', after_s=109.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A turn that fails closed right after an empty reply was refused a request that held "
          "the ladder's nudge (explored seed 108)", invariants=("CMP-1", "CMP-7", "LOOP-8"),
          stage="explore")
def nudged_request_refused_at_preflight(s: Story) -> None:
    """A 250-token window; after a tool round the model answers empty, so the next request
    carries the ladder's nudge pair, and compaction cannot bring that request under the
    window: the turn fails closed. Scaffolding is never stored, so the checkers rebuild the
    refused request from the rows and the nudge the empty reply called for (the run found
    CMP-1, CMP-7 and LOOP-8 counting the rows alone)."""
    s.seed = 108  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((ReplyFault(call=9, kind=FaultKind.EMPTY_REPLY),), ids=s.world.chooser)
    s.use_provider(model)
    s.files({'notes-1.txt': 'note 1 of seed 108', 'notes-2.txt': 'note 2 of seed 108'})
    s.world.tools.slow('read_file', 20.0, path='notes-1.txt', start_delay_s=0.0)
    s.limits(context_window_tokens=250)
    s.bind('p-1', session='s-1')
    s.bind('op-s-1', session='s-1', role="operator", kind="operator")
    s.bind('p-2', session='s-2')
    s.bind('op-s-2', session='s-2', role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, 'p-2', 'r-03d604', {'text': 'Say hello 6.'}, session='s-2', after_s=13.0)
    s.start_submit(one, 'p-2', 'r-03d604x', {'text': 'Say hello 6.', 'role': 'operator'},
                   session='s-2', after_s=17.0)
    s.start_drain(one, 's-2', after_s=21.0)
    s.start_submit(one, 'p-2', 'r-663911', {'text': 'Say hello 5.'}, session='s-2', after_s=33.0)
    s.start_submit(one, 'p-2', 'r-663911x', {'text': 'Say hello 5.', 'role': 'operator'},
                   session='s-2', after_s=48.0)
    s.start_drain(one, 's-2', after_s=55.0)
    s.start_submit(one, 'p-2', 'r-408d5d', {'text': 'Say hello 2.'}, session='s-2', after_s=94.0)
    s.start_drain(one, 's-2', after_s=96.0)
    s.start_submit(one, 'p-2', 'r-6544e0', {'text': 'Write note 1 to s-2-out-1.txt.'},
                   session='s-2', after_s=97.0)
    s.start_submit(one, 'p-1', 'r-62d2bc', {'text': 'Say hello 3.'}, session='s-1', after_s=98.0)
    s.start_drain(one, 's-2', after_s=101.0)
    s.start_submit(one, 'p-1', 'r-6544e0', {'text': 'Read notes-1.txt and notes-2.txt.'},
                   session='s-1', after_s=101.0)
    s.start_drain(one, 's-2', after_s=117.0)
    s.start_drain(one, 's-1', after_s=127.0)
    s.start_drain(one, 's-1', after_s=128.0)
    s.start_drain(one, 's-2', after_s=130.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A restarted process starts without its predecessor's compaction block "
          "(explored seed 108)", invariants=("CMP-4",), stage="explore")
def restart_forgets_the_compaction_block(s: Story) -> None:
    """In a 250-token window one turn compacts twice and stays over the threshold (two
    ineffective passes: automatic compaction is blocked in that process), then fails
    closed. The calm phase restarts the world and the new process compacts the same
    lineage again: the block is what one engine remembers (``CompressionState`` lives in
    its session cache), so CMP-4 judges the streak of each process apart (the run found
    the checker counting passes of both processes as one streak)."""
    s.seed = 108  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((ReplyFault(call=9, kind=FaultKind.EMPTY_REPLY),
                          ReplyFault(call=11, kind=FaultKind.TOOL_ERROR),
                          ReplyFault(call=12, kind=FaultKind.EMPTY_REPLY)), ids=s.world.chooser)
    s.use_provider(model)
    s.files({'notes-1.txt': 'note 1 of seed 108', 'notes-2.txt': 'note 2 of seed 108'})
    s.limits(context_window_tokens=250)
    s.bind('p-1', session='s-1')
    s.bind('op-s-1', session='s-1', role="operator", kind="operator")
    s.bind('p-2', session='s-2')
    s.bind('op-s-2', session='s-2', role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, 'p-2', 'r-03d604', {'text': 'Say hello 6.'}, session='s-2', after_s=13.0)
    s.start_submit(one, 'p-2', 'r-03d604x', {'text': 'Say hello 6.', 'role': 'operator'},
                   session='s-2', after_s=17.0)
    s.start_submit(one, 'p-1', 'r-339a47', {'text': 'Read notes-1.txt and notes-2.txt.'},
                   session='s-1', after_s=19.0)
    s.start_drain(one, 's-2', after_s=21.0)
    s.start_submit(one, 'p-2', 'r-663911', {'text': 'Say hello 5.'}, session='s-2', after_s=33.0)
    s.start_drain(one, 's-1', after_s=47.0)
    s.start_submit(one, 'p-2', 'r-663911x', {'text': 'Say hello 5.', 'role': 'operator'},
                   session='s-2', after_s=48.0)
    s.start_drain(one, 's-2', after_s=55.0)
    s.start_submit(one, 'p-2', 'r-408d5d', {'text': 'Say hello 2.'}, session='s-2', after_s=94.0)
    s.start_drain(one, 's-2', after_s=96.0)
    s.start_submit(one, 'p-2', 'r-6544e0', {'text': 'Write note 1 to s-2-out-1.txt.'},
                   session='s-2', after_s=97.0)
    s.start_drain(one, 's-2', after_s=101.0)
    s.start_submit(one, 'p-2', 'r-62d2bc', {'text': 'Say hello 3.'}, session='s-2', after_s=111.0)
    s.start_submit(one, 'p-1', 'r-408d5d', {'text': 'Say hello 2.'}, session='s-1', after_s=116.0)
    s.start_drain(one, 's-2', after_s=117.0)
    s.start_drain(one, 's-1', after_s=128.0)
    s.start_drain(one, 's-2', after_s=130.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A turn on its last iteration falls back after the primary's retries are spent; "
          "the small fallback's preflight refuses and the turn fails closed (explored seed 146)",
          invariants=("LOOP-2", "LOOP-6", "CMP-7"), stage="explore")
def last_iteration_falls_back_and_fails_closed(s: Story) -> None:
    """``max_iterations`` is 2 and the turn's second request meets an outage. The hop to
    the fallback refunds that call, so the fallback's request is still the second
    iteration's; its 200-token window cannot hold it, and the turn fails closed. (The run
    found the hop charged: the loop ended at its bound before the fallback, and the grace
    call went to the fallback's preflight instead, so LOOP-6, FIN-1 and LOOP-5 each saw
    a different turn.)"""
    s.seed = 146  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((ReplyFault(call=2, kind=FaultKind.SERVER_ERROR),
                          ReplyFault(call=5, kind=FaultKind.OUTAGE)), ids=s.world.chooser)
    s.use_provider(model)
    s.files({'notes-1.txt': 'note 1 of seed 146', 'notes-2.txt': 'note 2 of seed 146'})
    s.limits(max_iterations=2)
    s.limits(fallback_providers=(ProviderRoute(model='fallback-small', context_window_tokens=200,
                                               token_ratio=1.25),))
    s.use_provider_for('fallback-small', model.for_fallback())
    s.bind('p-1', session='s-1')
    s.bind('op-s-1', session='s-1', role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, 'p-1', 'r-c8f3e2', {'text': 'Read notes-1.txt and notes-2.txt.'},
                   session='s-1', after_s=37.0)
    s.start_submit(one, 'p-1', 'r-4e19e2', {'text': 'Read notes-2.txt.'}, session='s-1', after_s=40.0)
    s.start_drain(one, 's-1', after_s=42.0)
    s.start_drain(one, 's-1', after_s=57.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A user reset of a lane whose incarnation compaction rotated ends the live tip "
          "(explored seed 65)", invariants=("CMP-5", "SES-2"), stage="explore")
def user_reset_ends_the_rotated_lanes_tip(s: Story) -> None:
    """A small window rotates the lane's incarnation at the third message, and twice more at
    the fourth; ten seconds later the user asks for a new conversation. The reset must end
    the lineage's live tip, as routing a message walks to it (the run found the reset
    ending the long-ended root and leaving the tip open beside the new incarnation)."""
    s.seed = 65  # the world's seed: it draws the interleaving of the explored run
    s.world.id_style = "seeded"
    s.use_provider(ExploreModel((), ids=s.world.chooser))
    s.files({"notes-1.txt": "note 1 of seed 65", "notes-2.txt": "note 2 of seed 65"})
    s.limits(context_window_tokens=320)
    s.limits(session_reset_mode="none", session_idle_minutes=60, session_reset_at_hour=9,
             group_sessions_per_user=False, thread_sessions_per_user=False,
             session_prune_after_s=43200.0, stuck_restart_threshold=2)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    dm = SessionSource(platform="telegram", chat_type="dm", chat_id="99", participant="42")
    lanes = LaneWorld(s, [s.main_process()], job_s=400.0)
    lanes.message(0, dm, "Read build.log.", after_s=3373.2)
    lanes.restart(0, graceful=True, after_s=3379.8)
    lanes.message(0, dm, "Read notes-1.txt.", after_s=14625.1)
    lanes.message(0, dm, "Write note 4 to lane-out-4.txt.", after_s=14662.2)
    lanes.message(0, dm, "Read notes-2.txt.", after_s=45892.2)
    lanes.reset(0, dm, after_s=45902.6)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A wide batch fills the middle: a request over the threshold has nothing to compact",
          invariants=("CMP-1", "CMP-3"), stage="explore")
def wide_batch_leaves_no_middle_to_compact(s: Story) -> None:
    """Seed 871, shrunk. A turn's one round reads ten files; the next turn's second request
    is over the threshold of a 400-token window, but the head ends past the ten results and
    the tail's eight messages start at the next turn's call, so no message lies between: the
    pass has nothing to summarize and the request is sent. CMP-1 asks a pass only of a
    request that has a middle to compact (CMP-3 keeps each tool group whole)."""
    s.seed = 871  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((ReplyFault(call=3, kind=FaultKind.WIDE_BATCH), ), ids=s.world.chooser)
    s.use_provider(model)
    s.files({
        'notes-1.txt': 'note 1 of seed 871',
        'notes-2.txt': 'note 2 of seed 871',
        'part-1.txt': 'part 1 of seed 871: in order',
        'part-2.txt': 'part 2 of seed 871: in order',
        'part-3.txt': 'part 3 of seed 871: in order',
        'part-4.txt': 'part 4 of seed 871: in order',
        'part-5.txt': 'part 5 of seed 871: in order',
        'part-6.txt': 'part 6 of seed 871: in order',
        'part-7.txt': 'part 7 of seed 871: in order',
        'part-8.txt': 'part 8 of seed 871: in order',
        'part-9.txt': 'part 9 of seed 871: in order',
        'part-10.txt': 'part 10 of seed 871: in order',
    })
    s.limits(context_window_tokens=400)
    s.files({'t-1-build.log': 'build of t-1: ok'})
    s.world.tools.slow('read_file', 60.0, path='t-1-build.log')
    s.bind('p-3', session='s-3')
    s.bind('op-s-3', session='s-3', role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={'tool_results': 1})
    s.start_turn('Read notes-2.txt.', session='t-1', process=one, after_s=98.0)
    s.start_submit(one, 'p-3', 'r-6d2c1e', {'text': 'Say hello 2.'}, session='s-3', after_s=102.0)
    s.start_turn('Read t-1-build.log.', session='t-1', process=one, after_s=105.0)
    s.start_submit(one, 'p-3', 'r-bbb895x',
                   {'text': 'Read notes-1.txt and notes-2.txt.', 'role': 'operator'},
                   session='s-3', after_s=123.0)
    s.start_drain(one, 's-3', after_s=143.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A new process compacts an idle session by the spec's floor, not the last one's raised floor",
          invariants=("CTX-5",), stage="explore")
def new_process_idle_floor_is_the_specs(s: Story) -> None:
    """Seed 503, shrunk. A chore compacts the session; hours later the calm phase's new
    process takes the next turn after an idle gap past 300 s, above threshold x target
    ratio, and compacts it. The floor's rise by what the last compaction left is that
    process's memory, as the cooldown is (CMP-4): a process that did not compact has only
    CTX-5's floor, and the compaction is due."""
    s.seed = 503  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((), ids=s.world.chooser)
    s.use_provider(model)
    s.files({
        'notes-1.txt': 'note 1 of seed 503',
        'notes-2.txt': 'note 2 of seed 503',
        'part-1.txt': 'part 1 of seed 503: in order',
        'part-2.txt': 'part 2 of seed 503: in order',
        'part-3.txt': 'part 3 of seed 503: in order',
        'part-4.txt': 'part 4 of seed 503: in order',
        'part-5.txt': 'part 5 of seed 503: in order',
        'part-6.txt': 'part 6 of seed 503: in order',
    })
    s.limits(context_window_tokens=500)
    s.limits(session_reset_mode='idle', session_idle_minutes=30, session_reset_at_hour=9,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=43200.0, stuck_restart_threshold=3)
    s.limits(idle_compact_after_s=300.0)
    s.bind('p-2', session='s-2')
    s.bind('op-s-2', session='s-2', role="operator", kind="operator")
    one = s.main_process()
    s.start_submit(one, 'p-2', 'r-b845f3',
                   {'text': 'Go through part-1.txt to part-6.txt in order.'}, session='s-2', after_s=2.0)
    s.start_drain(one, 's-2', after_s=21.0)
    s.start_submit(one, 'p-2', 'r-b9a3b6', {'text': 'Say hello 1.'}, session='s-2', after_s=46.0)
    jump_clock(s, 400.0, after_s=48.0)
    s.start_drain(one, 's-2', after_s=56.0)
    s.start_submit(one, 'p-2', 'r-343257',
                   {'text': 'Read notes-1.txt and notes-2.txt.'}, session='s-2', after_s=114.0)
    lanes = LaneWorld(s, [one], job_s=240.0)
    lanes.watch(0, after_s=23356.8)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A turn whose user row the store refused wrote nowhere, and the session rotated later",
          invariants=("CMP-5",), stage="explore")
def refused_user_row_before_a_rotation(s: Story) -> None:
    """Seed 387, shrunk. The first turn of s-2 fails writing its user row (LOOP-3: a
    persistence failure, the input handed back), long before a chore compacts and rotates
    s-2. CMP-5 asks a turn to write in the lineage's tip; a turn the store refused wrote
    nothing anywhere, as a turn refused the lease does not."""
    s.seed = 387  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((
        ReplyFault(call=2, kind=FaultKind.EMPTY_REPLY),
        ReplyFault(call=5, kind=FaultKind.UNKNOWN_TOOL),
        ReplyFault(call=6, kind=FaultKind.TOOL_ERROR),
    ), ids=s.world.chooser)
    s.use_provider(model)
    s.files({
        'notes-1.txt': 'note 1 of seed 387',
        'notes-2.txt': 'note 2 of seed 387',
        'part-1.txt': 'part 1 of seed 387: in order',
        'part-2.txt': 'part 2 of seed 387: in order',
        'part-3.txt': 'part 3 of seed 387: in order',
        'part-4.txt': 'part 4 of seed 387: in order',
        'part-5.txt': 'part 5 of seed 387: in order',
        'part-6.txt': 'part 6 of seed 387: in order',
        'part-7.txt': 'part 7 of seed 387: in order',
        'part-8.txt': 'part 8 of seed 387: in order',
        'part-9.txt': 'part 9 of seed 387: in order',
    })
    s.world.tools.slow('read_file', 1.0, path='notes-2.txt', start_delay_s=300.0)
    s.limits(context_window_tokens=700)
    s.limits(idle_compact_after_s=300.0)
    s.bind('p-2', session='s-2')
    s.bind('op-s-2', session='s-2', role="operator", kind="operator")
    s.bind('p-3', session='s-3')
    s.bind('op-s-3', session='s-3', role="operator", kind="operator")
    s.bind('q-2', session='s-2')
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={'user': 1})
    s.start_submit(one, 'p-2', 'r-8cb268',
                   {'text': 'Go through part-1.txt to part-9.txt in order.'}, session='s-2', after_s=7.0)
    s.start_submit(one, 'p-3', 'r-c9703b',
                   {'text': 'Write note 1 to s-3-out-1.txt.'}, session='s-3', after_s=14.0)
    s.start_drain(one, 's-2', after_s=15.0)
    s.start_drain(one, 's-3', after_s=38.0)
    s.start_submit(one, 'p-2', 'r-c9703b',
                   {'text': 'Write note 1 to s-2-out-1.txt.'}, session='s-2', after_s=63.0)
    s.start_submit(one, 'p-2', 'r-8a194e',
                   {'text': 'Read notes-1.txt and notes-2.txt.'}, session='s-2', after_s=98.0)
    s.start_submit(one, 'q-2', 'r-8a194e',
                   {'text': 'Say hello 8a194e from q-2.'}, session='s-2', after_s=102.0)
    s.start_drain(one, 's-2', after_s=122.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A row redacted in a lane whose context is past every compaction: the later turns end "
          "at preflight and send no request, so they replay nothing (seed 206)",
          invariants=("WIRE-2",), stage="explore")
def redacted_row_in_a_lane_that_sends_nothing(s: Story) -> None:
    s.seed = 206  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"
    s.use_provider(ExploreModel((), ids=s.world.chooser))
    s.files({"notes-2.txt": "note 2 of seed 206", "t-1-build.log": "build of t-1: ok"})
    s.limits(context_window_tokens=320)  # small: the lane soon outgrows every compaction
    ana = "memory: the user signs notes as Ana and works from the Lisbon office"
    figures = "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers"
    one = s.main_process()
    s.start_turn("Say hello 2. My card is 4417 2210 9932 0071.", session="t-1", process=one,
                 after_s=32.0, injected=ana)
    s.start_turn("Write note 3 to t-1-out-3.txt.", session="t-1", process=one, after_s=38.0,
                 injected="memory: the build log is long; the user wants only its last line")
    s.start_turn("Say hello 4.", session="t-1", process=one, after_s=46.0,
                 injected="memory: last week the user asked for every change to be written to its own file")
    s.start_turn("Read notes-2.txt.", session="t-1", process=one, after_s=55.0,
                 injected=figures)
    redact_later(s, "My card is 4417 2210 9932 0071.", after_s=58.0, session="t-1")
    s.start_turn("Say hello 6.", session="t-1", process=one, after_s=63.0,
                 injected=ana)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")


@scenario("A waiter silent for exactly two polls has lost its place in line, as the stores "
          "say (explored seed 4570)", invariants=("LEASE-1",), stage="explore")
def waiter_silent_for_two_polls_lost_its_place(s: Story) -> None:
    """A clock jump brings three terminal turns of ``t-1`` due at one instant: one takes the
    session, two wait in line, and the first of those freezes for 30 s. Its last ask was
    at 403 s, so its place was good until 405 s; at 405 s the second waiter asks, the
    store drops the silent one (a place lasts two polls, ``valid_until <= now``) and grants
    the lease. LEASE-1's checker counted the frozen waiter still in line at exactly two
    polls, though its own ranking (``_place``) and both stores drop it there."""
    s.seed = 4570  # the world's seed: it draws the interleaving of the explored run
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    s.use_provider(ExploreModel((), ids=s.world.chooser))
    s.files({"notes-1.txt": "note 1 of seed 4570", "notes-2.txt": "note 2 of seed 4570",
             "t-1-build.log": "build of t-1: ok"})
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one, two, three = s.main_process(), s.process(), s.process()
    jump_clock(s, 400.0, after_s=3.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=three, after_s=5.0)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=8.0)
    s.start_turn("Write note 6 to t-1-out-6.txt.", session="t-1", process=two, after_s=15.0)
    s.stall(one, 30.0, after_s=101.0)
    s.run_all()
    stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done
    s.expect(not stuck, f"every admission reached a terminal state: {stuck}")
