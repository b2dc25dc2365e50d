"""Compression: when to compact a conversation, and how to plan the compacted list (CMP, CTX-5..7).

Theory of operation
-------------------
Everything here is a plain function over values; the effectful step that runs a pass
(the summary call, the durable write) is ``hermes_ref.compaction``.

*When* (CMP-1, CMP-4, CTX-5, CTX-6). ``budget(limits)`` turns the settings into token
figures: windows under ``compression_small_window_tokens`` (512,000) raise the threshold
ratio to at least 0.75; the effective window is the context minus ``max_tokens``; the
threshold is ``int(window × ratio)``, floored at 64,000 tokens, and when that floor reaches
the window it becomes ``min(int(window × 0.85), window − 1)``. The tail keeps
``threshold × target ratio`` tokens (the ratio clamped to [0.10, 0.80]). Automatic
compaction is *blocked* during the cooldown after a failed summary (600 s) and after
``compression_ineffective_max`` (2) passes in a row that left the request over the
threshold; a manual compaction ignores the cooldown (and the block). A pass is progress
only when it removes messages or cuts tokens by at least 5 % (``made_progress``). Idle
compaction has its own predicate (``should_idle_compact``).

*How* (CMP-2, CMP-3, CTX-7). ``plan`` splits the list into a protected head (the first
``compression_protect_first`` messages, none once a summary exists), a middle, and a tail
kept by token budget but never fewer than ``compression_tail_floor_messages`` messages; a
retry's scaffolding in the working list counts toward neither, since it is never stored.
Boundaries move so that an assistant tool call and its results are never split. The
current user message, re-located by ``relocate_user``, is never summarized: if it falls
in the middle it is lifted out and kept after the summary. ``prune`` replaces old tool
outputs (before the tail) with a placeholder, which costs no model call and is tried
first. ``compose`` builds the compacted list around a summary message, and
``repair_orphans`` guarantees that no tool result is left without its call and no call
without its result (pending calls, which never had a result, excepted).

Every rewritten message goes through ``rewritten``: new content, and the ``api_content``
sidecar dropped, because the bytes it held are no longer this message's (WIRE-2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role

MIN_CONTEXT_TOKENS = 64_000       # the threshold never goes below this (Hermes MINIMUM_CONTEXT_LENGTH)
MIN_TRIGGER_RATIO = 0.85          # ... unless that floor reaches the window
TARGET_RATIO_MIN, TARGET_RATIO_MAX = 0.10, 0.80
SUMMARY_TOKENS_CEILING = 10_000   # a summary asks for at most this many tokens
SUMMARY_TOKENS_MIN = 2_000

SUMMARY_PREFIX = "[Summary of the earlier conversation, written when it was compacted]\n"
PRUNED_PREFIX = "[tool output pruned to save context: "
PRUNED_TEXT = PRUNED_PREFIX + "{chars} characters]"
REMOVED_CALL_TEXT = "(tool call removed)"


# ---- the figures: CMP-1 -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Budget:
    """The token figures one ``Limits`` value gives (see the module docstring)."""

    window_tokens: int       # the context window, as configured
    threshold_ratio: float   # after the small-window raise
    threshold_tokens: int    # compaction starts at this many request tokens
    target_ratio: float      # clamped
    tail_tokens: int         # the tail keeps about this many tokens
    summary_tokens: int      # the max_tokens of a summary request


def effective_threshold_ratio(context_tokens: int, configured: float,
                              small_window_tokens: int = 512_000,
                              small_window_ratio: float = 0.75) -> float:
    """Windows under ``small_window_tokens`` use at least ``small_window_ratio`` (raise only)."""
    if context_tokens < small_window_tokens:
        return max(configured, small_window_ratio)
    return configured


def threshold_tokens(context_tokens: int, max_tokens: int | None, ratio: float) -> int:
    """``int(window × ratio)`` floored at 64,000; a floor that reaches the window gives 0.85."""
    window = context_tokens - max_tokens if max_tokens and context_tokens - max_tokens > 0 \
        else context_tokens
    value = max(int(window * ratio), MIN_CONTEXT_TOKENS)
    if value >= window:
        value = min(int(window * MIN_TRIGGER_RATIO), window - 1)
    return value


def clamp_target_ratio(ratio: float) -> float:
    return min(TARGET_RATIO_MAX, max(TARGET_RATIO_MIN, ratio))


def budget(limits: Limits) -> Budget:
    context = limits.context_window_tokens
    ratio = effective_threshold_ratio(context, limits.compression_threshold,
                                      limits.compression_small_window_tokens,
                                      limits.compression_small_window_threshold)
    threshold = threshold_tokens(context, limits.max_tokens, ratio)
    target = clamp_target_ratio(limits.compression_target_ratio)
    summary = max(min(context // 20, SUMMARY_TOKENS_CEILING), min(SUMMARY_TOKENS_MIN, context // 4))
    return Budget(context, ratio, threshold, target, int(threshold * target), summary)


def made_progress(before: tuple[int, int], after: tuple[int, int], ratio: float = 0.95) -> bool:
    """CTX-6: (messages, tokens) before and after a pass; fewer messages, or tokens < 95 %."""
    return after[0] < before[0] or after[1] < before[1] * ratio


# ---- blocking and the idle predicate: CMP-4, CTX-5 ----------------------------------------


@dataclass(slots=True)
class CompressionState:
    """What one engine remembers about one session's compaction between turns.

    It lives in the session cache, so a restarted process starts without a cooldown or a
    block (as a Hermes agent without its durable rows would).
    """

    cooldown_until: float = 0.0     # no automatic compaction before this (a summary failed)
    ineffective: int = 0            # passes in a row that left the request over the threshold
    compactions: int = 0            # passes that changed the list
    last_compacted_tokens: int = 0  # the request's tokens right after the last compaction
    manual_pending: bool = False    # a manual compaction was asked for: the next turn runs it
    turn_id: str = ""               # the turn the per-turn counts below belong to
    passes: int = 0                 # passes run in this turn
    overflows: int = 0              # provider-proven overflows recovered from in this turn

    def begin(self, turn_id: str) -> None:
        if self.turn_id != turn_id:
            self.turn_id, self.passes, self.overflows = turn_id, 0, 0

    def cooling(self, now: float) -> bool:
        return now < self.cooldown_until

    def blocked(self, now: float, limits: Limits, *, manual: bool = False) -> str | None:
        """Why automatic compaction may not run now, or None. Manual runs are never blocked."""
        if manual:
            return None
        if not limits.compression_enabled:
            return "compression disabled"
        if self.cooling(now):
            return f"summary failure cooldown until {self.cooldown_until:.3f}"
        if self.ineffective >= limits.compression_ineffective_max:
            return f"{self.ineffective} ineffective passes in a row"
        return None

    def judge(self, tokens_after: int, threshold: int) -> None:
        """CMP-4's anti-thrash verdict on a pass: still over the threshold counts once."""
        self.ineffective = self.ineffective + 1 if tokens_after >= threshold else 0

    def summary_failed(self, now: float, limits: Limits) -> None:
        self.cooldown_until = now + limits.compression_cooldown_s


