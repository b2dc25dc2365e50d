"""Stories of the loop under fire: empty replies, failing providers, fallbacks, the user's
hand on a running turn (interrupts and corrections) and the answer a verification held back.

Each story scripts one pressure and shows the loop's decision in the record: the request
that followed (a nudge, a prefill, another provider), the rows it stored and the reason
it ended with.
"""

from __future__ import annotations

from hermes_ref.closure import INTERRUPTED_CALL_TEXT, NOT_RUN_TEXT
from hermes_ref.errors import ProviderAuthError, ProviderRejected, ProviderServerError
from hermes_ref.ladder import RUNGS
from hermes_ref.limits import ProviderRoute
from hermes_ref.models import ProviderReply, Role, ToolCall
from hermes_ref.outcomes import ExitReason, TurnResult
from hermes_ref.scaffolding import EMPTY_AFTER_TOOLS_NUDGE, EMPTY_SENTINEL, PRE_VERIFY_NUDGE
from sim.harness import Story, scenario
from sim.provider import FunctionProvider, text, tool_calls

FALLBACK = ProviderRoute(model="fallback-small", context_window_tokens=4_000, token_ratio=1.25)
EMPTY = ProviderReply(content="")


def thinking(thought: str) -> ProviderReply:
    """A reply that only reasoned: structured reasoning, nothing visible."""
    return ProviderReply(content=None, reasoning=thought)


def _sent_models(s: Story) -> list[str]:
    return [c.request.model for c in s.world.calls]


# ---- LOOP-8: the empty-reply ladder --------------------------------------------------------


@scenario("An empty reply after visible text was streamed answers with that text",
          invariants=("LOOP-8", "FIN-3"), stage="loop_fire")
def streamed_text_answers_an_empty_reply(s: Story) -> None:
    s.limits(stream_replies=False)  # the reply arrives whole, with what it streamed beside it
    s.script(ProviderReply(content="", streamed_text="The build passed on the second try."))
    result = s.turn("Did the build pass?")
    s.expect(result is not None and result.final_response == "The build passed on the second try."
             and result.exit_detail == "partial_stream_recovery", "the streamed text is the answer")
    s.expect(len(s.world.calls) == 1, "no retry was needed")


@scenario("An empty reply after a housekeeping round reuses the text of that round",
          invariants=("LOOP-8", "FIN-3", "TOOL-3"), stage="loop_fire")
def housekeeping_round_text_answers_an_empty_reply(s: Story) -> None:
    s.script(tool_calls(("todo", {"action": "add", "text": "check the logs"}),
                        content="I noted it on your list: check the logs."),
             EMPTY)
    result = s.turn("Remind me to check the logs.")
    s.expect(result is not None and result.final_response == "I noted it on your list: check the logs."
             and result.exit_detail == "fallback_prior_turn_content", "the round's text is the answer")
    s.expect(s.transcript()[-1].content == "I noted it on your list: check the logs.",
             "the answer is the durable tail")


@scenario("Each tool round earns its own nudge: an empty reply after the second round is "
          "nudged again, not retried", invariants=("LOOP-8", "SCAF-1", "TOOL-3"), stage="loop_fire")
def every_tool_round_earns_a_nudge(s: Story) -> None:
    s.files({"a.txt": "alpha", "b.txt": "beta"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})), EMPTY,
             tool_calls(("read_file", {"path": "b.txt"})), EMPTY, text("alpha, then beta."))
    result = s.turn("Read a.txt, then b.txt.")
    s.expect(result is not None and result.final_response == "alpha, then beta.", "answered")
    calls = s.world.calls
    s.expect(len(calls) == 5 and all(calls[n].request.messages[-1].content == EMPTY_AFTER_TOOLS_NUDGE
                                     for n in (2, 4)), "both empty replies were nudged")


@scenario("An empty reply that reasoned in a think block after a tool round gets its reasoning "
          "back as a prefill, not the nudge", invariants=("LOOP-8", "LOOP-4", "SCAF-1"),
          stage="loop_fire")
def inline_reasoning_after_tools_is_prefilled(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})),
             text("<think>The file says alpha.</think>"), text("It says alpha."))
    result = s.turn("What does a.txt say?")
    s.expect(result is not None and result.final_response == "It says alpha.", "answered")
    last = s.world.calls[-1].request.messages[-1]
    s.expect(last.role is Role.ASSISTANT and last.content == "The file says alpha.",
             "the reasoning came back as a prefill")


@scenario("An empty reply after a round that mixed housekeeping with other tools is nudged: "
          "that round's text is no answer", invariants=("LOOP-8", "FIN-3", "TOOL-3"),
          stage="loop_fire")
