"""Every bound and default of the invariant catalog, in one settings model.

Names carry their unit last (``lease_ttl_s``). The numbers are the catalog's bracketed
defaults; each is a setting, and scenarios override them to reach a boundary quickly
(``Limits(max_iterations=2)``). The model is frozen: a turn reads one ``Limits`` value.

Two settings are read by nothing: the skill nudge's (a capability this engine does not
build) and CMP-1's protect-last count (the tail is kept by a token budget instead). They
are kept with the catalog's defaults and listed in ``NOT_YET_READ``; a test keeps that
list exactly true, so a setting is never mistaken for a behaviour.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class ProviderRoute(BaseModel):
    """LOOP-6: one provider a turn can fall back to, and what its requests must fit.

    ``token_ratio`` is the route's tokens per token of this engine's estimate
    (``tokens.count_message``): a model whose tokenizer counts 25 % more has 1.25. A
    request for the route must fit ``context_window_tokens`` by the route's count.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    context_window_tokens: int
    token_ratio: float = 1.0

    @property
    def window_in_estimate(self) -> int:
        """The route's window in this engine's estimate: what preflight compares against."""
        return int(self.context_window_tokens / self.token_ratio)


class Limits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # SES: session lanes and incarnations
    group_sessions_per_user: bool = True
    thread_sessions_per_user: bool = False
    restart_resume_window_s: float = 120.0
    stuck_restart_threshold: int = 3
    session_reset_mode: Literal["idle", "daily", "both", "none"] = "none"
    session_idle_minutes: int = 1440
    session_reset_at_hour: int = 4             # daily resets at this hour, UTC
    resume_freshness_window_s: float = 3600.0  # read by the released 0.19.0 order only
    session_resolution_order: Literal["reference", "released_0_19"] = "reference"
    route_attempts_max: int = 3                # compare-and-set retries of one routing
    session_prune_after_s: float = 0.0         # retire lanes idle this long; <= 0: never

    # ADM: the admission door
    admission_key_chars_max: int = 1024      # principal, session and request ids
    admission_payload_bytes_max: int = 65_536  # the canonical JSON of one payload

    # LEASE: the per-session turn lease
    lease_ttl_s: float = 300.0
    lease_refresh_s: float = 60.0
    lease_wait_s_max: float = 1800.0
    lease_poll_s: float = 1.0

    # CTX / CMP: prologue, compression and preflight
    context_window_tokens: int = 128_000
    compression_enabled: bool = True
    compression_threshold: float = 0.50
    compression_target_ratio: float = 0.20
    compression_protect_last: int = 20
    compression_protect_first: int = 3
    compression_small_window_tokens: int = 512_000
    compression_small_window_threshold: float = 0.75
    compression_tail_floor_messages: int = 8
    compression_passes_max: int = 3
    compression_progress_ratio: float = 0.95
    compression_cooldown_s: float = 600.0
    compression_ineffective_max: int = 2
    compression_lock_ttl_s: float = 300.0
    compression_in_place: bool = False  # CMP-5: archive and compact under the same id, no rotation
    idle_compact_after_s: float = 0.0
    # session-scoped nudge counters (CTX-1); 0 turns a nudge off. Hermes reads them from
    # ``memory.nudge_interval`` and ``skills.creation_nudge_interval``, both 10 by default.
    memory_nudge_interval: int = 10   # user turns between memory reviews
    skill_nudge_interval: int = 10    # loop iterations between skill reviews

    # LOOP: the main loop
    max_iterations: int = 90
    iteration_budget: int = 90
    grace_call_enabled: bool = True
    transient_retries_max: int = 3
    backoff_base_s: float = 2.0
    backoff_max_s: float = 60.0
    auth_refreshes_max: int = 1
    dropped_toolcall_retries_max: int = 3
    thinking_prefill_retries_max: int = 2
    empty_retries_max: int = 3
    invalid_json_retries_max: int = 3
    invalid_tool_rounds_max: int = 3
    outer_loop_errors_max: int = 8     # LOOP-5: failed calls of one turn, whatever their kind
    # LOOP-6: the providers a turn falls back to, in order, once the primary is spent
    fallback_providers: tuple[ProviderRoute, ...] = ()
    # FIN-1's gate: an answer after file changes is withheld once while the model verifies
    verify_before_answer: bool = False
    # DEL / FIN-2: ask for streamed replies; their deltas become the turn's delta events
    stream_replies: bool = True

    # TOOL: the tool round
    tool_workers_max: int = 8
    tool_batch_deadline_s: float = 420.0
    tool_start_gate_s: float = 120.0
    tool_result_spill_chars: int = 50_000  # TOOL-7: longer results go to a spill file

    # model identity used in requests
    model: str = "hermes-ref-model"
    max_tokens: int | None = None


# Settings of capabilities not built yet: nothing reads them (the catalog id says whose).
NOT_YET_READ = frozenset({
    # CMP-1's protect-last default: the tail is kept by token budget with a floor of
    # compression_tail_floor_messages (CMP-2), as Hermes keeps it, so nothing reads it
    "compression_protect_last",
    "skill_nudge_interval",        # CTX-1: ticked per loop iteration once a skill tool exists
})
