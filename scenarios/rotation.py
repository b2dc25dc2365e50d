"""Stories of the durable side of compaction: rotation, in place, the lock, the lineage tip.

The compaction in these stories is the story's own (``sim.rotation_story``): a summary row
and the last few messages, committed between the prologue and the first model call, so
each story knows exactly what the record must hold afterwards.
"""

from __future__ import annotations

from hermes_ref.effects import TakeCompressionLock
from hermes_ref.lease import holder_identity
from hermes_ref.models import Message, Role, SessionRecord
from hermes_ref.session import SessionSource
from sim.harness import Story, scenario
from sim.provider import text, tool_calls
from sim.rotation_story import (
    SUMMARY_PREFIX,
    compaction_turn,
    keep_last,
    run_all,
    start_compaction_turn,
)


def _tip(s: Story, session: str = "s-1") -> SessionRecord:
    tip = s.world.store.compression_tip(session)
    s.expect(tip is not None, f"{session} has a lineage tip")
    assert tip is not None
    return tip


def _live(s: Story) -> list[str]:
    return [r.id for r in s.world.store.snapshot().sessions if r.ended_at is None]


@scenario("A rotation ends the session with reason compression, and the next turn finds the "
          "lineage's tip", invariants=("CMP-5", "LEASE-1"), stage="compaction")
def rotation_ends_the_parent_and_the_next_turn_finds_the_tip(s: Story) -> None:
    s.script(text("one"), text("two"), text("three"), text("four"))
    s.turn("first")
    s.turn("second")
    compaction_turn(s, "third", keep_last(3))
    tip = _tip(s)
    parent = s.world.store.get_session("s-1")
    s.expect(tip.parent_session_id == "s-1", "the child names its parent")
    s.expect(parent is not None and parent.end_reason == "compression",
             "the parent ended with reason compression")
    s.turn("fourth")
    rows = s.transcript(tip.id)
    s.expect(rows[0].content is not None and rows[0].content.startswith(SUMMARY_PREFIX),
             "the child opens with the summary")
    s.expect([m.content for m in rows[-2:]] == ["fourth", "four"],
             "the next turn, asked for the parent, ran on the tip")
    s.expect(_live(s) == [tip.id], "one live session: the tip")


@scenario("Compaction in place archives the old rows and keeps the session id",
          invariants=("CMP-5",), stage="compaction")
def compaction_in_place_keeps_the_session(s: Story) -> None:
    s.limits(compression_in_place=True)
    s.script(text("one"), text("two"), text("three"))
    s.turn("first")
    s.turn("second")
    compaction_turn(s, "third", keep_last(2))
    record = s.world.store.snapshot()
    s.expect(_tip(s).id == "s-1" and _live(s) == ["s-1"], "no child: the same session lives on")
    s.expect(len(record.archived) == 5, "the five rows before it are archived, not deleted")
    rows = s.transcript()
    s.expect([m.content for m in rows][-2:] == ["third", "three"], "the turn went on in place")
    s.expect(rows[0].content is not None and rows[0].content.startswith(SUMMARY_PREFIX),
             "the live rows open with the summary")


@scenario("A compression lock held by another process leaves the messages unchanged",
          invariants=("CMP-6",), stage="compaction")
def lock_held_elsewhere_leaves_messages_unchanged(s: Story) -> None:
    s.script(text("one"), text("two"))
    s.turn("first")
    other = s.process()
    holder = holder_identity(s.world.holder_of(other.pid), "compactor", "cli")
    now = s.world.clock.now()
    async def take() -> bool:
        return await TakeCompressionLock("s-1", holder, now, 300.0)

    taken = other.driver.run(take())
    s.expect(taken is True, "the other process holds the lock")
    before = [m.content for m in s.transcript()]
    result = compaction_turn(s, "second", keep_last(1))
    s.expect(result is not None and result.final_response == "two", "the turn still answered")
    s.expect([m.content for m in s.transcript()] == [*before, "second", "two"],
             "nothing was compacted: the rows are all there, in order")
    s.expect(_live(s) == ["s-1"] and not s.world.store.snapshot().compactions,
             "no rotation, no compaction")


@scenario("Two processes compacting one session take turns: one rotation each, one live tip",
          invariants=("CMP-5", "CMP-6", "LEASE-1"), stage="compaction")
def two_processes_compact_one_session(s: Story) -> None:
    s.script(text("one"), text("two"), text("three"))
    s.turn("first")
    other = s.process()
    s.delay_reply(2, 5.0)  # the first compactor's model call takes a while: the other waits
    start_compaction_turn(s, "from one", keep_last(2))
    start_compaction_turn(s, "from two", keep_last(2), process=other)
    run_all(s)
    record = s.world.store.snapshot()
    s.expect(len(record.compactions) == 2, "both compacted, one after the other")
    s.expect(len(_live(s)) == 1 and _live(s) == [_tip(s).id], "one live tip")
    chain = [c.child_id for c in record.compactions]
    s.expect(record.compactions[1].session_id == chain[0],
             "the second compacted the first's child, not the ended parent")


