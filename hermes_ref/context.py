"""Per-turn and per-session state of the engine.

Theory of operation
-------------------
Two lifetimes, two owners:

* ``SessionCache`` lives as long as the engine instance and belongs to one session: the
  cached system prompt (built once, replayed byte for byte: CTX-3), the cached durable
  transcript, the last lease token this engine held and the nudge counters
  (``NudgeCounters``); a new turn does not reset it (CTX-1). A new engine instance (a
  restart) starts with no cache and rebuilds it from the durable record alone: the
  counters are hydrated from the history it loads.
* ``TurnState`` lives for one turn: retry counters, the persistence-failure flag and the
  iteration budget, all rebuilt by the prologue (CTX-1).

The cached transcript is trusted only when the fencing token proves that nobody else
held the lease since this engine released it (token == last token + 1); otherwise the
prologue reloads the whole transcript. That keeps the per-turn cost flat without ever
serving a stale history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hermes_ref.compression import CompressionState  # CMP
from hermes_ref.effects import AppendMessages, Site
from hermes_ref.errors import InvariantBroken, LeaseLost, PersistenceError
from hermes_ref.limits import Limits
from hermes_ref.models import Lease, Message, Role, SessionRecord, ToolSpec
from hermes_ref.outcomes import Ending, ExitReason
from hermes_ref.phases import Phase, PhaseTracker
from hermes_ref.transcript import Transcript


class IterationBudget:
    """One unit per model call; refunds never go below zero (LOOP-2)."""

    __slots__ = ("max_total", "used")

    def __init__(self, max_total: int) -> None:
        self.max_total = max_total
        self.used = 0

    def consume(self) -> bool:
        if self.used >= self.max_total:
            return False
        self.used += 1
        return True

    def refund(self) -> None:
        if self.used > 0:
            self.used -= 1

    @property
    def remaining(self) -> int:
        return max(0, self.max_total - self.used)


@dataclass(slots=True)
class NudgeCounters:
    """The session-scoped nudge counters of CTX-1: they outlive turns, unlike ``TurnState``.

    * ``user_turns`` counts the session's user turns, this one included once it is
      counted (Hermes ``_user_turn_count``);
    * ``turns_since_memory`` counts user turns since the memory review last came due
      (``_turns_since_memory``). The review is due every ``memory_nudge_interval`` user
      turns; Hermes runs it in the background after the answer, with the memory tool;
    * ``iters_since_skill`` counts loop iterations since the skill review last came due
      (``_iters_since_skill``). Hermes ticks it once per iteration while a ``skill_manage``
      tool is offered and clears it when that tool runs; this engine offers no such tool,
      so nothing ticks it yet, but like the memory counter it is never reset by a turn.

    A restarted process knows none of this, so ``hydrate`` derives the counts from the
    history (Hermes does so on a resumed agent's first turn).
    """

    user_turns: int = 0
    turns_since_memory: int = 0
    iters_since_skill: int = 0

    def hydrate(self, user_rows: int, memory_interval: int) -> None:
        """Derive the counts from a history holding ``user_rows`` user messages.

        ``turns_since_memory = user_rows % interval`` keeps the cadence of the turns before
        (7 user rows at interval 3 give 1: the 8th turn ticks it to 2, the 9th brings the
        review), and never fires a review just because the process is new. The skill counter is not
        derived: the history does not say where iterations stood (nor does Hermes).
        """
        self.user_turns = user_rows
        self.turns_since_memory = user_rows % memory_interval if memory_interval > 0 else 0

    def count_user_turn(self, memory_interval: int, memory_offered: bool) -> bool:
        """Count one more user turn; True when the memory review comes due this turn.

        Every user turn counts, so the counter always equals ``user_turns % interval``,
        which is what ``hydrate`` restores. (Hermes counts only while the memory tool is
        offered; with a fixed tool set, as every process has, the two agree.) A review
        that comes due with no memory tool to run it is skipped, not postponed.
        """
        self.user_turns += 1
        if memory_interval <= 0:
            return False
        self.turns_since_memory += 1
        if self.turns_since_memory < memory_interval:
            return False
        self.turns_since_memory = 0
        return memory_offered


@dataclass(slots=True)
class SessionCache:
    """What one engine keeps of one session between turns; see the module docstring."""

    session_id: str
    system_prompt: str
    system_message: Message
    history: Transcript = field(default_factory=Transcript)
    last_lease_token: int = 0
    nudges: NudgeCounters = field(default_factory=NudgeCounters)
    # CMP-4, CTX-5, CTX-6: cooldown, anti-thrash count and this turn's passes (compression.py)
    compression: CompressionState = field(default_factory=CompressionState)

    def replace_system_prompt(self, record: SessionRecord) -> None:
        """CTX-3: the one way the cached prompt changes; only compression calls it.

        A compression that rebuilds the prompt (``prologue.build_system_prompt``, with the
        clock of the compaction) first writes it into a session row, a rotation's child
        or the same session's, and then hands that row here: every later request of this
        engine replays the stored prompt, and a restarted engine reads the same bytes
        back from the row (CTX-4). Nothing else may replace it, not a new platform, not
        a new tool list: each rebuild costs the whole conversation its prompt cache.
        """
        if not record.system_prompt.strip():
            raise InvariantBroken(f"session {record.id} has no system prompt to replay (CTX-4)")
        self.system_prompt = record.system_prompt
        self.system_message = Message(role=Role.SYSTEM, content=record.system_prompt)


@dataclass(slots=True)
class TurnState:
    """Counters that every turn starts from zero (CTX-1)."""

    budget: IterationBudget
    api_calls: int = 0
    invalid_tool_rounds: int = 0
    invalid_json_retries: int = 0
    empty_retries: int = 0
    dropped_toolcall_retries: int = 0
    post_tool_nudged: bool = False
    persistence_failed: bool = False
    last_round_had_tools: bool = False
    unrecorded_calls: set[str] = field(default_factory=set)  # ran, but the result never stored
    interrupted_calls: set[str] = field(default_factory=set)  # running when the turn was stopped
    failed_mutations: dict[str, str] = field(default_factory=dict)  # path -> tool, not yet fixed
    # LOOP-5/6/8, LOOP-4, FIN-1: the loop under fire
    thinking_prefills: int = 0        # LOOP-8 rung 4, at most thinking_prefill_retries_max
    route: int = 0                    # LOOP-6: 0 the primary, n the n-th fallback provider
    hops: int = 0                     # LOOP-2: fallback hops, each refunding the call it replaced
    provider_errors: int = 0          # LOOP-5: failed calls this turn (outer_loop_errors_max)
    cut_partial: str | None = None    # LOOP-4: raw text of a call a correction cut short
    withheld_answer: str | None = None  # FIN-1: an answer the verification gate holds back
    gate_spent: bool = False          # FIN-1's gate held an answer this turn (it holds one)
    files_changed: bool = False       # FIN-1's gate: a writer tool ran this turn

    @property
    def iterations(self) -> int:
        """LOOP-1's count of calls against ``max_iterations``: a hop's call is refunded."""
        return self.api_calls - self.hops


@dataclass(slots=True)
class TurnContext:
    """Everything one turn reads and writes, handed from phase to phase."""

    session_id: str
    turn_id: str
    limits: Limits
    tools: tuple[ToolSpec, ...]
    cache: SessionCache
    lease: Lease
    tracker: PhaseTracker
    state: TurnState
    transcript: Transcript
    ending: Ending = field(default_factory=Ending)
    carried_input: Message | None = None  # the user's message, if it never became durable
    cleanup_errors: list[str] = field(default_factory=list)
    refresher: int | None = None  # the driver's handle of this turn's lease refresher

    def enter(self, phase: Phase) -> None:
        self.tracker.enter(phase)

    def finish(self, reason: ExitReason, detail: str = "", *, answer: str | None = None,
               failed: bool = False) -> None:
        """Record the turn's exit once (LOOP-3); see ``outcomes.Ending``."""
        self.ending.finish(reason, detail, answer=answer, failed=failed)

    @property
    def ended(self) -> bool:
        return self.ending.reason is not None

    @property
    def token(self) -> int:
        return self.lease.token

    @property
    def specs(self) -> dict[str, ToolSpec]:
        return {t.name: t for t in self.tools}

    async def persist(self, rows: tuple[Message, ...], site: Site) -> bool:
        """Write rows durably; the one policy for a write that fails. False on failure.

        Stored rows take the place of their pending twins in the working list (the
        finalizer queues its rows there first) or are appended after it: a row reaches
        the model's view only once it is durable (TOOL-8). When the write fails, what it
        costs depends on where the turn stands, and only here:

        * before the finalizer, the turn ends ``session_persistence_failed`` with an empty
          answer (the caller only stops: the tools of a round that was not recorded never run);
        * in the finalizer, the failure is a cleanup error of the result: the answer the
          user waits for is still delivered (FIN-6), and the next turn reloads the record;
        * wherever it happens, a write the store fenced off (``LeaseLost``) means the lease
          is gone: the turn ends ``interrupted`` and delivers no answer (LEASE-4).

        Nothing is awaited inside the ``except``, per the house rule.
        """
        try:
            stored = await AppendMessages(self.token, self.session_id, rows, site)
        except PersistenceError as error:
            self.write_failed(site, error)
            return False
        check_stored(rows, stored)
        self.transcript.absorb(stored)
        return True

    def write_failed(self, site: Site, error: PersistenceError) -> None:
        cause = f"{error.cause}: {error}"
        self.state.persistence_failed = True
        if isinstance(error, LeaseLost):
            self.ending.lose_lease(f"session turn lease lost: {error}")
        if self.tracker.phase is Phase.FINALIZE:
            self.cleanup_errors.append(f"persist {site.value}: {cause}")
            return
        self.finish(ExitReason.PERSISTENCE_FAILED, cause, answer="", failed=True)


def check_stored(written: tuple[Message, ...], stored: tuple[Message, ...]) -> None:
    """The cheap pair of a write: what came back is what was sent, with fresh row ids.

    A store that drops, reorders or rewrites rows would silently corrupt every later turn;
    this fails loudly at the first such write instead.
    """
    if len(stored) != len(written):
        raise InvariantBroken(f"wrote {len(written)} rows, the store returned {len(stored)}")
    previous = 0
    for sent, row in zip(written, stored, strict=True):
        if row.row_id is None or row.row_id <= previous:
            raise InvariantBroken(f"row ids not increasing: {row.row_id} after {previous}")
        if (row.role, row.content, row.tool_calls, row.tool_call_id) != (
                sent.role, sent.content, sent.tool_calls, sent.tool_call_id):
            raise InvariantBroken(f"row #{row.row_id} came back different from what was written")
        previous = row.row_id