def mixed_round_text_is_no_answer(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(tool_calls(("todo", {"action": "add", "text": "check a.txt"}),
                        ("read_file", {"path": "a.txt"}), content="Noted, and reading a.txt."),
             EMPTY, text("a.txt says alpha."))
    result = s.turn("Note it and read a.txt.")
    s.expect(result is not None and result.final_response == "a.txt says alpha.",
             "the answer came after the nudge")
    s.expect(s.world.calls[2].request.messages[-1].content == EMPTY_AFTER_TOOLS_NUDGE, "nudged")


@scenario("The empty-reply ladder runs in order: nudge, two prefills, retries, the fallback "
          "provider, its retries, then the (empty) sentinel",
          invariants=("LOOP-8", "LOOP-6", "SCAF-1", "TOOL-3", "LOOP-3"), stage="loop_fire")
def empty_ladder_walks_every_rung_in_order(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.limits(fallback_providers=(FALLBACK,))
    s.script(tool_calls(("read_file", {"path": "a.txt"})), EMPTY,
             thinking("The file says alpha; I should say so."), thinking("Say alpha."),
             thinking("Alpha."), EMPTY, EMPTY, EMPTY)
    s.script_for(FALLBACK.model, EMPTY, EMPTY, EMPTY, EMPTY)
    result = s.turn("What does a.txt say?")
    s.expect(result is not None and result.exit_reason is ExitReason.EMPTY_RESPONSE_EXHAUSTED
             and result.final_response == EMPTY_SENTINEL, "the ladder ended on the sentinel")
    calls = s.world.calls
    s.expect(len(calls) == 12, f"twelve calls in all, not {len(calls)}")
    s.expect(calls[2].request.messages[-1].content == EMPTY_AFTER_TOOLS_NUDGE, "the nudge came first")
    s.expect(calls[3].request.messages[-1].content == "The file says alpha; I should say so.",
             "then the reasoning came back as a prefill")
    s.expect(_sent_models(s)[8:] == [FALLBACK.model] * 4, "the fallback was asked last")
    s.expect(all(m.content not in (EMPTY_SENTINEL, EMPTY_AFTER_TOOLS_NUDGE, "Alpha.")
                 for m in s.transcript()), "no scaffolding and no reasoning was stored")


@scenario("A model that only reasons gets its reasoning back as a prefill twice, then plain "
          "retries, then the sentinel", invariants=("LOOP-8", "SCAF-1", "LOOP-3"),
          stage="loop_fire")
def reasoning_only_replies_walk_the_ladder(s: Story) -> None:
    s.script(*(thinking(f"thought {n}") for n in range(1, 7)))
    result = s.turn("Think it over.")
    s.expect(result is not None and result.exit_reason is ExitReason.EMPTY_RESPONSE_EXHAUSTED,
             "exhausted")
    s.expect(len(s.world.calls) == 6, "two prefills and three retries after the first reply")
    s.expect(all("thought" not in (m.content or "") for m in s.transcript()),
             "no reasoning reached the record")
    s.expect(len(RUNGS) == 7, "the ladder has its seven rungs")


@scenario("A reply whose only content is a think block is empty: its reasoning is never stored",
          invariants=("LOOP-8", "LOOP-4", "FIN-3"), stage="loop_fire")
def inline_think_block_is_not_an_answer(s: Story) -> None:
    s.script(text("<think>They want the date.</think>"), text("<think>ok</think>It is Tuesday."))
    result = s.turn("What day is it?")
    s.expect(result is not None and result.final_response == "It is Tuesday.", "visible text only")
    s.expect(all("think" not in (m.content or "") for m in s.transcript()), "no think block stored")


@scenario("A think block the model never closed runs to the end of the reply: nothing is shown, "
          "so the reply is empty and its reasoning is never stored",
          invariants=("LOOP-8", "LOOP-4"), stage="loop_fire")
def unclosed_think_block_is_not_an_answer(s: Story) -> None:
    s.script(text("<think>They want the date. Today is Tuesday, so"), text("It is Tuesday."))
    result = s.turn("What day is it?")
    s.expect(result is not None and result.final_response == "It is Tuesday.",
             "the unclosed block was no answer, and the next reply was")
    s.expect(all("think" not in (m.content or "") for m in s.transcript()), "no think block stored")


@scenario("A think block never closed before a reply's tool call is reasoning to the end: "
          "the call's row stores none of it",
          invariants=("LOOP-4",), stage="loop_fire")
def unclosed_think_block_before_a_tool_call(s: Story) -> None:
    """The block runs to the end of the text, so the assistant row that carries the call has
    no visible text and stores none of the reasoning (LOOP-4). The turn goes on to read
    the file and answers from it, as it would with the block closed."""
    s.files({"notes.txt": "buy milk"})
    s.script(tool_calls(("read_file", {"path": "notes.txt"}),
                        content="<think>The notes will say, so I read them first and"),
             text("It says: buy milk."))
    result = s.turn("What is in my notes?")
    s.expect(result is not None and result.final_response == "It says: buy milk.", "answered")
    s.expect(all("think" not in (m.content or "") for m in s.transcript()), "no think block stored")


# ---- LOOP-6: fallback providers --------------------------------------------------------------


@scenario("A primary that keeps failing hands the turn to the fallback, rebuilt for its "
          "window; the next turn is back on the primary",
          invariants=("LOOP-6", "LOOP-5", "LOOP-3"), stage="loop_fire")
def failing_primary_falls_back_and_the_next_turn_restores_it(s: Story) -> None:
    s.limits(fallback_providers=(FALLBACK,))
    s.script(*(ProviderServerError("overloaded", status=503) for _ in range(4)),
             text("Back on the primary."))
    s.script_for(FALLBACK.model, text("The fallback answers."))
    first = s.turn("Are you there?")
    s.expect(first is not None and first.final_response == "The fallback answers.",
             "the fallback answered")
    fallback_call = s.world.calls[4]
    s.expect(fallback_call.request.prompt_tokens > 0 and fallback_call.request.model == FALLBACK.model,
             "the fifth call went to the fallback, with a request built for it")
    second = s.turn("And now?")
    s.expect(second is not None and second.final_response == "Back on the primary.",
             "the primary answered the next turn")
    s.expect(_sent_models(s)[-1] == "hermes-ref-model", "the next turn started on the primary")


@scenario("A fallback hop gives back the call it replaced: on the turn's last iteration the "
          "fallback still answers, and the turn spends one unit",
          invariants=("LOOP-2", "LOOP-6", "LOOP-1"), stage="loop_fire")
def fallback_hop_is_refunded(s: Story) -> None:
    s.limits(max_iterations=1, fallback_providers=(FALLBACK,))
    s.script(*(ProviderServerError("overloaded", status=503) for _ in range(4)))
    s.script_for(FALLBACK.model, text("The fallback answers."))
    result = s.turn("Are you there?")
    s.expect(result is not None and result.exit_reason is ExitReason.TEXT_RESPONSE
             and result.final_response == "The fallback answers.",
             "the fallback's call was the same iteration's, not a grace call past the bound")
    s.expect([c.request.purpose for c in s.world.calls][-1] == "turn", "no grace call was needed")
    s.expect(_sent_models(s)[-1] == FALLBACK.model, "the last call went to the fallback")


@scenario("A grace call whose retries are spent on the primary is asked again of the fallback, "
          "and gives back no unit it never spent",
          invariants=("FIN-1", "LOOP-6", "LOOP-2"), stage="loop_fire")
def grace_call_falls_back(s: Story) -> None:
    s.files({"a.txt": "1"})
    s.limits(max_iterations=1, fallback_providers=(FALLBACK,))
    s.script(tool_calls(("read_file", {"path": "a.txt"})),
             *(ProviderServerError("overloaded", status=503) for _ in range(4)))
    s.script_for(FALLBACK.model, text("I read a.txt; it says 1."))
    result = s.turn("Read a.txt.")
    s.expect(result is not None and result.exit_reason is ExitReason.MAX_ITERATIONS
             and result.final_response == "I read a.txt; it says 1.",
             "the fallback's grace summary is the answer")
    s.expect(result is not None and result.budget_used == 1, "one unit: the call that ran the tool")
    s.expect([c.request.purpose for c in s.world.calls][-1] == "grace"
             and _sent_models(s)[-1] == FALLBACK.model, "the grace call went again, to the fallback")


@scenario("A grace call whose retries are spent on the primary switches to a fallback too small "
          "for it: preflight refuses the request rebuilt for the fallback, and nothing more is sent",
          invariants=("LOOP-6", "CMP-7", "FIN-8"), stage="loop_fire")
def grace_call_falls_back_past_the_window(s: Story) -> None:
    tiny = ProviderRoute(model="fallback-tiny", context_window_tokens=60, token_ratio=1.25)
    s.files({"a.txt": "1"})
    s.limits(max_iterations=1, fallback_providers=(tiny,))
    s.script(tool_calls(("read_file", {"path": "a.txt"})),
             *(ProviderServerError("overloaded", status=503) for _ in range(4)))
    result = s.turn("Read a.txt.")
    s.expect(result is not None and "grace call not sent" in result.exit_detail,
             "the grace call rebuilt for the fallback was refused before it was sent")
    s.expect(result is not None and result.exit_reason is ExitReason.PENDING_TOOL_RESULT,
             "no answer came, so the turn says it ended on a tool result")
    s.expect(_sent_models(s) == ["hermes-ref-model"] * 5, "every call went to the primary: "
             "the turn's, then the grace call and its three retries")


@scenario("A reasoning-only reply whose prefill would not fit the window ends the turn closed, "
          "and the request refused is the one that held the prefill",
          invariants=("CMP-7", "LOOP-8"), stage="loop_fire")
def prefill_past_the_window_fails_closed(s: Story) -> None:
    s.limits(context_window_tokens=600)
    s.script(thinking("I considered this at length. " * 90))
    result = s.turn("hello there")
    s.expect(result is not None and result.exit_reason is ExitReason.COMPRESSION_EXHAUSTED,
             "the prefilled request was refused before it was sent")
    s.expect(len(s.world.calls) == 1, "one call: the refused request never went out")


# ---- LOOP-5: classification ------------------------------------------------------------------


@scenario("An auth error renews the credentials once through the port, then the call is made again",
          invariants=("LOOP-5", "LOOP-3"), stage="loop_fire")
def auth_error_refreshes_credentials_once(s: Story) -> None:
    s.script(ProviderAuthError("token expired", status=401), text("Hello again."))
    result = s.turn("Hello?")
    s.expect(result is not None and result.final_response == "Hello again.", "answered after a refresh")
    renewed = [i for i in s.world.interventions if i.what == "credentials"]
    s.expect(len(renewed) == 1, f"one renewal, not {len(renewed)}")


@scenario("An auth error that survives the refresh ends the turn as a terminal provider error",
          invariants=("LOOP-5", "LOOP-3", "FIN-5"), stage="loop_fire")
def auth_error_after_the_refresh_is_terminal(s: Story) -> None:
    s.script(ProviderAuthError("bad key", status=401), ProviderAuthError("bad key", status=401))
    result = s.turn("Hello?")
    s.expect(result is not None and result.exit_reason is ExitReason.TERMINAL_PROVIDER_ERROR,
             "terminal after one refresh")
    s.expect(sum(1 for i in s.world.interventions if i.what == "credentials") == 1,
             "exactly one renewal")


@scenario("A client error that no retry can fix ends the turn at once",
          invariants=("LOOP-5", "LOOP-3", "FIN-5"), stage="loop_fire")
def client_error_ends_the_turn(s: Story) -> None:
    s.limits(fallback_providers=(FALLBACK,))
    s.script(ProviderRejected("unknown parameter", status=400))
    result = s.turn("Hello?")
    s.expect(result is not None and result.exit_reason is ExitReason.TERMINAL_PROVIDER_ERROR
             and len(s.world.calls) == 1, "one call, no fallback for a request the API refuses")


@scenario("A reply the engine cannot process stops the turn at once, without a retry",
          invariants=("LOOP-5", "LOOP-3", "FIN-5"), stage="loop_fire")
def local_processing_bug_stops_at_once(s: Story) -> None:
    deep = tool_calls(("read_file", "[" * 50_000 + "]" * 50_000))
    s.use_provider(FunctionProvider(lambda request: deep))  # it fails the same way every time
    result = s.turn("Read it.")
    s.expect(result is not None and result.exit_reason is ExitReason.LOCAL_PROCESSING_ERROR,
             "ended as a local processing error")
    s.expect(len(s.world.calls) == 1 and not s.world.tools.ledger, "no retry, nothing ran")


@scenario("A reply the engine cannot process ends the turn even when a retry would have "
          "been answered: it is no malformed reply to ask for again",
          invariants=("LOOP-5",), stage="loop_fire")
def local_processing_bug_is_not_retried_into_an_answer(s: Story) -> None:
    """The model's first reply nests its arguments past the parser's limit; asked again,
    it would answer in plain text. A local bug is not the model's malformed JSON: the
    turn ends at once as a local processing error, and the answer a retry would have
    got is never asked for. (Retried, the turn would end well and look healthy, which is
    why LOOP-5 judges the retry itself, not the ending.)"""
    deep = tool_calls(("read_file", "[" * 50_000 + "]" * 50_000))
    replies = iter([deep, text("It is a short file.")])
    s.use_provider(FunctionProvider(lambda request: next(replies)))
    result = s.turn("Read it.")
    s.expect(result is not None and result.exit_reason is ExitReason.LOCAL_PROCESSING_ERROR,
             "ended as a local processing error")
    s.expect(len(s.world.calls) == 1, "the answer a retry would have got was never asked for")


@scenario("Failed calls of one turn stop at the outer error cap whatever retries are left",
          invariants=("LOOP-5", "LOOP-3"), stage="loop_fire")
def outer_error_cap_ends_the_turn(s: Story) -> None:
    s.limits(transient_retries_max=10, outer_loop_errors_max=4)
    s.script(*(ProviderServerError("overloaded", status=503) for _ in range(4)))
    result = s.turn("Hello?")
    s.expect(result is not None and result.exit_reason is ExitReason.TERMINAL_PROVIDER_ERROR
             and "outer_loop_errors_max" in result.exit_detail, "the cap ended it")
    s.expect(len(s.world.calls) == 4, "four calls, then no more")


# ---- FIN-4 / TOOL-3: the user interrupts ---------------------------------------------------


@scenario("The user interrupts a slow model call: the turn ends interrupted, nothing delivered",
          invariants=("FIN-4", "TOOL-3", "LOOP-3", "FIN-5", "LOOP-2"), stage="loop_fire")
def user_interrupts_a_model_call(s: Story) -> None:
    s.limits(stream_replies=False)
    s.script(text("Too late."))
    s.delay_reply(1, 30.0)
    s.interrupt(after_s=10.0)
    result = s.turn("Take your time.")
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED
             and not result.completed, "interrupted")
    s.expect(all(m.content != "Too late." for m in s.transcript()), "the late reply is not stored")


@scenario("The user interrupts a stream: nothing it carried is stored, reasoning least of all",
          invariants=("FIN-4", "LOOP-4", "LOOP-3"), stage="loop_fire")
def user_interrupts_a_stream(s: Story) -> None:
    s.script(ProviderReply(content="Half an answ", reasoning="secret plan"))
    s.delay_reply(1, 30.0)
    s.interrupt(after_s=5.0)
    result = s.turn("Go.")
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED, "interrupted")
    s.expect(all("secret" not in (m.content or "") and "Half" not in (m.content or "")
                 for m in s.transcript()), "nothing of the cut stream was stored")