@scenario("A rotation keeps a tool call with its result, and the next turn answers from the "
          "child", invariants=("CMP-5",), stage="compaction")
def rotation_keeps_the_tool_group(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})), text("It says alpha."), text("ok"))
    s.turn("What does a.txt say?")
    compaction_turn(s, "Thanks.", keep_last(3))  # the last three start at the tool result
    rows = s.transcript(_tip(s).id)
    s.expect([m.role.value for m in rows] == ["user", "assistant", "tool", "assistant", "user",
                                              "assistant"],
             "summary, then the call with its result, the answer, and the new turn")


@scenario("A rotation whose write fails changes nothing, and the turn goes on uncompacted",
          invariants=("CMP-5", "CMP-6"), stage="compaction")
def failed_rotation_changes_nothing(s: Story) -> None:
    s.script(text("one"), text("two"))
    s.turn("first")
    s.faults(fail_writes={"rotate": 1})
    result = compaction_turn(s, "second", keep_last(1))
    s.expect(result is not None and result.final_response == "two", "the turn still answered")
    record = s.world.store.snapshot()
    s.expect(not record.compactions and _live(s) == ["s-1"], "no rotation happened")
    s.expect([m.content for m in s.transcript()] == ["first", "one", "second", "two"],
             "every row is where it was")
    s.expect([g.end_reason for g in record.compression_locks] == ["released"],
             "the lock was given back")


def _crash_and_recover(s: Story, point: str, *, rotated: bool) -> None:
    s.script(text("one"), text("two"), text("after"))
    s.turn("first")
    s.turn("second")
    before = {m.content for m in s.transcript()}
    s.faults(crash=point)
    result = compaction_turn(s, "third", keep_last(3))
    s.expect(result is None, f"the process died at {point}")
    s.faults()
    s.restart()
    s.turn("again")
    tip = _tip(s)
    s.expect((tip.id != "s-1") == rotated, "the rotation is all there or not at all")
    s.expect(len(_live(s)) == 1, "exactly one live tip")
    kept = {m.message.content for m in s.world.store.snapshot().messages}
    s.expect(before <= kept, "no message was lost")
    s.expect(s.transcript(tip.id)[-1].content == "after", "the next turn ran on the tip")


@scenario("A crash before the rotation's commit leaves the session as it was; the next turn "
          "goes on there", invariants=("CMP-5", "CMP-6"), stage="compaction")
def crash_before_rotation(s: Story) -> None:
    _crash_and_recover(s, "before:rotate", rotated=False)


@scenario("A crash right after the rotation's commit leaves one live tip; the next turn finds "
          "it and takes its dead holder's lease", invariants=("CMP-5", "LEASE-1"),
          stage="compaction")
def crash_after_rotation(s: Story) -> None:
    _crash_and_recover(s, "after:rotate", rotated=True)


@scenario("A crash holding the compression lock: a later compaction takes the dead holder's "
          "lock", invariants=("CMP-5", "CMP-6"), stage="compaction")
def crash_holding_the_compression_lock(s: Story) -> None:
    s.script(text("one"), text("two"))
    s.turn("first")
    s.faults(crash="after:compression_lock")
    s.expect(compaction_turn(s, "second", keep_last(2)) is None, "the process died holding it")
    s.faults()
    s.restart()
    compaction_turn(s, "second again", keep_last(2))
    record = s.world.store.snapshot()
    s.expect([g.end_reason for g in record.compression_locks] == ["holder_dead", "released"],
             "the dead holder's lock was taken over, then released")
    s.expect(len(record.compactions) == 1 and len(_live(s)) == 1, "one rotation, one live tip")


@scenario("A routed message for a rotated incarnation heals the route to the lineage's tip",
          invariants=("CMP-5", "SES-2"), stage="compaction")
def route_heals_to_the_tip(s: Story) -> None:
    source = SessionSource(platform="telegram", chat_id="c42")
    s.script(text("one"), text("two"), text("three"))
    s.message(source, "first")
    route = s.route_of(source)
    assert route is not None
    compaction_turn(s, "second", keep_last(2), session=route.session_id)
    tip = _tip(s, route.session_id)
    s.message(source, "third")
    healed = s.route_of(source)
    s.expect(healed is not None and healed.session_id == tip.id,
             "the route now names the tip")
    s.expect(s.transcript(tip.id)[-1].content == "three", "the message ran on the tip")


@scenario("The engine's own compaction rotates the session; the next turn, asked for the "
          "parent, runs on the tip", invariants=("CMP-5", "CMP-6", "LEASE-1"),
          stage="compaction")
