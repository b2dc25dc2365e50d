"""Stories of stable bytes across turns: what a provider's prompt cache can serve of each request."""

from __future__ import annotations

from hermes_ref.lease import holder_identity
from hermes_ref.outcomes import TurnResult
from sim.checkers.wire_cache import CacheShareRun
from sim.harness import Story, scenario
from sim.provider import text, tool_calls
from sim.world import CallRecord, RewriteRun

# What a memory provider prefetches for each turn: recalled notes, different every turn,
# injected into the user message's API copy only (WIRE-1).
MEMORY = (
    "memory: the user writes the quarterly report for the Lisbon office; figures are in "
    "euros, rounded to thousands; the user prefers short answers with the number first",
    "memory: last quarter's revenue was 412 thousand euros; the user asked to compare "
    "quarters as a percentage change, one decimal place",
    "memory: notes.txt holds this quarter's figures, one line per month; the user keeps "
    "the file up to date and asks before anything in it is changed",
    "memory: the user signs the report as Ana Ferreira, finance lead; the report is due "
    "on the fifth working day of the month",
    "memory: the user asked last week to be reminded that March had a one-off refund of "
    "nine thousand euros that the comparison should leave out",
)
QUESTIONS = (
    "What did we make last quarter?",
    "And how does that compare with the quarter before?",
    "What does notes.txt say for this quarter?",
    "Who signs the report, and when is it due?",
    "Anything to leave out of the comparison?",
)
MIN_SHARE = 0.60  # declared for every turn after the first, which finds the cache cold
TURN_GAP_S = 300.0  # five minutes between turns: a prompt rebuilt now is other bytes


def measured_turn(s: Story, question: str, memory: str, *, min_share: float) -> TurnResult | None:
    """A turn the story expects a prompt cache to serve at least ``min_share`` of (over the
    session's declared turns), judged by ``prompt_cache_share`` from the recorded bodies."""
    result = s.turn(question, injected=memory)
    run = s.world.runs[-1]
    s.world.runs[-1] = CacheShareRun(run.session_id, run.text, run.turn_id, run.crashed,
                                     run.write_failures, min_share=min_share)
    return result


def provider_share(calls: list[CallRecord]) -> tuple[int, int]:
    """Cached and prompt tokens as the provider reported them (``usage``), over ``calls``."""
    answered = [c.reply for c in calls if c.reply is not None]
    return (sum(r.usage.cached_tokens for r in answered),
            sum(r.usage.prompt_tokens for r in answered))


def note_share(s: Story, label: str, calls: list[CallRecord]) -> float:
    cached, prompt = provider_share(calls)
    share = cached / prompt if prompt else 0.0
    s.world.timeline.add("cache", f"{label}: {cached} of {prompt} prompt tokens cached "
                                  f"(share {share:.2f})")
    return share


@scenario("Over five turns with memory prefetch, a prefix cache serves most of every prompt",
          invariants=("CTX-3", "WIRE-1", "CTX-8"), stage="wire")
def prefix_cache_serves_most_of_every_prompt(s: Story) -> None:
    s.files({"notes.txt": "January 131; February 128; March 140"})
    s.script(text("412 thousand euros."),
             text("Up 3.5 % on the quarter before."),
             tool_calls(("read_file", {"path": "notes.txt"})),
             text("January 131, February 128, March 140 thousand euros."),
             text("Ana Ferreira signs; it is due on the fifth working day."),
             text("Yes: March's one-off refund of nine thousand euros."))
    s.turn(QUESTIONS[0], injected=MEMORY[0])  # the cold turn: nothing to repeat yet
    first_calls = len(s.world.calls)
    for index in range(1, len(QUESTIONS)):
        s.advance(TURN_GAP_S)
        if index == 3:
            s.restart()  # a new process: it replays what the record holds, byte for byte
        result = measured_turn(s, QUESTIONS[index], MEMORY[index], min_share=MIN_SHARE)
        s.expect(result is not None and result.final_response is not None,
                 f"turn {index + 1} answers")
        turn_id = result.turn_id if result is not None else None
        note_share(s, f"turn {index + 1}", [c for c in s.world.calls if c.turn_id == turn_id])
    share = note_share(s, "turns 2-5", s.world.calls[first_calls:])
    s.expect(share >= MIN_SHARE, f"the provider served at least {MIN_SHARE:.0%} of the prompt "
                                 "tokens of turns 2-5 from its cache")
    rows = s.transcript()
    s.expect(all(r.content in QUESTIONS for r in rows if r.role.value == "user"),
             "the memory stays out of the stored content")


# ---- WIRE-2: a rewritten row is sent as what it now says ---------------------------------------

CARD_NOTE = "My card for the supplier form is 4417 2210 9932 0071, expiry 09/28."
FORM_REQUEST = "Fill in the supplier form for the Lisbon office."


def redact(s: Story, row_id: int, content: str, *, session: str = "s-1") -> None:
    """An operator's redaction between turns: take the session's lease as a turn does,
    rewrite the row's content through the store's fenced rewrite, give the lease back."""
    store, now = s.world.store, s.world.clock.now()
    holder = holder_identity(s.world.holder, "redaction", "cli")
    lease = store.acquire_lease(session, holder, now, s.engine.limits.lease_ttl_s)
    s.expect(lease is not None, "the redaction gets the session's lease")
    assert lease is not None
    seq = s.world.effects_performed
    store.rewrite_message(session, lease.token, row_id, content)
    store.release_lease(lease)
    s.world.runs.append(RewriteRun(session, content, None, False, row_id=row_id, seq=seq))
    s.world.timeline.add("rewrite", f"#{row_id} -> {content[:40]!r} (lease token {lease.token})")
    s.check()


@scenario("A row redacted between turns is sent as its new text, never as its old sidecar",
          invariants=("WIRE-2", "WIRE-1"), stage="wire")
def redacted_row_is_sent_as_its_new_text(s: Story) -> None:
    s.script(text("I will need the card number to fill it in."),
             text("The form is filled in; the card field is left for you."))
    s.turn(f"{FORM_REQUEST} {CARD_NOTE}", injected=MEMORY[0])
    first = s.transcript()[0]
    s.expect(first.api_content is not None and CARD_NOTE in first.api_content,
             "the first turn sent the note inside its sidecar")
    redact(s, first.row_id or 0, FORM_REQUEST)  # the card number is cut from the record
    s.advance(TURN_GAP_S)
    s.turn("Go ahead with the form.")
    after = s.transcript()[0]
    s.expect(after.content == FORM_REQUEST and after.api_content is None,
             "the redacted row keeps no sidecar")
    last = s.world.calls[-1].body.decode("utf-8")
    s.expect("4417" not in last, "the card number no longer crosses the wire")