@scenario("The user interrupts a tool batch: the running call is reported unknown, the unrun "
          "one skipped, and every call keeps exactly one result",
          invariants=("FIN-4", "TOOL-3", "LOOP-3", "FIN-5"), stage="loop_fire")
def user_interrupts_the_tools(s: Story) -> None:
    s.world.tools.slow("terminal", 60.0)
    s.script(tool_calls(("terminal", {"command": "make build"}),
                        ("terminal", {"command": "make test"})))
    s.interrupt(after_s=20.0)
    result = s.turn("Build and test.")
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED, "interrupted")
    results = [m for m in s.transcript() if m.role is Role.TOOL]
    s.expect([m.content for m in results] == [INTERRUPTED_CALL_TEXT, NOT_RUN_TEXT],
             "the running call is unknown, the other was never started")
    s.expect(len(s.world.tools.ledger) == 1, "only the first command started")


@scenario("An interrupted tool batch is closed by the turn the user stopped, even when its "
          "lease outlives it",
          invariants=("FIN-4",), stage="loop_fire")
def interrupted_batch_closed_though_the_release_fails(s: Story) -> None:
    """The user stops a batch of two commands, and the release of the turn's lease then
    fails, so the session stays held until the lease expires. A held session may show an
    open tool group (a turn still at work, or a holder that will be reclaimed), but the
    stopped turn is not at work: it closes its own sequence (FIN-4), one result a call,
    whatever becomes of its lease."""
    s.world.tools.slow("terminal", 60.0)
    s.faults(fail_writes={"release": 1})
    s.script(tool_calls(("terminal", {"command": "make build"}),
                        ("terminal", {"command": "make test"})))
    s.interrupt(after_s=20.0)
    result = s.turn("Build and test.")
    s.expect(result is not None and result.exit_reason is ExitReason.INTERRUPTED, "interrupted")
    s.expect(result is not None and any(e.startswith("release:") for e in result.cleanup_errors),
             "the failed release is reported")
    results = [m for m in s.transcript() if m.role is Role.TOOL]
    s.expect([m.content for m in results] == [INTERRUPTED_CALL_TEXT, NOT_RUN_TEXT],
             "the running call is unknown, the other was never started")


