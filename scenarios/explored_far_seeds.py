"""Stories the explorer found in seeds 10,000-19,999, the first sweep past 9,999, each a
shrunk seed (``hermes-ref explore --shrink SEED``) red before its fix, on the engine or on a
checker, as each story says. The calls are the explorer's own, so each replays the run it
came from, then the calm phase.
"""

from __future__ import annotations

from scenarios._explored_common import calm as _calm
from scenarios._explored_common import world as _world
from sim.explore.edges import FlakySummarizer, handed_history
from sim.explore.plan import FaultKind, ReplyFault
from sim.explore.terminal import SECRET, redact_later
from sim.harness import Story, scenario

MEMORY = "memory: last week the user asked for every change to be written to its own file"
FIGURES = "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers"


@scenario("A summary asked for before a redaction is measured on the row as it was then, "
          "card number and all (explored seed 17031)",
          invariants=("CMP-1",), stage="explore")
def summary_asked_before_a_redaction(s: Story) -> None:
    """In a 400-token window (threshold 340) a terminal turn pastes a card number, and the
    operator's tool waits for the session's lease to cut it. Meanwhile the next turn
    meets an unknown tool twice and an empty reply (whose nudge rides in the request, sent
    but never stored), and its preflight, at 346 tokens, asks for a summary, which fails.
    Only then is the card cut from the row. CMP-1's checker rebuilt the request from the
    record as it ended, with the shorter row, read 338 tokens and called the summary
    unasked; it now reads each row as it was when the summary was asked for (the
    rewrite's ``was``), as a request sent then carried it."""
    model = _world(s, 17031, ReplyFault(call=2, kind=FaultKind.NARRATED_CALL),
                   ReplyFault(call=7, kind=FaultKind.SERVER_ERROR),
                   ReplyFault(call=8, kind=FaultKind.UNKNOWN_TOOL),
                   ReplyFault(call=9, kind=FaultKind.EMPTY_REPLY),
                   ReplyFault(call=10, kind=FaultKind.UNKNOWN_TOOL), parts=9)
    s.world.tools.slow("read_file", 20.0, path="notes-2.txt", start_delay_s=0.0)
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 5.0, path="t-1-build.log")
    model.summarizer = FlakySummarizer((1,), model)  # this summary request fails
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=26.0,
                 injected="memory: the build log is long; the user wants only its last line")
    s.start_submit(one, "p-1", "r-b0be94", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-1", after_s=28.0)
    s.start_turn(f"Say hello 2. {SECRET}", session="t-1", process=one, after_s=31.0)
    redact_later(s, SECRET, after_s=32.0, session="t-1")
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=32.0)
    s.start_drain(one, "s-1", after_s=36.0)
    _calm(s)


@scenario("An idle compaction asked for before a redaction is measured on the row as it "
          "was then (explored seed 12765)",
          invariants=("CTX-5",), stage="explore")
def idle_compaction_before_a_redaction(s: Story) -> None:
    """Idle compaction is on (300 s) in a 400-token window. A terminal turn pastes a card
    number; while the following turns hold the lease the operator's tool waits to cut it.
    A later turn's preflight finds the request at 361 tokens, over the threshold of 340,
    and asks for a summary (which fails); the card is cut after that turn. CTX-5's
    checker rebuilt the request from the record as it ended, read 327 tokens, under the
    threshold, and, the session not being idle, called the pass an idle compaction that
    was not due. It now reads each row as it was when the summary was asked for."""
    model = _world(s, 12765, ReplyFault(call=8, kind=FaultKind.TOOL_ERROR),
                   ReplyFault(call=14, kind=FaultKind.UNKNOWN_TOOL))
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.world.tools.slow("read_file", 20.0, path="t-1-build.log")
    s.limits(idle_compact_after_s=300.0)
    model.summarizer = FlakySummarizer((1,), model)  # this summary request fails
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    s.bind("p-3", session="s-3")
    s.bind("op-s-3", session="s-3", role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"admit": 1})
    s.start_submit(one, "p-3", "r-0fb7ce", {"text": "Say hello 4."}, session="s-3", after_s=14.3)
    s.start_turn("Say hello 80.", session="h-1", process=one, after_s=51.0,
                 history=handed_history(1))
    s.start_submit(one, "p-1", "r-4c88e2", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=55.5)
    s.start_submit(one, "p-3", "r-4c88e2", {"text": "Read notes-1.txt and notes-2.txt."},
                   session="s-3", after_s=56.2)
    s.start_drain(one, "s-1", after_s=60.7)
    s.start_submit(one, "p-1", "r-0fb7ce", {"text": "Write note 4 to s-1-out-4.txt."},
                   session="s-1", after_s=84.0)
    s.start_drain(one, "s-3", after_s=84.8)
    s.start_drain(one, "s-1", after_s=85.0)
    s.start_turn(f"Say hello 1. {SECRET}", session="t-1", process=one, after_s=87.0,
                 injected=MEMORY)
    s.start_turn("Read t-1-build.log.", session="t-1", process=one, after_s=91.8,
                 injected=MEMORY)
    redact_later(s, SECRET, after_s=97.8, session="t-1")
    s.start_turn("Say hello 3.", session="t-1", process=one, after_s=97.9)
    s.start_turn("Read notes-1.txt.", session="t-1", process=one, after_s=103.0,
                 injected=FIGURES)
    s.start_submit(one, "p-1", "background:e-280780",
                   {"text": "Say hello 73: the background job is done."}, session="s-1",
                   after_s=114.7, kind="background")
    _calm(s)


