"""Stories of turns that end in plain text."""

from __future__ import annotations

from hermes_ref.errors import ProviderAuthError, ProviderRejected, ProviderServerError, RateLimited
from hermes_ref.models import ProviderReply, Role
from hermes_ref.outcomes import ExitReason
from hermes_ref.wire import ProviderRequest
from sim.harness import Story, scenario
from sim.provider import FunctionProvider, text, tool_calls


@scenario("A plain question gets a plain answer and the transcript ends on it",
          invariants=("CTX-1", "CTX-4", "CTX-8", "WIRE-3", "LOOP-3", "FIN-3", "FIN-7", "DEL-1"),
          stage="text")
def plain_question_gets_plain_answer(s: Story) -> None:
    s.script(text("Paris."))
    result = s.turn("What is the capital of France?")
    s.expect(result is not None and result.final_response == "Paris.", "the answer is returned")
    s.expect(result is not None and result.exit_reason is ExitReason.TEXT_RESPONSE,
             "the exit reason is text_response")
    rows = s.transcript()
    s.expect([r.role for r in rows] == [Role.USER, Role.ASSISTANT], "user row, then the answer")


@scenario("The second turn sends exactly the stored history, sidecar bytes included",
          invariants=("CTX-1", "CTX-2", "CTX-3", "CTX-4", "WIRE-1", "WIRE-3", "LOOP-2"), stage="text")
def second_turn_replays_stored_history(s: Story) -> None:
    s.script(text("Noted."), text("You asked me to remember blue."))
    s.turn("Remember: blue.", injected="memory: the user likes short answers")
    second = s.turn("What did I ask you to remember?")
    s.expect(second is not None and second.budget_used == 1, "the second turn starts a fresh budget")
    first_user = s.transcript()[0]
    s.expect(first_user.api_content is not None and first_user.content == "Remember: blue.",
             "the injected context lives only in the api_content sidecar")


@scenario("A blank message's injected context is replayed from its sidecar in later turns",
          invariants=("WIRE-1",), stage="text")
def blank_message_replays_its_sidecar(s: Story) -> None:
    """The user's message has no words (a blank line a platform passed on), but the turn
    was given memory to inject. The row stores the blank text and keeps the injection in
    its ``api_content`` sidecar; every later request sends the sidecar's bytes for that
    row, so the model sees in turn two the very context it answered in turn one (WIRE-1),
    and the cached prefix still repeats. Nothing in the bare text would show the loss."""
    s.script(text("Noted."), text("Short answers, as you like."))
    s.turn(" ", injected="memory: the user likes short answers")
    s.turn("How do I like my answers?")
    first = s.transcript()[0]
    s.expect(first.content == " " and "short answers" in (first.api_content or ""),
             "the row keeps the blank text, the injection in its sidecar")
    sent = [m.get("content") for m in s.world.calls[-1].sent["messages"]
            if m.get("role") == "user"]
    s.expect(sent[:1] == [first.api_content], "the second turn replays the sidecar's bytes")


@scenario("A rate limit and a server error are retried without spending budget",
          invariants=("LOOP-2", "LOOP-3", "LOOP-5", "CTX-8"), stage="text")
def transient_errors_are_retried(s: Story) -> None:
    s.script(RateLimited("slow down", retry_after_s=7.0),
             ProviderServerError("bad gateway", status=502), text("Here you go."))
    result = s.turn("Tell me something.")
    s.expect(result is not None and result.final_response == "Here you go.", "the third try answers")
    s.expect(result is not None and result.budget_used == 1, "retries of one call cost one unit")


@scenario("A server that keeps failing is retried three times, then the turn ends",
          invariants=("LOOP-5", "LOOP-3", "FIN-5"), stage="text")
def persistent_server_errors_exhaust_the_retries(s: Story) -> None:
    def always_down(request: ProviderRequest) -> ProviderReply:
        raise ProviderServerError("service unavailable", status=503)
    s.use_provider(FunctionProvider(always_down))
    result = s.turn("Are you there?")
    s.expect(result is not None and result.exit_reason is ExitReason.TERMINAL_PROVIDER_ERROR,
             "the turn ends terminal_provider_error")
    s.expect(len(s.world.calls) == 4, "one call and three retries")


@scenario("A rejected request ends the turn at once, and a boundary row closes its open tail",
          invariants=("LOOP-5", "LOOP-3", "FIN-5", "FIN-7"), stage="text")
def rejected_request_ends_the_turn(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(tool_calls(("read_file", {"path": "a.txt"})),
             ProviderRejected("unsupported parameter: tool_choice", status=400))
    result = s.turn("What does a.txt say?")
    s.expect(result is not None and result.exit_reason is ExitReason.TERMINAL_PROVIDER_ERROR
             and result.failed, "the turn fails as terminal_provider_error, not retried")
    s.expect(len(s.world.calls) == 2, "the rejected request was sent once")
    tail = s.transcript()[-1]
    s.expect(tail.role is Role.ASSISTANT and "terminal_provider_error" in (tail.content or ""),
             "a boundary row closes the tool tail")


@scenario("An auth error is retried once, and a second one in a row ends the turn",
          invariants=("LOOP-5", "LOOP-2", "LOOP-3", "FIN-5"), stage="text")
def auth_error_is_retried_once(s: Story) -> None:
    s.script(ProviderAuthError("token expired", status=401), text("Refreshed and here."))
    first = s.turn("Are you there?")
    s.expect(first is not None and first.final_response == "Refreshed and here."
             and first.budget_used == 1, "one refresh, one budget unit")
    s.script(ProviderAuthError("token expired", status=401),
             ProviderAuthError("token revoked", status=401))
    second = s.turn("Still there?")
    s.expect(second is not None and second.exit_reason is ExitReason.TERMINAL_PROVIDER_ERROR,
             "a second auth error in a row is terminal")
    s.expect(s.transcript()[-1].role is Role.ASSISTANT, "a boundary row closes the user tail")