# ---- LOOP-4: corrections during the turn -----------------------------------------------------


@scenario("A correction during a stream keeps only the visible partial, and becomes a user row",
          invariants=("LOOP-4", "CTX-8", "CTX-2", "FIN-3"), stage="loop_fire")
def correction_during_a_stream_keeps_only_visible_text(s: Story) -> None:
    s.script(ProviderReply(content="Reading config.yaml", reasoning="plan: read config.yaml"),
             text("Reading settings.toml instead: it sets the port to 8080."))
    s.delay_reply(1, 30.0)
    s.redirect("No, use settings.toml.", after_s=10.0)
    result = s.turn("What port does the config set?")
    s.expect(result is not None and result.final_response is not None
             and "8080" in result.final_response, "the turn went on and answered")
    rows = s.transcript()
    s.expect([(m.role, m.content) for m in rows[1:3]] == [
        (Role.ASSISTANT, "Reading config.yaml"), (Role.USER, "No, use settings.toml.")],
        "the visible partial, then the correction")
    s.expect(all("plan:" not in (m.content or "") and "plan:" not in (m.api_content or "")
                 for m in rows), "the reasoning was never stored")


@scenario("A correction when nothing was visible yet stores the cut reply hidden",
          invariants=("LOOP-4", "CTX-8", "CTX-2", "FIN-3"), stage="loop_fire")