@scenario("A forced pass that fails the turn closed is judged on the re-prompts it kept in "
          "its tail, so two such passes block the next (explored seed 11105)",
          invariants=("CMP-1", "CMP-4"), stage="explore")
def forced_pass_kept_its_reprompts(s: Story) -> None:
    """In a 400-token window (threshold 340) a turn meets an unknown tool, then three
    dropped calls: each re-prompt (the narration and a nudge, sent but never stored)
    stays in its working list. Its preflight compacts, yet with the re-prompts the
    request is still over the threshold (ineffective, one); the provider then refuses it
    as too long, the forced pass rotates again and leaves 370 tokens, re-prompts
    included (ineffective, two), and the turn fails closed. Two ineffective passes block
    automatic compaction (CMP-4), so a later turn of the lineage rightly sends 363 tokens
    without compacting. CMP-4's streak judged a pass with no later request on its rows
    alone, read the second pass as effective and the block as absent, and CMP-1's
    checker called the request a silence. Such a pass is now judged with the scaffolding
    the turn still held: what its last request carried, less what lay in the middle the
    pass summarized."""
    _world(s, 11105, ReplyFault(call=1, kind=FaultKind.ERRORS_AROUND_OVERFLOW),
           ReplyFault(call=2, kind=FaultKind.RATE_LIMIT, seconds=20.0),
           ReplyFault(call=4, kind=FaultKind.NARRATED_CALL),
           ReplyFault(call=6, kind=FaultKind.SERVER_ERROR),
           ReplyFault(call=9, kind=FaultKind.AUTH_ERROR),
           ReplyFault(call=10, kind=FaultKind.UNKNOWN_TOOL),
           ReplyFault(call=11, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=12, kind=FaultKind.DROPPED_CALL),
           ReplyFault(call=13, kind=FaultKind.DROPPED_CALL), parts=9)
    s.limits(context_window_tokens=400)
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.faults(crash=None, crash_at_effect=None, fail_writes={"admit": 1})
    s.start_submit(one, "p-1", "r-504977",
                   {"text": "Go through part-1.txt to part-9.txt in order."}, session="s-1",
                   after_s=31.0)
    s.start_submit(one, "p-1", "r-5d0791", {"text": "Say hello 5."}, session="s-1", after_s=55.0)
    s.start_submit(one, "p-1", "r-299bfd", {"text": "Say hello 4."}, session="s-1", after_s=66.0)
    s.start_drain(one, "s-1", after_s=70.0)
    s.start_submit(one, "p-1", "r-9072ec", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=72.0)
    s.start_submit(one, "p-1", "r-7f9d17", {"text": "Read notes-2.txt."}, session="s-1",
                   after_s=78.0)
    s.start_drain(one, "s-1", after_s=79.0)
    s.start_drain(one, "s-1", after_s=89.0)
    s.start_submit(one, "p-1", "r-f064f6", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=94.0)
    s.start_drain(one, "s-1", after_s=97.0)
    s.start_submit(one, "p-1", "r-d39652", {"text": "Read notes-1.txt."}, session="s-1",
                   after_s=103.0)
    s.start_drain(one, "s-1", after_s=114.0)
    s.start_drain(one, "s-1", after_s=115.0)
    _calm(s)
