"""Stories the explorer found about rewritten rows and session lanes: each a shrunk seed
(``hermes-ref explore --shrink SEED``) on which a checker asked for what the engine may not
do, red on the checkers before their fix. The calls are the explorer's own, so each
replays the run it came from, then the calm phase.
"""

from __future__ import annotations

from hermes_ref.session import SessionSource
from scenarios._explored_common import calm as _calm
from sim.explore.lanes import LaneWorld
from sim.explore.model import ExploreModel
from sim.explore.run import jump_clock
from sim.explore.terminal import redact_later
from sim.harness import Story, scenario

SECRET = "My card is 4417 2210 9932 0071."
MEMORY = "memory: the build log is long; the user wants only its last line"


def _world(s: Story, seed: int) -> ExploreModel:
    """The explored world of ``seed``: its seeded ids, its model and its notes."""
    s.seed = seed  # the world's seed: it draws the interleaving
    s.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed
    model = ExploreModel((), ids=s.world.chooser)
    s.use_provider(model)
    s.files({f"notes-{k}.txt": f"note {k} of seed {seed}" for k in (1, 2)})
    return model


@scenario("A row rewritten before a rotation is sent as its new text from the child session "
          "the rotation copied it into (explored seed 1932)",
          invariants=("WIRE-2", "CMP-5"), stage="explore")
def rewritten_row_followed_into_the_child(s: Story) -> None:
    """An operator cuts a card number from the terminal's first user row; four turns later
    the context is past the threshold and the last turn's preflight rotates the session.
    The child opens with copies of the kept rows, the rewritten row first, and the turn's
    one call sends that copy as the new text. WIRE-2's checker looked for the turn's calls
    under the rewritten session only, found none there, and called the turn silent; it
    now follows the row into the child a rotation copied it to, and judges the call
    there."""
    _world(s, 1932)
    s.limits(context_window_tokens=400)
    s.files({"t-1-build.log": "build of t-1: ok"})
    s.bind("p-1", session="s-1")
    s.bind("op-s-1", session="s-1", role="operator", kind="operator")
    one = s.main_process()
    s.start_turn(f"Say hello 2. {SECRET}", session="t-1", process=one, after_s=124.0,
                 injected=MEMORY)
    redact_later(s, SECRET, after_s=128.0, session="t-1")
    s.start_turn("Say hello 3.", session="t-1", process=one, after_s=128.0, injected=MEMORY)
    s.start_turn("Write note 6 to t-1-out-6.txt.", session="t-1", process=one, after_s=138.0,
                 injected=MEMORY)
    for at, n in ((139.0, 7), (147.0, 8)):
        s.start_turn(f"Write note {n} to t-1-out-{n}.txt.", session="t-1", process=one, after_s=at)
    s.start_turn("Say hello 13.", session="t-1", process=one, after_s=176.0)
    _calm(s)


TELEGRAM = SessionSource(platform="telegram", chat_type="dm", chat_id="99", participant="42")
DISCORD = SessionSource(platform="discord", chat_type="group", chat_id="guild-123",
                        participant="alice")


@scenario("A lane's successful turn that rotated its session twice clears the restart count "
          "for its key (explored seed 2190)",
          invariants=("SES-7", "CMP-5"), stage="explore")
def rotated_success_clears_the_restart_count(s: Story) -> None:
    """Two graceful stops each leave a turn of the telegram lane running, and each start
    marks it resume_pending. The message after the second one resumes the lane; its turn
    compacts twice, rotating the session twice, and answers: the lane clears the key's
    restart count. SES-7's checker mapped a completion to its key only through sessions
    a route names, and the turn completed on the second child, which no route named yet;
    it now maps a completion through the session's lineage to the key."""
    _world(s, 2190)
    s.limits(context_window_tokens=320)
    s.limits(session_reset_mode="none", session_idle_minutes=60, session_reset_at_hour=3,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=43200.0, stuck_restart_threshold=3)
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    lanes = LaneWorld(s, [one], job_s=400.0)
    lanes.message(0, TELEGRAM, "Read build.log.", after_s=33462.9)
    lanes.restart(0, graceful=True, after_s=33473.6)
    lanes.message(0, TELEGRAM, "Read build.log.", after_s=33673.2)
    lanes.message(0, TELEGRAM, "Read build.log.", after_s=34902.3)
    lanes.restart(0, graceful=True, after_s=34916.3)
    lanes.message(0, TELEGRAM, "Say hello 8.", after_s=35176.5)
    _calm(s)


@scenario("A lane whose agent is evicted at the instant its next message arrives starts a new "
          "session (explored seed 2896)",
          invariants=("SES-3",), stage="explore")
def evicted_at_the_message_instant_is_stale(s: Story) -> None:
    """The clock jumps an hour, and the timers it passed fire at one instant: the discord
    lane's first message creates its session, the agent is evicted (the row ends
    ``agent_close``), and the second message finds the route stale and starts a new
    session. SES-3's checker took a row ended at the message's own instant as still live,
    and wanted the lane kept; the record orders neither within one instant, so it now
    accepts either reading."""
    _world(s, 2896)
    s.limits(session_reset_mode="daily", session_idle_minutes=60, session_reset_at_hour=3,
             group_sessions_per_user=True, thread_sessions_per_user=False,
             session_prune_after_s=10800.0, stuck_restart_threshold=3)
    s.bind("p-2", session="s-2")
    s.bind("op-s-2", session="s-2", role="operator", kind="operator")
    one = s.main_process()
    jump_clock(s, 3600.0, after_s=61.0)
    lanes = LaneWorld(s, [one], job_s=240.0)
    lanes.message(0, DISCORD, "Read build.log.", after_s=1178.5)
    lanes.evict(DISCORD, after_s=1577.7)
    lanes.message(0, DISCORD, "Read build.log.", after_s=2030.9)
    _calm(s)