def should_compress(tokens: int, figures: Budget, state: CompressionState, now: float,
                    limits: Limits, *, manual: bool = False) -> bool:
    """CMP-1/CMP-4: over the threshold and not blocked (manual: whenever asked)."""
    if manual:
        return True
    return tokens >= figures.threshold_tokens and state.blocked(now, limits) is None


def idle_floor_tokens(figures: Budget, last_compacted_tokens: int = 0) -> int:
    """CTX-5's floor: threshold × target ratio, raised by the size left by the last compaction."""
    floor = int(figures.threshold_tokens * figures.target_ratio)
    return last_compacted_tokens + floor if last_compacted_tokens > 0 else floor


def should_idle_compact(*, enabled: bool, idle_after_s: float, gap_s: float, tokens: int,
                        floor_tokens: int, cooldown_active: bool) -> bool:
    """CTX-5: enabled, idle_after > 0, gap ≥ idle_after, no cooldown, and tokens > floor."""
    if not enabled or idle_after_s <= 0 or gap_s < idle_after_s or cooldown_active:
        return False
    return tokens > floor_tokens


# ---- rewriting one message (WIRE-2) -------------------------------------------------------


def rewritten(message: Message, content: str | None, **changes: object) -> Message:
    """``Message.rewritten`` (new content, no sidecar: WIRE-2), as a new row: no row id."""
    return message.rewritten(content, row_id=None, **changes)