def correction_with_nothing_visible_is_stored_hidden(s: Story) -> None:
    s.script(thinking("maybe the yaml file"), text("settings.toml sets 8080."))
    s.delay_reply(1, 30.0)
    s.redirect("Look at settings.toml.", after_s=10.0)
    result = s.turn("What port?")
    s.expect(result is not None and result.final_response == "settings.toml sets 8080.", "answered")
    cut = s.transcript()[1]
    s.expect(cut.role is Role.ASSISTANT and cut.hidden and not cut.content
             and cut.api_content is None, "the cut reply is a hidden row")
    s.expect(all(m.get("role") != "assistant" for m in s.world.calls[1].sent["messages"][1:]),
             "the hidden row is not sent")


@scenario("A correction sent while tools run is taken in at the top of the next iteration",
          invariants=("LOOP-4", "CTX-8", "TOOL-3"), stage="loop_fire")
def correction_during_tools_is_taken_at_the_top(s: Story) -> None:
    s.files({"a.txt": "alpha", "b.txt": "beta"})
    s.world.tools.slow("read_file", 30.0)
    s.script(tool_calls(("read_file", {"path": "a.txt"})), text("b.txt says beta."))
    s.redirect("Actually, read b.txt.", after_s=10.0)
    result = s.turn("Read a.txt.")
    s.expect(result is not None and result.final_response == "b.txt says beta.", "answered")
    roles = [(m.role, m.hidden) for m in s.transcript()]
    s.expect(roles[:5] == [(Role.USER, False), (Role.ASSISTANT, False), (Role.TOOL, False),
                           (Role.ASSISTANT, True), (Role.USER, False)],
             "the round, a hidden boundary, then the correction")


