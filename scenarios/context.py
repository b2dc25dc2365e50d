"""Stories of what a turn takes from its caller and keeps for its session: the caller's
history, the session-scoped nudge counters, and the one system prompt of a session."""

from __future__ import annotations

from hermes_ref.models import EventKind, Message, Role
from hermes_ref.outcomes import TurnStarted
from sim.harness import Story, scenario
from sim.provider import text, tool_calls


def _started(s: Story, key: str) -> list[object]:
    """One field of every turn.started event, in the order the turns began."""
    return [getattr(TurnStarted.of(e), key) for e in s.world.stream
            if e.kind is EventKind.TURN_STARTED]


@scenario("A caller's history seeds a new session and is sent first, and the caller's list "
          "is never changed",
          invariants=("CTX-2", "CTX-8", "CTX-1", "FIN-3"), stage="prologue")
def caller_history_seeds_a_new_session(s: Story) -> None:
    history = [Message(role=Role.USER, content="My name is Ada."),
               Message(role=Role.ASSISTANT, content="Nice to meet you, Ada.")]
    s.files({"notes.txt": "Ada likes tea."})
    s.script(tool_calls(("read_file", {"path": "notes.txt"})), text("You are Ada, and you like tea."),
             text("Still Ada."))
    first = s.turn("Who am I, and what do I like?", history=history)
    s.expect(first is not None and first.final_response == "You are Ada, and you like tea.",
             "the turn answered from the caller's history")
    rows = s.transcript()
    s.expect([(r.role, r.content) for r in rows[:2]] == [(m.role, m.content) for m in history],
             "the history was stored first, as the session's opening rows")
    s.expect(len(history) == 2 and history[0].row_id is None,
             "the caller's list holds what it held")
    later = [*history, Message(role=Role.USER, content="Forget that: my name is Bo.")]
    s.turn("And now who am I?", history=later)
    s.expect(len(s.transcript()) == len(rows) + 2,
             "a session with a transcript keeps it: a later caller's list is not used")
    s.expect(_started(s, "user_turn") == [2, 3], "the seeded user message counts as a user turn")


@scenario("The nudge counters outlive each turn, and a restarted process hydrates them from "
          "the history",
          invariants=("CTX-1",), stage="prologue")
def nudge_counters_survive_turns_and_a_restart(s: Story) -> None:
    s.limits(memory_nudge_interval=2)
    s.script(*(text(f"Answer {n}.") for n in range(1, 6)))
    for n in range(1, 4):
        s.turn(f"Question {n}.")
    s.restart()
    for n in range(4, 6):
        s.turn(f"Question {n}.")
    s.expect(_started(s, "user_turn") == [1, 2, 3, 4, 5],
             "each turn counts on from the last, the restarted process from the history")
    s.expect(_started(s, "memory_review") == [False, True, False, True, False],
             "the memory review is due on every second user turn, across the restart")


@scenario("The system prompt stays the session's while the tools and the platform change, "
          "and across a restart",
          invariants=("CTX-3", "CTX-4"), stage="prologue")
def prompt_stays_the_sessions_under_change(s: Story) -> None:
    s.files({"a.txt": "alpha"})
    s.script(text("Hello."), tool_calls(("read_file", {"path": "a.txt"})), text("It says alpha."),
             text("Still here."))
    s.turn("Hello?")
    s.tools("read_file", "memory")
    s.turn("What does a.txt say?", platform="telegram")
    s.restart()
    s.tools("read_file", "write_file", "terminal", "memory")
    s.turn("Are you there?", platform="discord")
    prompt = s.world.store.snapshot().sessions[0].system_prompt
    s.expect("on cli." in prompt and "execute_code" in prompt,
             "the row keeps the prompt of the first turn: its platform and its tools")
    offered = [len(call.request.tools) for call in s.world.calls]
    s.expect(offered[0] > offered[1] and offered[1] < offered[-1],
             "the tool list really changed between the turns")
    s.expect(all(call.request.messages[0].content == prompt for call in s.world.calls),
             "every request replayed the row's prompt")
