"""Property: whatever messages, clock jumps, restarts, background processes and watcher passes
come, the session lanes keep every SES rule, judged by the checkers from the record.

Hypothesis generates a sequence of steps over three lanes (a DM, a second DM and a group
member) under a generated reset policy, resolution order and prune age: messages, clock
jumps, graceful and hard restarts, background processes, watcher passes, user resets and
crashes inside a turn (followed by a start without the clean-exit marker). The virtual clock
moves one second after every step, so no two steps share an instant (the lane log and the
event log have no common order within one instant; see docs/sessions.md). Every step is
checked as it happens; the run must end with no violation at all.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_ref.session import SessionSource
from hermes_ref.wire import ProviderRequest
from sim.harness import Story
from sim.provider import FunctionProvider, text

MAX_EXAMPLES = int(os.environ.get("HERMES_REF_PROPERTY_EXAMPLES", "60"))

LANES = (SessionSource(platform="telegram", chat_id="99"),
         SessionSource(platform="telegram", chat_id="77"),
         SessionSource(platform="discord", chat_type="group", chat_id="g", participant="alice"))

LANE = st.integers(0, len(LANES) - 1)
STEP = st.one_of(
    st.tuples(st.just("message"), LANE),
    st.tuples(st.just("advance"), st.sampled_from([30, 90, 600, 1900, 7200, 90_000])),
    st.tuples(st.just("restart"), st.booleans(), st.frozensets(LANE), st.booleans()),
    st.tuples(st.just("background"), LANE, st.booleans()),
    st.tuples(st.just("watch")),
    st.tuples(st.just("reset"), LANE),
    st.tuples(st.just("crash"), LANE, st.sampled_from(
        ["before:lease", "before:user", "after:user", "before:final", "after:final"])),
)
SETTINGS = st.fixed_dictionaries({
    "session_reset_mode": st.sampled_from(["idle", "daily", "both", "none"]),
    "session_idle_minutes": st.sampled_from([30, 1440]),
    "session_resolution_order": st.sampled_from(["reference", "released_0_19"]),
    "session_prune_after_s": st.sampled_from([0.0, 86_400.0]),
    "stuck_restart_threshold": st.sampled_from([1, 2, 3]),
})


def _answer(request: ProviderRequest) -> Any:
    return text("Noted.")


def _step(s: Story, step: tuple[Any, ...], live: set[int]) -> None:
    kind = step[0]
    if kind == "message":
        s.message(LANES[step[1]], "Hello.")
    elif kind == "advance":
        s.advance(step[1])
    elif kind == "restart":
        s.lane_restart(graceful=step[1], running=tuple(LANES[i] for i in sorted(step[2])),
                       drained=step[3])
    elif kind == "background" and (step[1] in live) != step[2]:
        s.background(LANES[step[1]], live=step[2])
        (live.add if step[2] else live.discard)(step[1])
    elif kind == "watch":
        s.expiry_watch()
    elif kind == "reset":
        s.reset_lane(LANES[step[1]])
    elif kind == "crash":  # the process dies inside the turn; the next one starts unclean
        s.faults(crash=step[2])
        crashed = s.message(LANES[step[1]], "Hello?") is None
        s.faults()
        if crashed:
            s.advance(1)
            s.lane_restart(graceful=False)


@settings(max_examples=MAX_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(limits=SETTINGS, steps=st.lists(STEP, max_size=14))
def test_any_lane_history_keeps_the_ses_rules(limits: dict[str, Any],
                                              steps: list[tuple[Any, ...]]) -> None:
    """Every SES checker passes after every step of any generated lane history."""
    with tempfile.TemporaryDirectory() as tmp:
        s = Story(store_kind="memory", workdir=Path(tmp), trace=False)
        s.limits(**limits)
        s.use_provider(FunctionProvider(_answer))
        live: set[int] = set()
        for step in steps:
            _step(s, step, live)
            s.advance(1)
        s.check()
        assert not s.violations, [str(v) for v in s.violations]