@scenario("A correction taken in after a tool round keeps the round's nudge: an empty reply "
          "after it is nudged, not retried",
          invariants=("LOOP-8",), stage="loop_fire")
def correction_keeps_the_rounds_nudge(s: Story) -> None:
    """The user corrects the turn while its read runs; the turn takes the correction in
    before its next call, and that call's reply is empty. The tool round still happened,
    so the ladder's first rung is the nudge after a tool round (LOOP-8): a correction
    adds to the turn, it does not begin a new one, and the ladder's counters stay as
    they were. The nudged reply answers."""
    s.files({"a.txt": "alpha", "b.txt": "beta"})
    s.world.tools.slow("read_file", 30.0)
    s.script(tool_calls(("read_file", {"path": "a.txt"})), EMPTY, text("b.txt says beta."))
    s.redirect("Actually, read b.txt.", after_s=10.0)
    result = s.turn("Read a.txt.")
    s.expect(result is not None and result.final_response == "b.txt says beta.", "answered")
    s.expect(len(s.world.calls) == 3, "the round, the empty reply, and the nudged answer")


# ---- FIN-1: the answer a verification gate held back ----------------------------------------


@scenario("An answer held back for verification is delivered when the budget runs out",
          invariants=("FIN-1", "LOOP-3", "FIN-3", "SCAF-1"), stage="loop_fire")
def withheld_answer_is_reused_when_the_budget_ends(s: Story) -> None:
    s.limits(verify_before_answer=True, max_iterations=3, iteration_budget=3)
    s.script(tool_calls(("write_file", {"path": "out.txt", "content": "42"})), text("Saved 42."),
             tool_calls(("read_file", {"path": "out.txt"})))
    result = s.turn("Save 42 to out.txt.")
    s.expect(result is not None and result.final_response == "Saved 42." and result.completed,
             "the held-back answer was delivered")
    s.expect(all(c.request.purpose != "grace" for c in s.world.calls), "no summary call was made")
    s.expect(s.world.calls[2].request.messages[-1].content == PRE_VERIFY_NUDGE,
             "the model was asked to verify")


@scenario("An answer held back for verification stands when the check's tool round fills "
          "the window and preflight fails the turn closed",
          invariants=("FIN-6", "FIN-1"), stage="loop_fire")
def held_answer_stands_after_the_check_fills_the_window(s: Story) -> None:
    """The model writes a file and answers; the gate holds the answer back and asks for a
    check. The model checks with a read whose result is too big for the window, and
    preflight can make the next request fit by no compaction: the turn fails closed
    (CMP-7). The answer the model gave before the check is still the answer the user
    waits for (FIN-6): it is delivered, not failed, under the reason preflight recorded."""
    s.files({"log.txt": " ".join(f"word{k}" for k in range(600))})
    s.limits(verify_before_answer=True, context_window_tokens=600)
    s.script(tool_calls(("write_file", {"path": "out.txt", "content": "42"})), text("Saved 42."),
             tool_calls(("read_file", {"path": "log.txt"})))
    result = s.turn("Save 42 to out.txt.")
    s.expect(s.world.calls[-1].request.messages[-1].content == PRE_VERIFY_NUDGE,
             "the last request sent asked the model to verify")
    s.expect(result is not None and result.exit_reason is ExitReason.COMPRESSION_EXHAUSTED,
             "preflight failed the turn closed after the check's read")
    s.expect(result is not None and result.final_response == "Saved 42." and result.completed,
             "the held-back answer was delivered")


def _held_then(s: Story, *check: object) -> None:
    """The model writes a file and answers "Saved 42."; the gate holds the answer back and
    asks for a check, which ``check`` (the provider's next replies) then fails."""
    s.limits(verify_before_answer=True)
    s.script(tool_calls(("write_file", {"path": "out.txt", "content": "42"})), text("Saved 42."),
             *check)