def is_summary(message: Message) -> bool:
    return (message.content or "").startswith(SUMMARY_PREFIX)


# ---- re-locating the current user message: CTX-7 ------------------------------------------


def relocate_user(messages: tuple[Message, ...], text: str | None) -> int | None:
    """The last user message whose content is ``text``, else the last user message.

    A compaction summary is never taken for the user's message, whatever its role, nor a
    retry's nudge (scaffolding: the user never wrote it).
    """
    users = [i for i, m in enumerate(messages) if m.role is Role.USER and m.scaffold is None
             and not is_summary(m)]
    for index in reversed(users):
        if text is not None and messages[index].content == text:
            return index
    return users[-1] if users else None


# ---- the planner: CMP-2, CMP-3 ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """How one list splits: ``head`` and ``tail`` are kept, ``middle`` is summarized.

    ``lifted`` is the current user message when it fell in the middle (it is kept, after
    the summary); ``previous_summary`` is the text of an earlier summary found in the
    middle, which the new summary updates instead of starting over.
    """

    head: tuple[Message, ...]
    middle: tuple[Message, ...]
    tail: tuple[Message, ...]
    lifted: Message | None = None
    previous_summary: str | None = None

    @property
    def summarizable(self) -> tuple[Message, ...]:
        """What the summarizer reads: the middle without scaffolding or the old summary."""
        return tuple(m for m in self.middle if m.scaffold is None and not is_summary(m))


@dataclass(frozen=True, slots=True)
class Shape:
    """The cut points of a list: ``head_end`` ≤ ``tail_start`` (indices into the list)."""

    head_end: int
    tail_start: int
    user_index: int | None = None
    notes: tuple[str, ...] = field(default=())


def _tail_start(messages: tuple[Message, ...], tail_tokens: int, floor: int) -> int:
    """Walk back from the end until the budget is spent, keeping at least ``floor`` messages
    of the conversation: a retry's scaffolding in the working list (a nudge, a prefill) is
    kept too but does not count toward the floor, since it is never stored. The budget is
    of request tokens: a hidden row is kept where it lies but costs nothing, as in
    preflight's measure (``Message.sent_tokens``)."""
    start, spent, kept = len(messages), 0, 0
    while start > 0:
        message = messages[start - 1]
        if kept >= floor and spent + message.sent_tokens > tail_tokens:
            break
        spent += message.sent_tokens
        kept += message.scaffold is None
        start -= 1
    return start


def _head_end(messages: tuple[Message, ...], protect: int) -> int:
    """The end of the protected head: the first ``protect`` messages of the conversation.
    A retry's scaffolding among them (a dropped call's narration and nudge) is kept with
    them but does not count, as in the tail's floor: it is never stored, so protecting it
    would leave the stored head unprotected."""
    end, kept = 0, 0
    while end < len(messages) and kept < protect:
        kept += messages[end].scaffold is None
        end += 1
    return end


def shape(messages: tuple[Message, ...], figures: Budget, limits: Limits,
          user_text: str | None = None) -> Shape:
    """Where the head ends and the tail starts, with tool groups kept whole.

    The head protects the first ``compression_protect_first`` messages, none once a
    summary exists (it decays); its end moves forward past tool results, so a call in the
    head keeps its results. The tail start moves back over tool results to their call.
    """
    has_summary = any(is_summary(m) for m in messages)
    head_end = 0 if has_summary else _head_end(messages, limits.compression_protect_first)
    while head_end < len(messages) and messages[head_end].role is Role.TOOL:
        head_end += 1
    start = _tail_start(messages, figures.tail_tokens, limits.compression_tail_floor_messages)
    while 0 < start < len(messages) and messages[start].role is Role.TOOL:
        start -= 1  # back to the assistant row whose calls these results answer
    return Shape(head_end, max(start, head_end), relocate_user(messages, user_text))


