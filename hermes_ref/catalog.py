"""The invariant catalog: every rule this engine promises, by stable id.

Ids never change; an entry may be split into finer ids (``TOOL-1a``), never renumbered.
Bracketed numbers are defaults and live in ``limits.Limits``. ``hermes-ref invariants``
joins this catalog with the scenarios, checkers and sabotages that cover each id.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Invariant:
    id: str
    group: str
    text: str


GROUPS: dict[str, str] = {
    'SES': 'session lane and incarnation',
    'ADM': 'admission (one door for every input)',
    'LEASE': 'the per-session turn lease',
    'CTX': 'the turn prologue',
    'WIRE': 'bytes sent equal bytes stored',
    'LOOP': 'the main loop',
    'TOOL': 'the tool round',
    'SCAF': 'scaffolding',
    'CMP': 'compression and preflight',
    'FIN': 'the finalizer',
    'DEL': 'delivery',
}

CATALOG: tuple[Invariant, ...] = (
    Invariant('SES-1', 'SES',
              'Key layout '
              '`agent:main:{platform}:{chat_type}[:{chat_id}][:{thread_id}][:{participant}]`. '
              'Groups/channels isolate per participant by default; threads share by default; '
              'DMs with a chat id carry no participant. Both defaults are settings.'),
    Invariant('SES-2', 'SES',
              'An incarnation id is `YYYYMMDD_HHMMSS_` + 8 hex, from the injected clock and '
              'seeded RNG. A reset gives the same key a new id; the old row is ended with a '
              'reason, never deleted.'),
    Invariant('SES-3', 'SES',
              'Resolution priority: suspended (hard clear, new id) > resume_pending (keep id, '
              'clear the flag) > policy expiry (idle / daily / both / none → new id, '
              '`was_auto_reset`) > keep and touch. (Released code evaluates policy before '
              'resume_pending and adds a 3600 s freshness gate.)'),
    Invariant('SES-4', 'SES',
              'A user-requested reset sets `is_fresh_reset` and produces no expiry notice; an '
              'automatic reset injects its notice exactly once.'),
    Invariant('SES-5', 'SES',
              'Expiry finalization runs at most once across restarts (`expiry_finalized`) and '
              'moves the row to a reset-ended state; a stale route can never revive an ended '
              'incarnation.'),
    Invariant('SES-6', 'SES',
              'A session with a live background process never expires and is never pruned.'),
    Invariant('SES-7', 'SES',
              'Start without a clean-exit marker marks sessions active in the last [120 s] '
              'resume_pending; a session still active across [3] consecutive restarts is '
              'suspended.'),
    Invariant('ADM-1', 'ADM',
              'Every input (user message, platform message, background completion, cron, '
              'subagent report) is admitted through the same door: authorize → normalize → '
              'durable `queued` row → acknowledgement. Nothing is acknowledged before its row '
              'is committed.'),
    Invariant('ADM-2', 'ADM',
              'Authority comes from the principal and the session binding, never from payload '
              'fields; a payload that claims an owner or operator role gains nothing.'),
    Invariant('ADM-3', 'ADM',
              'Idempotency: (principal, session, request_id) with the same payload digest '
              'returns the existing admission; with another digest it is an '
              '`admission_conflict`. One request runs once.'),
    Invariant('ADM-4', 'ADM',
              "FIFO: a session's admissions are claimed in `seq` order, one in flight at a "
              'time.'),
    Invariant('ADM-5', 'ADM',
              'States queued → started → terminal(outcome). After an owner dies, started '
              "becomes `unknown`: never re-queued, never silently terminal; the session's "
              'queue pauses until it is reconciled.'),
    Invariant('ADM-6', 'ADM',
              'A refused admission hands its input back to the caller; it is never lost and '
              'never reported as accepted.'),
    Invariant('ADM-7', 'ADM',
              'Queued admissions survive a crash and are claimable after restart.'),
    Invariant('LEASE-1', 'LEASE',
              'At most one live turn lease per session (per compression lineage root); '
              'different sessions run in parallel.'),
    Invariant('LEASE-2', 'LEASE',
              'TTL [300 s], refresh every [60 s], wait up to [1800 s]; the holder names pid, '
              'pid namespace, turn id and platform.'),
    Invariant('LEASE-3', 'LEASE',
              'An expired lease, or one whose holder process is dead, may be reclaimed; a live '
              'one may not.'),
    Invariant('LEASE-4', 'LEASE',
              'Losing the lease (refresh fails, another holder) hard-interrupts the turn; the '
              'old holder writes nothing after the loss (fencing).'),
    Invariant('LEASE-5', 'LEASE',
              'A turn that cannot get the lease (timeout → `session_turn_lease_timeout`, '
              "retryable; interrupt) returns an early result that carries the user's message "
              'back: refusal is not loss.'),
    Invariant('LEASE-6', 'LEASE',
              'The finally order is: stop refresher → join → clear own interrupt → release; '
              'the lease is released even when post-processing raises.'),
    Invariant('CTX-1', 'CTX',
              'Per-turn state (retry counters, guardrails, persistence-failure flag, nudge '
              'counts) is reset and the iteration budget rebuilt; the memory and skill nudge '
              'counters are not reset.'),
    Invariant('CTX-2', 'CTX',
              "The caller's history list is copied, never mutated."),
    Invariant('CTX-3', 'CTX',
              'The system prompt is built once per session in three layers (stable, context, '
              'volatile), cached and replayed byte for byte; only compression invalidates it.'),
    Invariant('CTX-4', 'CTX',
              'Order: system prompt → session row (never a NULL prompt) → compression. '
              'Compression never writes before its session row exists.'),
    Invariant('CTX-5', 'CTX',
              'Idle compaction fires only if enabled, idle_after > 0, gap ≥ idle_after, no '
              'cooldown and tokens > floor (floor = threshold × target ratio).'),
    Invariant('CTX-6', 'CTX',
              'Threshold compaction before the first call runs at most [3] passes; a pass is '
              'progress only if the message count falls or tokens fall by ≥ 5 %; no progress '
              'stops the passes.'),
    Invariant('CTX-7', 'CTX',
              'After compaction the current user message is re-located: the last user row '
              "whose content equals this turn's text, else the last user row."),
    Invariant('CTX-8', 'CTX',
              'The user row is persisted before the first model call, once, with its final '
              'sidecar.'),
    Invariant('CTX-9', 'CTX',
              "A turn that starts before the previous turn's final persist logs a warning "
              'naming both turn ids.'),
    Invariant('WIRE-1', 'WIRE',
              'Per-turn injections (memory prefetch, plugin context) go only to the API copy; '
              'the exact bytes sent are stored as the `api_content` sidecar and replayed on '
              'later turns, so the provider sees a stable prefix.'),
    Invariant('WIRE-2', 'WIRE',
              "Any path that rewrites a message's content drops its sidecar."),
    Invariant('WIRE-3', 'WIRE',
              'Keys beginning with `_` and local bookkeeping (`api_content`, display fields, '
              'row ids) never leave the process.'),
    Invariant('LOOP-1', 'LOOP',
              'The loop runs while (api_calls < max_iterations and budget.remaining > 0) or a '
              'grace call is pending.'),
    Invariant('LOOP-2', 'LOOP',
              'Budget: one unit per model call; a round that used only refundable tools '
              '(`execute_code`) refunds it; a compaction pass that replaced a call refunds it; '
              'at exhaustion one tool-less grace call may summarize.'),
    Invariant('LOOP-3', 'LOOP',
              'Every exit records an exit reason from a closed set (text response, max '
              'iterations, budget exhausted, interrupted, compression timeout, guardrail halt, '
              'persistence failure, empty-response exhausted, local processing error, terminal '
              'provider error, pending tool result).'),
    Invariant('LOOP-4', 'LOOP',
              'A mid-turn redirect is drained at the top of the loop. Raw reasoning is never '
              'written into replayable content: the interrupted partial keeps only visible '
              'text; if nothing was visible it is stored hidden; the correction is a real user '
              'row.'),
    Invariant('LOOP-5', 'LOOP',
              'Errors are classified: transient (429 honouring Retry-After, 5xx, timeout) → '
              'backoff and retry; auth → one refresh; overflow → back to preflight; '
              'non-retryable client error → terminal; a deterministic local bug → stop at once '
              'without spending budget.'),
    Invariant('LOOP-6', 'LOOP',
              'A fallback provider restarts through preflight with rebuilt messages (window, '
              'token estimate and wire format may differ); the next turn restores the primary.'),
    Invariant('LOOP-7', 'LOOP',
              '`finish_reason=tool_calls` with no calls → re-prompt with marked scaffolding, '
              'at most [3] consecutive times; a tool round that lands resets the count.'),
    Invariant('LOOP-8', 'LOOP',
              'Empty response ladder, in order: streamed visible text → use it; previous round '
              'had text and only housekeeping tools → reuse it; nudge after a tool round '
              '(once); thinking prefill [2]; bounded retries; fallback provider; terminal '
              '`(empty)` sentinel (`empty_response_exhausted`).'),
    Invariant('LOOP-9', 'LOOP',
              'Invalid tool-call arguments: truncated JSON (length stop) ends the turn as '
              'partial; malformed JSON is retried [3] times before error results are appended.'),
    Invariant('TOOL-1', 'TOOL',
              'Persist before execute: the assistant tool-call row is durable before any tool '
              'side effect. If that write fails, no tool runs and the turn ends '
              '`session_persistence_failed`; the same check runs after execution.'),
    Invariant('TOOL-2', 'TOOL',
              'Every call keeps its place: invalid tool names get an error result in place and '
              'are not dispatched; the assistant row keeps every call. [3] all-invalid rounds '
              'in a row end the turn.'),
    Invariant('TOOL-3', 'TOOL',
              'Every tool-call id has exactly one result, after its call, including '
              'interrupted (skipped) and timed-out calls.'),
    Invariant('TOOL-4', 'TOOL',
              "Segmentation keeps the model's order: interactive tools and unparsable "
              'arguments are barriers; path-scoped readers may share a segment on overlapping '
              'paths, any overlap with a writer closes the segment; declared parallel-safe '
              'tools join; anything else is sequential.'),
    Invariant('TOOL-5', 'TOOL',
              'Concurrent execution uses at most [8] workers, returns results in call order, '
              'enforces a batch deadline [420 s] and a start-order gate [120 s].'),
    Invariant('TOOL-6', 'TOOL',
              'A tool error is a tool result, not a turn failure.'),
    Invariant('TOOL-7', 'TOOL',
              'An oversized result is spilled to disk; the model gets a summary and the path.'),
    Invariant('TOOL-8', 'TOOL',
              'A tool result that cannot be persisted is not sent to the model.'),
    Invariant('TOOL-9', 'TOOL',
              'A failed write or patch without a later successful write to the same path adds '
              'a footer to the final answer.'),
    Invariant('TOOL-10', 'TOOL',
              'A side-effecting tool call that is durable but has no durable result when the '
              'process dies is never re-executed blindly after restart; it is reported unknown.'),
    Invariant('SCAF-1', 'SCAF',
              'Synthetic messages that drive retries (empty recovery, terminal sentinel, '
              'thinking prefill, verification nudges, dropped-tool-call nudge) carry a flag '
              'and are never persisted, at any position.'),
    Invariant('SCAF-2', 'SCAF',
              'After a crash mid-turn, resume replays no scaffolding.'),
    Invariant('CMP-1', 'CMP',
              'Defaults: threshold [0.50], target ratio [0.20], protect last [20], protect '
              'first [3]; windows under [512K] raise the threshold to at least [0.75].'),
    Invariant('CMP-2', 'CMP',
              'Old tool outputs are pruned first without a model call; the head is protected, '
              'the tail is kept by token budget (never fewer than [8] messages), the middle is '
              'summarized by an auxiliary model, and a later compaction updates the summary '
              'instead of starting over.'),
    Invariant('CMP-3', 'CMP',
              'No orphans: an assistant tool call and its results survive or go together.'),
    Invariant('CMP-4', 'CMP',
              'A summary failure starts a cooldown [600 s]; [2] ineffective passes block '
              'automatic compaction; a manual compaction bypasses the cooldown.'),
    Invariant('CMP-5', 'CMP',
              'Rotation ends the old session with reason `compression` and creates a child '
              'with `parent_session_id`; the next turn finds the tip of the lineage.'),
    Invariant('CMP-6', 'CMP',
              'One compressor per session at a time (compression lock, holder-qualified, '
              'expiring); failing to get the lock leaves the messages unchanged.'),
    Invariant('CMP-7', 'CMP',
              'Preflight runs before every model call; a provider-proven overflow that '
              'compaction cannot relieve fails closed (the same request is not sent again); a '
              'compaction timeout loses no message.'),
    Invariant('FIN-1', 'FIN',
              'Budget exhausted with no answer: reuse an answer withheld by a verification '
              'gate, else one tool-less summary call.'),
    Invariant('FIN-2', 'FIN',
              'A final answer that was streamed but lost is recovered from the stream.'),
    Invariant('FIN-3', 'FIN',
              'Tail closure: a delivered final answer has a matching assistant row. If the '
              'tail is not an assistant row, one is appended; if it is an assistant row with '
              'only tool calls or no visible text, the answer fills it and the row is written '
              'again.'),
    Invariant('FIN-4', 'FIN',
              'An interrupted turn closes its open tool sequence (every call gets a result).'),
    Invariant('FIN-5', 'FIN',
              'A failed turn that leaves an open user or tool tail gets an engine assistant '
              'boundary row, except after context-pressure failures.'),
    Invariant('FIN-6', 'FIN',
              'Trajectory save, resource cleanup and persist are guarded independently; their '
              'errors go into the result; the answer the user waits for is never lost.'),
    Invariant('FIN-7', 'FIN',
              'One turn-exit log line with reason, api calls, budget used, last role and '
              'answer length; WARNING when the last message is a tool result and the turn was '
              'not interrupted.'),
    Invariant('FIN-8', 'FIN',
              'No answer, not interrupted, tail is a tool result, nothing streamed → failed '
              'with `pending_tool_result` and an explanatory answer.'),
    Invariant('DEL-1', 'DEL',
              'Each turn emits an ordered event stream (deltas, tool progress, completion) '
              'with sequence numbers; the completion carries the authoritative final answer, '
              'not the stream accumulator.'),
    Invariant('DEL-2', 'DEL',
              'A client that reconnects replays events after its last sequence number and sees '
              'no duplicate text.'),
)

BY_ID: dict[str, Invariant] = {inv.id: inv for inv in CATALOG}