def _held_answer_stood(s: Story, result: TurnResult | None, reason: ExitReason) -> None:
    s.expect(result is not None and result.exit_reason is reason,
             f"the check failed the turn: {reason.value}")
    s.expect(result is not None and result.final_response == "Saved 42." and result.completed,
             "the held-back answer was delivered, not the failure's text")
    rows = s.transcript()
    s.expect(bool(rows) and rows[-1].content == "Saved 42.", "the answer is the durable tail")


@scenario("An answer held back for verification stands when the provider refuses the "
          "request that asks for the check", invariants=("FIN-6", "FIN-1"), stage="loop_fire")
def held_answer_stands_when_the_check_is_refused(s: Story) -> None:
    """A refusal (a 400) is terminal: no retry, no fallback. The check never happened, but
    the model had answered, and that answer is what the user waits for (FIN-6). Before, the
    turn failed and said "Nothing was lost", having lost the answer."""
    _held_then(s, ProviderRejected("unknown parameter", status=400))
    result = s.turn("Save 42 to out.txt.")
    s.expect(s.world.calls[-1].request.messages[-1].content == PRE_VERIFY_NUDGE,
             "the refused request was the one that asked the model to verify")
    _held_answer_stood(s, result, ExitReason.TERMINAL_PROVIDER_ERROR)


@scenario("An answer held back for verification stands when the model's replies to the "
          "check run the empty ladder out", invariants=("FIN-6", "FIN-1"), stage="loop_fire")
def held_answer_stands_past_an_empty_ladder(s: Story) -> None:
    """Asked to check its work, the model says nothing, again and again, until the ladder
    ends the turn on its sentinel (LOOP-8). The sentinel is scaffolding; the answer the
    model gave before the check is delivered instead."""
    _held_then(s, *(EMPTY for _ in range(5)))
    _held_answer_stood(s, s.turn("Save 42 to out.txt."), ExitReason.EMPTY_RESPONSE_EXHAUSTED)


@scenario("An answer held back for verification stands when the model checks with tools that "
          "do not exist, round after round", invariants=("FIN-6", "FIN-1"), stage="loop_fire")
def held_answer_stands_past_rounds_of_missing_tools(s: Story) -> None:
    """Each checking round names a tool the engine does not have; each is answered with an
    error in place (TOOL-2), and the third ends the turn (``invalid_tool_calls``). The
    rounds are stored and closed; the held answer follows them as the turn's last row."""
    _held_then(s, *(tool_calls(("verify_file", {"path": "out.txt"})) for _ in range(3)))
    _held_answer_stood(s, s.turn("Save 42 to out.txt."), ExitReason.INVALID_TOOL_CALLS)


def _corrected_during_the_check(s: Story, cap: int, *after: object) -> TurnResult | None:
    """The model writes 42 and answers "Saved 42.", which the gate holds back; it checks
    with a read that runs 30 s, during which the user writes "Make it 43." ``cap`` is the
    call cap and the budget; ``after`` the model's replies after the read."""
    s.limits(verify_before_answer=True, max_iterations=cap, iteration_budget=cap)
    s.world.tools.slow("read_file", 30.0)
    s.script(tool_calls(("write_file", {"path": "out.txt", "content": "42"})), text("Saved 42."),
             tool_calls(("read_file", {"path": "out.txt"})), *after)
    s.redirect("Make it 43.", after_s=10.0)
    return s.turn("Save 42 to out.txt.")


def _summary_answered(s: Story, result: TurnResult | None, summary: str) -> None:
    s.expect(s.world.calls[-1].request.purpose == "grace", "the budget's end asked for a summary")
    s.expect(result is not None and result.final_response == summary,
             "the summary is the answer, not the answer the correction overruled")


@scenario("A correction taken in while the model checks its work overrules the answer the gate "
          "held back: the budget's end asks for a summary instead",
          invariants=("FIN-1", "LOOP-4"), stage="loop_fire")
def correction_overrules_the_held_answer(s: Story) -> None:
    """The model writes 42 and answers; the gate holds "Saved 42." back and asks for a
    check. While the checking read runs, the user writes "Make it 43."; the turn takes the
    correction in at the loop's top, and the model writes 43, the last call the cap allows.
    The held answer answered what the user asked before: delivered now, it would answer
    the correction with the very answer it corrects. So the budget's end asks for a
    summary, written after the correction, and that is the answer."""
    result = _corrected_during_the_check(s, 4, tool_calls(
        ("write_file", {"path": "out.txt", "content": "43"})), text("Saved 43, as corrected."))
    s.expect(s.world.calls[2].request.messages[-1].content == PRE_VERIFY_NUDGE,
             "the model was asked to verify")
    s.expect(s.world.calls[3].request.messages[-1].content == "Make it 43.",
             "the correction was taken in before the next call")
    _summary_answered(s, result, "Saved 43, as corrected.")