def engine_compaction_rotates_and_the_next_turn_finds_the_tip(s: Story) -> None:
    s.limits(context_window_tokens=2_000)  # a small window: a few turns reach its threshold
    filler = "tell me more about the plan " * 5
    history = [m for k in range(19) for m in (
        Message(role=Role.USER, content=f"Question {k}: {filler}"),
        Message(role=Role.ASSISTANT, content=f"Answer {k}: " + "noted. " * 20))]
    s.script(text("Noted."), text("The review is next."), text("Then the release."))
    s.turn("Here is where we are.", history=history)
    s.turn("Question 19, a long one: " + "what about the next step of the plan " * 10)
    record = s.world.store.snapshot()
    s.expect(len(record.compactions) == 1 and record.compactions[0].child_id is not None,
             "the engine compacted once, by rotation")
    tip = _tip(s)
    s.expect(s.world.store.get_session("s-1") is not None and tip.id != "s-1",
             "the parent was rotated away")
    s.turn("And after that?")
    s.expect(s.transcript(tip.id)[-1].content == "Then the release.",
             "the next turn ran on the tip")
    s.expect(_live(s) == [tip.id], "one live tip")


@scenario("A turn that waited through a rotation keeps its place in the child's line, ahead "
          "of a turn that first asked there", invariants=("LEASE-3",), stage="lease")
def waiter_through_a_rotation_is_not_refused(s: Story) -> None:
    """The holder's turn compacts by rotation, its summary 20 s late, while a turn of
    another process waits for the lease. Just after the rotation a third process asks,
    at the child, and then stalls for a minute, so its place in line lapses unused. The
    rotation carried the waiter's place to the child with the lease, so when the holder
    releases at 40.2 s the first poll after it takes the free lease: no live holder and no
    earlier waiter stood in the way (LEASE-3). Left behind on the parent, the waiter would
    be refused a free lease for a poll, behind the later asker's place."""
    s.limits(context_window_tokens=2_000, lease_poll_s=1.0, lease_wait_s_max=300.0)
    filler = "tell me more about the plan " * 5
    history = [m for k in range(19) for m in (
        Message(role=Role.USER, content=f"Question {k}: {filler}"),
        Message(role=Role.ASSISTANT, content=f"Answer {k}: " + "noted. " * 20))]
    provider = s.script(text("Noted."), text("The review is next."), text("I waited."),
                        text("I came later."))
    s.turn("Here is where we are.", history=history)
    provider.summarizer.delay_s = 20.0
    holder, waiter, later = s.main_process(), s.process(), s.process()
    s.delay_reply(2, 20.2)  # the holder's call after the rotation answers at 40.2 s
    s.start_turn("Question 19, a long one: " + "what about the next step of the plan " * 10,
                 process=holder)
    waited = s.start_turn("I waited through it.", process=waiter, after_s=5.7)
    came = s.start_turn("I came after it.", process=later, after_s=20.2)
    s.stall(later, 60.0, after_s=39.9)
    s.run_all()
    record = s.world.store.snapshot()
    s.expect(len(record.compactions) == 1 and record.compactions[0].child_id is not None,
             "the holder's turn rotated the session")
    grants = [g for g in record.lease_grants if g.session_id == record.compactions[0].child_id]
    s.expect(len(grants) == 3 and 20.2 < grants[1].acquired_at - grants[0].acquired_at < 21.2,
             "carried at 20 s, the child's lease went to the waiter at its first poll after "
             "the release at 40.2 s")
    s.expect(waited.result is not None and waited.result.final_response == "I waited.",
             "the waiter answered")
    s.expect(came.result is not None and came.result.final_response == "I came later.",
             "the later turn answered after its stall")


@scenario("A turn asked for a rotated session takes its lineage's lease, a dead holder's "
          "included, never a second lease on the parent", invariants=("LEASE-1",),
          stage="compaction")
def dead_holders_tip_lease_is_taken_not_the_parents(s: Story) -> None:
    """The first process rotates the session and dies during the model call after it,
    still holding the lease the rotation carried to the child. A second process, asked
    for the parent a moment later, must take that same lease: the lineage's one lease,
    free to take because its holder is dead (LEASE-3), now on the tip. A fresh lease on
    the ended parent would make two live leases in one lineage (LEASE-1 per lineage
    root). The second process dies too, before it writes anything, so the grants alone
    tell which lease it took."""
    s.script(text("one"), text("two"))
    s.turn("first")
    other = s.process()
    s.delay_reply(2, 60.0)  # the rotating turn's model call outlives its process
    s.faults(crash="before:recovery")  # the second turn dies as soon as it holds the lease
    start_compaction_turn(s, "from one", keep_last(2))
    s.kill(s.main_process(), after_s=0.5)
    s.start_turn("from two", process=other, after_s=1.0)
    run_all(s)
    tip = _tip(s)
    grants = s.world.store.snapshot().lease_grants
    carried, taken = grants[-2], grants[-1]
    s.expect((carried.session_id, carried.token, carried.end_reason) == (tip.id, 2, "holder_dead"),
             "the rotation carried token 2 to the tip, where its dead holder lost it")
    s.expect((taken.session_id, taken.token) == (tip.id, 3),
             "the second turn took the lineage's lease on the tip, with a new token")
