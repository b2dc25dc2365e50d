"""Stories of an overflow that is survived: compaction before a call, after a provider's
refusal, and what it may never lose (CMP-1..4, CMP-7, CTX-5..7, LOOP-5, FIN-5).

The windows are small (2,000 tokens: the threshold is then 85 % of it, 1,700, and the tail
keeps 340 tokens) so that a few turns of chat reach them. The summaries come from the
world's summarizer (``sim.summarizer``), not from the turn's script.
"""

from __future__ import annotations

from hermes_ref.compression import PRUNED_PREFIX, SUMMARY_PREFIX
from hermes_ref.errors import ContextOverflow, ProviderServerError, ProviderTimeout
from hermes_ref.models import Message, ProviderReply, Role
from hermes_ref.outcomes import ExitReason
from sim.harness import Story, scenario
from sim.provider import text, tool_calls

WINDOW = 2_000
FILLER = "tell me more about the plan "


def chat(pairs: int, words: int = 5) -> list[Message]:
    """A caller's history of ``pairs`` questions and answers, about 42 tokens a message."""
    rows: list[Message] = []
    for k in range(pairs):
        rows.append(Message(role=Role.USER, content=f"Question {k}: " + FILLER * words))
        rows.append(Message(role=Role.ASSISTANT, content=f"Answer {k}: " + "noted. " * 20))
    return rows


def long_question(k: int) -> str:
    return f"Question {k}, a long one: " + "what about the next step of the plan " * 10


def summaries(s: Story, session: str | None = None) -> list[Message]:
    """The summary rows of every live transcript (or of one session)."""
    record = s.world.store.snapshot()
    return [m.message for m in record.messages
            if (session is None or m.session_id == session)
            and (m.message.content or "").startswith(SUMMARY_PREFIX)]


def live_session(s: Story) -> str:
    """The lineage's tip: the one session not ended by a rotation."""
    record = s.world.store.snapshot()
    return next(r.id for r in reversed(record.sessions) if r.end_reason != "compression")


@scenario("A turn whose request passes the threshold is compacted before its first call, "
          "and the request it sends fits",
          invariants=("CMP-1", "CMP-2", "CTX-6", "LOOP-2"), stage="compaction")