@scenario("A correction sent during the last tool round the budget allows, while the gate holds "
          "an answer, is taken in and overrules it",
          invariants=("LOOP-4", "FIN-1"), stage="loop_fire")
def correction_in_the_last_round_overrules_the_held_answer(s: Story) -> None:
    """The checking read is the last round the cap of 3 allows, and the user writes "Make
    it 43." while it runs. Leaving the loop, the turn takes the correction in (it would
    otherwise end with the turn, unread) and it overrules the held answer, so the
    budget's end asks for a summary."""
    result = _corrected_during_the_check(s, 3, text("42 is saved; 43 is next."))
    s.expect(any(m.role is Role.USER and m.content == "Make it 43." for m in s.transcript()),
             "the correction is a user row of the turn")
    _summary_answered(s, result, "42 is saved; 43 is next.")


@scenario("An answer held back for verification stands when the model's reply to the check "
          "cuts its tool call off at the length limit",
          invariants=("FIN-6", "FIN-1"), stage="loop_fire")
def held_answer_stands_past_a_cut_off_check(s: Story) -> None:
    """The checking call's arguments are cut off by the output limit: the turn ends
    ``truncated_tool_call`` without running or storing the call (LOOP-9), and the answer
    the model gave before the check is delivered in place of the truncation notice."""
    cut = ProviderReply(content="", finish_reason="length",
                        tool_calls=(ToolCall(id="c-9", name="read_file",
                                             arguments='{"path": "out.t'),))
    _held_then(s, cut)
    _held_answer_stood(s, s.turn("Save 42 to out.txt."), ExitReason.TRUNCATED_TOOL_CALL)


@scenario("An answer held back for verification stands when the model's reply to the check "
          "cannot be processed", invariants=("FIN-6", "FIN-1"), stage="loop_fire")
def held_answer_stands_past_an_unprocessable_check(s: Story) -> None:
    """The checking call's arguments nest deeper than the parser allows: the reply cannot
    be processed and the turn stops at once (``local_processing_error``, LOOP-5). The held
    answer is delivered in place of the error text."""
    deep = "[" * 5000 + "]" * 5000
    _held_then(s, ProviderReply(content="", finish_reason="tool_calls", tool_calls=(
        ToolCall(id="c-9", name="read_file", arguments=f'{{"path": {deep}}}'),)))
    _held_answer_stood(s, s.turn("Save 42 to out.txt."), ExitReason.LOCAL_PROCESSING_ERROR)


@scenario("An answer given after verifying is the one delivered",
          invariants=("FIN-1", "LOOP-3", "SCAF-1"), stage="loop_fire")
def verified_answer_is_delivered(s: Story) -> None:
    s.limits(verify_before_answer=True)
    s.script(tool_calls(("write_file", {"path": "out.txt", "content": "42"})), text("Saved 42."),
             tool_calls(("read_file", {"path": "out.txt"})), text("Saved 42, and checked it."))
    result = s.turn("Save 42 to out.txt.")
    s.expect(result is not None and result.final_response == "Saved 42, and checked it.",
             "the verified answer is the answer")


@scenario("A fallback with a smaller window gets a request rebuilt and preflighted for that "
          "window, never the primary's request as it was",
          invariants=("LOOP-6", "CMP-7"), stage="loop_fire")
def fallback_request_fits_the_fallback_window(s: Story) -> None:
    tiny = ProviderRoute(model="fallback-tiny", context_window_tokens=200, token_ratio=1.25)
    s.files({"big.txt": "; ".join(["the quarterly figures, in words"] * 20) + "."})
    s.limits(fallback_providers=(tiny,))
    s.script(tool_calls(("read_file", {"path": "big.txt"})),
             *(ProviderServerError("overloaded", status=503) for _ in range(4)))
    s.use_provider_for(tiny.model, FunctionProvider(lambda request: text("Figures, summarized.")))
    result = s.turn("Summarize big.txt.")
    s.expect(result is not None, "the turn ended")
    big = [c for c in s.world.calls if c.request.model == tiny.model
           and c.request.prompt_tokens > tiny.context_window_tokens]
    s.expect(not big, "no request past the fallback's window was sent to it")


@scenario("A model that never says anything ends on the sentinel within the calls its limits "
          "allow", invariants=("LOOP-8", "LOOP-3"), stage="loop_fire")
def silent_model_ends_within_the_bound(s: Story) -> None:
    s.limits(max_iterations=20, iteration_budget=20)
    s.use_provider(FunctionProvider(lambda request: EMPTY))
    result = s.turn("Hello?")
    s.expect(result is not None and result.exit_reason is ExitReason.EMPTY_RESPONSE_EXHAUSTED,
             "the ladder ran out")
    s.expect(len(s.world.calls) == 4, f"the first reply and three retries, not {len(s.world.calls)}")