def plan(messages: tuple[Message, ...], figures: Budget, limits: Limits,
         user_text: str | None = None) -> Plan | None:
    """The split of ``messages`` (no system message), or None when there is no middle."""
    cut = shape(messages, figures, limits, user_text)
    middle = list(messages[cut.head_end:cut.tail_start])
    lifted = None
    if cut.user_index is not None and cut.head_end <= cut.user_index < cut.tail_start:
        lifted = messages[cut.user_index]
        middle.remove(lifted)
    previous = next((m.content for m in middle if is_summary(m)), None)
    if not any(m.scaffold is None and not is_summary(m) for m in middle):
        return None
    text = previous[len(SUMMARY_PREFIX):] if previous is not None else None
    return Plan(messages[:cut.head_end], tuple(middle), messages[cut.tail_start:], lifted, text)


def prune(messages: tuple[Message, ...], figures: Budget, limits: Limits) -> tuple[Message, ...]:
    """CMP-2's first step: tool outputs before the tail become a placeholder (no model call).

    Only outputs longer than their placeholder are pruned, and a placeholder never again, so
    a second prune changes nothing.
    """
    cut = shape(messages, figures, limits)
    out = list(messages)
    for index in range(cut.head_end, cut.tail_start):
        message = messages[index]
        if message.role is not Role.TOOL or message.content is None \
                or message.content.startswith(PRUNED_PREFIX):
            continue
        placeholder = PRUNED_TEXT.format(chars=len(message.content))
        if len(message.content) > len(placeholder):
            out[index] = rewritten(message, placeholder)
    return tuple(out)


def summary_message(text: str, before: Message | None, turn_id: str | None) -> Message:
    """The summary, as a user message unless that would put two user messages together."""
    role = Role.ASSISTANT if before is not None and before.role is Role.USER else Role.USER
    return Message(role=role, content=SUMMARY_PREFIX + text, turn_id=turn_id)


def compose(layout: Plan, summary_text: str, turn_id: str | None) -> tuple[Message, ...]:
    """Head, the summary, the lifted user message, the tail; then orphan repair (CMP-3)."""
    before = layout.head[-1] if layout.head else None
    summary = summary_message(summary_text, before, turn_id)
    lifted = (layout.lifted,) if layout.lifted is not None else ()
    original = (*layout.head, *layout.middle, *layout.tail)
    return repair_orphans((*layout.head, summary, *lifted, *layout.tail), pending_calls(original))


def pending_calls(messages: tuple[Message, ...]) -> frozenset[str]:
    """Call ids that have no result anywhere in ``messages``: calls still waiting for one."""
    answered = {m.tool_call_id for m in messages if m.role is Role.TOOL}
    return frozenset(c.id for m in messages for c in m.tool_calls if c.id not in answered)


def repair_orphans(messages: tuple[Message, ...],
                   pending: frozenset[str] = frozenset()) -> tuple[Message, ...]:
    """CMP-3: drop results without an earlier surviving call; strip calls whose results are
    gone (``pending`` ones excepted); an assistant left with nothing says so."""
    called: set[str] = set()
    kept_results: set[int] = set()
    for index, message in enumerate(messages):
        called.update(c.id for c in message.tool_calls)
        if message.role is Role.TOOL and message.tool_call_id in called:
            kept_results.add(index)
    answered = {messages[i].tool_call_id for i in kept_results}
    out: list[Message] = []
    for index, message in enumerate(messages):
        if message.role is Role.TOOL:
            if index in kept_results:
                out.append(message)
            continue
        kept = tuple(c for c in message.tool_calls if c.id in answered or c.id in pending)
        if len(kept) != len(message.tool_calls):
            content = message.content if kept or (message.content or "").strip() \
                else REMOVED_CALL_TEXT
            message = rewritten(message, content, tool_calls=kept)
        out.append(message)
    return tuple(out)


def tokens_of(messages: tuple[Message, ...]) -> int:
    """What ``messages`` add to a request (a hidden row adds nothing, ``Message.sent_tokens``)."""
    return sum(m.sent_tokens for m in messages)