def threshold_compaction_before_the_first_call(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.script(text("Noted."), text("The next step is the review."))
    s.turn("Here is where we are.", history=chat(19))
    s.expect(not s.world.summary_calls, "the first turn stayed under the threshold")
    result = s.turn(long_question(19))
    s.expect(result is not None and result.exit_reason is ExitReason.TEXT_RESPONSE,
             "answered after the compaction")
    s.expect(len(s.world.summary_calls) == 1, "one summary call, before the turn's only call")
    s.expect(result is not None and (result.api_calls, result.budget_used) == (1, 1),
             "the pass cost no budget unit and no API call")
    s.expect(len(summaries(s)) == 1, "the compacted transcript holds one summary")


@scenario("A provider-proven overflow goes back to preflight: compaction relieves it and the "
          "smaller request is sent",
          invariants=("CMP-7", "LOOP-5", "CMP-2"), stage="compaction")
def provider_overflow_is_compacted_and_retried(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.script(text("Noted."), ContextOverflow("maximum context length exceeded", status=400),
             text("Here is the short version."))
    s.turn("Here is where we are.", history=chat(12))
    result = s.turn("Summarize everything so far.")
    s.expect(result is not None and result.final_response == "Here is the short version.",
             "the retried request was answered")
    turn_calls = [c for c in s.world.calls if c.turn_id == (result.turn_id if result else "")]
    s.expect(len(turn_calls) == 2 and len(turn_calls[1].body) < len(turn_calls[0].body),
             "the retry is a smaller request")
    s.expect(len(s.world.summary_calls) == 1, "one forced pass")


@scenario("The request rebuilt after an overflow is a new request with retries of its own: "
          "transient errors before the overflow do not use them up",
          invariants=("LOOP-5", "CMP-7"), stage="compaction")
def rebuilt_request_gets_its_own_retries(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    busy = [ProviderServerError("overloaded", status=503) for _ in range(5)]
    s.script(text("Noted."), busy[0], busy[1],
             ContextOverflow("maximum context length exceeded", status=400),
             busy[2], busy[3], busy[4], text("Here is the short version."))
    s.turn("Here is where we are.", history=chat(12))
    result = s.turn("Summarize everything so far.")
    s.expect(result is not None and result.final_response == "Here is the short version.",
             "the rebuilt request was retried three times, then answered")
    s.expect(len(s.world.summary_calls) == 1, "one forced pass")


@scenario("The request rebuilt after an overflow leaves out the hidden row a correction left, "
          "as every request does", invariants=("LOOP-4", "CMP-7", "LOOP-5"), stage="compaction")
def rebuilt_request_leaves_the_hidden_row_out(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.script(text("Noted."), ProviderReply(content=None, reasoning="maybe the plan changed"),
             ContextOverflow("maximum context length exceeded", status=400),
             text("Here is the short version."))
    s.turn("Here is where we are.", history=chat(12))
    s.delay_reply(2, 30.0)
    s.redirect("Summarize, do not guess.", after_s=10.0)
    result = s.turn("Summarize everything so far.")
    s.expect(result is not None and result.final_response == "Here is the short version.",
             "the rebuilt request was answered")
    sent = s.world.calls[-1].sent["messages"]
    s.expect(not any(m["role"] == "assistant" and not m.get("content") and not m.get("tool_calls")
                     for m in sent), "no empty assistant message went out")


@scenario("An overflow that compaction cannot relieve fails closed: the refused request is "
          "not sent again, and no boundary row is added; the next turn closes that tail first",
          invariants=("CMP-7", "LOOP-5", "FIN-5", "CTX-9"), stage="compaction")
def overflow_that_cannot_be_relieved_fails_closed(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.script(ContextOverflow("maximum context length exceeded", status=400), text("Hello again."))
    result = s.turn("Hello there.")
    s.expect(result is not None and result.exit_reason is ExitReason.COMPRESSION_EXHAUSTED,
             "failed closed with the context-pressure exit")
    s.expect(len(s.world.calls) == 1 and not s.world.summary_calls,
             "nothing to compact, nothing sent again")
    rows = s.transcript()
    s.expect(rows[-1].role is Role.USER, "context pressure adds no boundary row (FIN-5)")
    again = s.turn("Hi?")  # the same process: its cached history ends on that user row
    s.expect(again is not None and again.final_response == "Hello again.", "the next turn answers")
    roles = [m.role for m in s.transcript()[len(rows):]]
    s.expect(roles == [Role.ASSISTANT, Role.USER, Role.ASSISTANT],
             "it closed the open tail before its own user row")


@scenario("Old tool outputs are pruned first, without a model call, when that is enough",
          invariants=("CMP-2", "CMP-3"), stage="compaction")
def old_tool_outputs_are_pruned_first(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.files({f"log{k}.txt": f"entry {k}: " + "all systems nominal; " * 50 for k in range(4)})
    s.script(text("Noted."), tool_calls(*(("read_file", {"path": f"log{k}.txt"}) for k in range(4))),
             text("All four logs are nominal."), *(text(f"Reply {k}.") for k in range(6)),
             text("Still nominal."))
    s.turn("Here is where we are.", history=chat(2))
    s.turn("Read the four logs.")
    for k in range(6):
        s.turn(f"Follow-up {k}: " + FILLER * 6)
    result = s.turn(long_question(9))
    s.expect(result is not None and result.final_response == "Still nominal.", "answered")
    s.expect(not s.world.summary_calls, "no summary was needed")
    rows = s.transcript(live_session(s))
    s.expect(sum(1 for m in rows if (m.content or "").startswith(PRUNED_PREFIX)) == 4,
             "the four old outputs were pruned in the compacted transcript")


@scenario("A later compaction updates the earlier summary instead of starting over",
          invariants=("CMP-2", "CTX-6"), stage="compaction")
def later_compaction_updates_the_summary(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.script(text("Noted."), *(text(f"Reply {k}.") for k in range(14)))
    s.turn("Here is where we are.", history=chat(19))
    for k in range(14):
        s.turn(long_question(18 + k))
    calls = s.world.summary_calls
    s.expect(len(calls) >= 2, "the conversation was compacted at least twice")
    first = calls[0].reply.content if calls and calls[0].reply else ""
    later = calls[1].request.messages[-1].content if len(calls) > 1 else ""
    s.expect(bool(first) and first in (later or ""), "the second summary request carries the first")


@scenario("A tool round at the tail's edge keeps its calls and results together",
          invariants=("CMP-3", "CMP-2"), stage="compaction")
def tool_pairs_stay_together_across_compaction(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.files({f"n{k}.txt": f"note {k}: ok" for k in range(3)})  # too short to prune
    s.script(text("Noted."),
             tool_calls(*(("read_file", {"path": f"n{k}.txt"}) for k in range(3))),
             text("Three notes read."), text("Yes."), text("Sure."), text("Done."))
    s.turn("Here is where we are.", history=chat(16))
    s.turn("Read the three notes.")
    s.turn("All of them?")
    s.turn("And the receipts?")
    result = s.turn(long_question(13) * 3)
    s.expect(result is not None and result.final_response == "Done.", "answered")
    s.expect(len(s.world.summary_calls) >= 1, "it was compacted")


@scenario("A tail whose token budget runs out among a round's results starts at their call",
          invariants=("CMP-3",), stage="compaction")
def tail_budget_spent_inside_a_tool_group(s: Story) -> None:
    """Here the floor of eight messages is met by short chat after the round, and the tail
    goes on back over the round until its budget is spent: the budget runs out after the
    last result, so the tail's start is moved back to the call, and all three results are
    kept with it. Cut there instead, the call would go into the summary while its last
    result was cut away from it (CMP-3); the last eight messages are kept either way."""
    s.limits(context_window_tokens=WINDOW)
    s.files({f"n{k}.txt": f"note {k}: " + "ok " * 80 for k in range(3)})
    s.script(text("Noted."),
             tool_calls(*(("read_file", {"path": f"n{k}.txt"}) for k in range(3))),
             text("Three notes read."), *(text("Yes.") for _ in range(4)), text("Done."))
    s.turn("Here is where we are.", history=chat(15))
    s.turn("Read the three notes.")
    for k in range(4):
        s.turn(f"And note {k}?")
    result = s.turn("Question, a long one: " + "what about the next step of the plan " * 10)
    s.expect(result is not None and result.final_response == "Done.", "answered")
    s.expect(len(s.world.summary_calls) == 1, "it was compacted once")
    rows = s.transcript(live_session(s))
    calls = [m for m in rows if m.tool_calls]
    results = [m for m in rows if m.role is Role.TOOL]
    s.expect(len(calls) == 1 and len(results) == 3,
             "the round's call and its three results are all in the compacted transcript")


@scenario("A turn compacted before its first call is measured again before each later call, "
          "and compacts again as its tool results fill the window",
          invariants=("CMP-7",), stage="compaction")
def every_call_of_a_turn_is_measured(s: Story) -> None:
    """The turn's own long question passes the threshold, so it compacts before its first
    call; then it reads six parts of a plan, one a round, each result some nine
    hundred characters. Preflight measures every request, not only the first: past the threshold again
    the turn compacts again, and no request it sends is past the window (CMP-7). Measured
    only once, the later requests would grow past the window and be sent anyway."""
    s.limits(context_window_tokens=WINDOW)
    s.files({f"part{k}.txt": f"part {k}: " + "the plan " * 100 for k in range(6)})
    s.script(text("Noted."),
             *(tool_calls(("read_file", {"path": f"part{k}.txt"})) for k in range(6)),
             text("All six parts read."))
    s.turn("Here is where we are.", history=chat(19))
    result = s.turn(long_question(19) + " Read the six parts one by one.")
    s.expect(result is not None and result.final_response == "All six parts read.", "answered")
    s.expect(len(s.world.summary_calls) >= 2, "compacted before its first call and again later")


@scenario("A summary that times out loses no message; a request that then does not fit fails "
          "closed as a compression timeout",
          invariants=("CMP-7", "CMP-4", "FIN-5"), stage="compaction")
def summary_timeout_fails_closed_and_loses_nothing(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    provider = s.script(text("Noted."))
    provider.summarizer.fail(ProviderTimeout("the summarizer did not answer in time"))
    s.turn("Here is where we are.", history=chat(19))
    before = s.transcript()
    result = s.turn(long_question(19) * 4)
    s.expect(result is not None and result.exit_reason is ExitReason.COMPRESSION_TIMEOUT,
             "failed closed as a compression timeout")
    s.expect(len(s.world.calls) == 1, "the request that did not fit was never sent")
    rows = s.transcript()
    s.expect(rows[:len(before)] == before and len(rows) == len(before) + 1,
             "every row is still there, and the user row was added (no boundary row)")


@scenario("A failed summary starts a cooldown with no further compaction; a manual "
          "compaction runs inside it",
          invariants=("CMP-4", "CMP-7"), stage="compaction")
def summary_failure_cools_down_and_manual_bypasses(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    provider = s.script(text("Noted."), text("Still here."), text("Still here, again."),
                        text("Compacted and here."))
    provider.summarizer.fail(ProviderServerError("summarizer unavailable", status=503))
    s.turn("Here is where we are.", history=chat(19))
    s.turn(long_question(19))
    s.expect(len(s.world.summary_calls) == 1 and s.world.summary_calls[0].error is not None,
             "the summary failed and the request, which fit the window, was sent")
    s.turn("One more short question.")
    s.expect(len(s.world.summary_calls) == 1, "no compaction inside the cooldown")
    s.request_compaction("s-1")
    result = s.turn("And after a manual compaction?")
    s.expect(len(s.world.summary_calls) == 2 and s.world.summary_calls[1].error is None,
             "the manual compaction ran in the cooldown")
    s.expect(result is not None and result.final_response == "Compacted and here.", "answered")


@scenario("A summary that times out starts the cooldown as a failed one does",
          invariants=("CMP-4",), stage="compaction")
def summary_timeout_cools_down(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    provider = s.script(text("Noted."), text("Still here."), text("Still here, again."))
    provider.summarizer.fail(ProviderTimeout("the summarizer did not answer in time"))
    s.turn("Here is where we are.", history=chat(19))
    s.turn(long_question(19))
    s.expect(len(s.world.summary_calls) == 1 and s.world.summary_calls[0].error is not None,
             "the summary timed out and the request, which fit the window, was sent")
    s.turn("One more short question.")
    s.expect(len(s.world.summary_calls) == 1, "no compaction inside the cooldown")


@scenario("Two ineffective passes block automatic compaction for the session",
          invariants=("CMP-4", "CTX-6"), stage="compaction")
def ineffective_passes_block_automatic_compaction(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW, compression_tail_floor_messages=10)
    s.script(text("Noted."), *(text(f"Reply {k}.") for k in range(3)))
    s.turn("Here is where we are.", history=chat(6))
    s.turn("A very long paste follows. " + "the quarterly figures line by line " * 150)
    passes = len(s.world.summary_calls)
    s.expect(passes == 2, f"two passes left the request over the threshold ({passes})")
    s.turn(long_question(20))
    s.turn("Short one.")
    s.expect(len(s.world.summary_calls) == passes, "no automatic pass after the block")


@scenario("A pass that makes no progress stops the passes before the first call",
          invariants=("CTX-6",), stage="compaction")
def passes_stop_without_progress(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW, compression_tail_floor_messages=15)
    provider = s.script(text("Noted."), text("Answered."))
    provider.summarizer.say("A summary as long as the one message it replaces, or longer.")
    s.turn("Here is where we are.", history=chat(8, words=20))
    result = s.turn(long_question(8) * 2)
    s.expect(len(s.world.summary_calls) == 1, "one pass: it made no progress, so none followed")
    s.expect(result is not None and result.final_response == "Answered.",
             "the request, over the threshold but within the window, was sent")


@scenario("A session idle past idle_compact_after_s is compacted at its next turn's start",
          invariants=("CTX-5",), stage="compaction")
def idle_session_is_compacted_at_turn_start(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW, idle_compact_after_s=600.0)
    s.script(text("Noted."), text("Quick answer."), text("Welcome back."))
    s.turn("Here is where we are.", history=chat(10))
    s.advance(300)
    s.turn("A quick question.")
    s.expect(not s.world.summary_calls, "300 s is not idle")
    s.advance(700)
    result = s.turn("I am back.")
    s.expect(len(s.world.summary_calls) == 1, "the idle session was compacted")
    s.expect(result is not None and result.final_response == "Welcome back.", "answered")


@scenario("A turn that waited in line for the session's lease did not come after an idle gap: "
          "the gap runs from the previous user row to its own, not to when it got the lease "
          "(explored seed 121)", invariants=("CTX-5", "LEASE-1"), stage="compaction")
def waiting_for_the_lease_is_no_idle_gap(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW, idle_compact_after_s=30.0)
    s.files({"slow.txt": "slow"})
    s.world.tools.slow("read_file", 40.0, path="slow.txt")
    s.script(text("Noted."), tool_calls(("read_file", {"path": "slow.txt"})), text("It says slow."),
             text("Quick answer."))
    s.turn("Here is where we are.", history=chat(10))
    other = s.process()
    s.start_turn("Read slow.txt.")
    s.start_turn("A quick question.", process=other, after_s=5.0)  # waits in line 35 s
    s.run_all()
    s.expect(not s.world.summary_calls, "5 s between the two user rows is no idle gap")
    s.expect([m.content for m in s.transcript()][-2:] == ["A quick question.", "Quick answer."],
             "the waiting turn ran after the slow one, and answered")


@scenario("A compaction's pruned copy of a recovered call's unknown report is a copy, not a "
          "second report: the report stands where recovery wrote it (explored seed 121)",
          invariants=("TOOL-10", "CMP-2", "CMP-5"), stage="compaction")
def pruned_copy_of_a_recovery_report(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.files({"notes.txt": "draft"})
    s.faults(crash="after:tool_calls")
    s.script(tool_calls(("read_file", {"path": "notes.txt"})))
    s.turn("What do my notes say?", history=chat(6))
    s.restart()
    s.faults()
    s.files({"big.txt": "a long log line\n" * 90})
    s.script(text("Ask me again."), tool_calls(("read_file", {"path": "big.txt"})),
             text("It is a long log."), *(text(f"Answer {k}.") for k in range(8)))
    s.turn("Are you there?")  # recovery reports the open call unknown
    s.turn("Read big.txt.")
    for k in range(8):
        s.turn(long_question(k))
    record = s.world.store.snapshot()
    pruned = [m for m in record.messages if m.message.role is Role.TOOL
              and (m.message.content or "").startswith(PRUNED_PREFIX)]
    s.expect(bool(record.compactions) and len(pruned) >= 2 and not s.world.summary_calls,
             "the session compacted by pruning alone, and its child holds the report pruned")


@scenario("A long turn's own user message survives a mid-turn compaction, found again by "
          "its text",
          invariants=("CTX-7", "CMP-3"), stage="compaction")
def current_user_message_is_relocated(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.files({f"part{k}.txt": f"part {k}: in order" for k in range(9)})
    steps = [text("Noted."), text("Reading on.")]
    steps += [tool_calls(("read_file", {"path": f"part{k}.txt"}),
                         content=f"Part {k}: " + "checking the figures carefully " * 12)
              for k in range(9)]
    s.script(*steps, text("All nine parts read."))
    s.turn("Continue.", history=chat(8))
    s.turn("Continue.")
    result = s.turn("Continue.")  # the same text as two earlier turns: the last one is its own
    s.expect(result is not None and result.final_response == "All nine parts read.", "answered")
    s.expect(len(s.world.summary_calls) >= 1, "the turn was compacted mid-way")
    last = s.world.calls[-1].sent["messages"]
    own = [m for m in s.transcript(live_session(s)) if m.role is Role.USER
           and result is not None and m.turn_id == result.turn_id]
    s.expect(len(own) == 1 and sum(1 for m in last if m.get("content") == "Continue.") >= 1,
             "the compacted transcript and the last request keep the turn's own message")


@scenario("A crash during the summary call loses no message; the next process compacts",
          invariants=("CMP-7",), stage="compaction")
def crash_during_the_summary_call_loses_no_message(s: Story) -> None:
    s.limits(context_window_tokens=WINDOW)
    s.script(text("Noted."), text("Back after the crash."))
    s.turn("Here is where we are.", history=chat(19))
    rows_before = len(s.transcript())
    summarizer = s.world.provider.summarizer  # type: ignore[attr-defined]
    summarizer.delay_s = 30.0
    s.kill(s.main_process(), after_s=10.0)
    first = s.turn(long_question(19))
    s.expect(first is None and len(s.world.summary_calls) == 1,
             "the process died while its summary call was in flight")
    s.expect(len(s.transcript()) == rows_before + 1, "every row is still there, the user row too")
    s.restart()
    summarizer.delay_s = 0.0
    result = s.turn(long_question(20))
    s.expect(result is not None and result.final_response == "Back after the crash.", "answered")
    s.expect(len(s.world.summary_calls) == 2 and s.world.summary_calls[1].error is None,
             "the next process compacted the session")
