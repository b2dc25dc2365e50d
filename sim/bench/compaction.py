"""The cost of planning a compaction: a long history pruned, planned, summarized and repaired.

Theory of operation
-------------------
The row times the pure part of one compaction pass (``hermes_ref.compression``: prune, plan,
compose with a fixed summary, orphan repair) on a history of N messages: user turns with
tool rounds of one to three calls and text answers, about 40 tokens a message, in a window
that puts the threshold well inside it. The summary call itself is the auxiliary model's
time and is not counted. Each figure is the median [min-max] of ``REPS`` repetitions of
``ROUNDS`` plans, in milliseconds per compaction, for N = 200 and N = 2,000; the growth is
the 2,000 figure over the 200 one (the work is linear in the middle, which grows about 13
times: the head and the tail keep their size), and the 2,000 figure is also given
in calibration turns (the compaction's time times the calibration's turns/s): how many
turns of the bare effect machinery one compaction of a long session costs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, TextIO

from hermes_ref import compression
from hermes_ref.limits import Limits
from hermes_ref.models import Message, Role, ToolCall
from sim.bench.ratios import one, summary

SIZES = (200, 2_000)
REPS, ROUNDS = 5, 5


def history(n: int) -> tuple[Message, ...]:
    """About ``n`` messages: a user turn, tool rounds, an answer, again."""
    rows: list[Message] = []
    k = 0
    while len(rows) < n:
        rows.append(Message(role=Role.USER, content=f"Question {k}: what do the files say now?"))
        for r in range(k % 3):
            calls = tuple(ToolCall(id=f"c{k}_{r}_{j}", name="read_file",
                                   arguments=f'{{"path": "f{j}.txt"}}') for j in range(1 + r))
            rows.append(Message(role=Role.ASSISTANT, tool_calls=calls))
            rows.extend(Message(role=Role.TOOL, tool_call_id=c.id, tool_name="read_file",
                                content="     1|" + "the figures are in order " * 5)
                        for c in calls)
        rows.append(Message(role=Role.ASSISTANT, content=f"Answer {k}: " + "all well. " * 8))
        k += 1
    return tuple(rows[:n])


def compact_once(rows: tuple[Message, ...], limits: Limits) -> tuple[Message, ...]:
    figures = compression.budget(limits)
    pruned = compression.prune(rows, figures, limits)
    layout = compression.plan(pruned, figures, limits, rows[-1].content)
    if layout is None:
        raise AssertionError("the benchmark history has nothing to compact")
    return compression.compose(layout, "the earlier work, in short", None)


def time_ms(n: int) -> list[float]:
    rows = history(n)
    limits = Limits(context_window_tokens=max(4_000, compression.tokens_of(rows) // 2))
    compact_once(rows, limits)  # warm: every message's wire form and token count computed
    out = []
    for _ in range(REPS):
        started = time.perf_counter()
        for _ in range(ROUNDS):
            compact_once(rows, limits)
        out.append((time.perf_counter() - started) * 1000 / ROUNDS)
    return out


def rows(sizes: Any, report: dict[str, Any], progress: TextIO | None = None) -> dict[str, Any]:
    """Every row of this module, for ``sim.bench.runner.measure`` (one line there)."""
    if progress is not None:
        progress.write(f"bench: compaction planning of {' and '.join(map(str, SIZES))} messages\n")
    small, large = (time_ms(n) for n in SIZES)
    out: dict[str, Any] = {"compaction_ms_200": summary(small), "compaction_ms_2000": summary(large),
                           "compaction_growth_200_to_2000": one(
                               statistics.median(large) / statistics.median(small))}
    calibration = report.get("calibration_turns_per_s")
    if calibration is not None:
        out["compaction_2000_in_calibration_turns"] = one(
            statistics.median(large) / 1000 * calibration["median"])
    return out


LABELS = (
    ("compaction_ms_200", "ms to prune, plan and compose 200 messages"),
    ("compaction_ms_2000", "the same for 2,000 messages"),
    ("compaction_growth_200_to_2000", "2,000 / 200 (linear: about 13, the middle's growth)"),
    ("compaction_2000_in_calibration_turns", "one 2,000-message compaction, in calibration turns"),
)


def lines(report: dict[str, Any]) -> list[str]:
    """The rows as table lines, for ``sim.bench.render`` (one line there)."""
    out = ["compaction planning (sim.bench.compaction):"]
    for name, how in LABELS:
        stat = report.get(name)
        if stat is not None:
            out.append(f"  {name:<64} {stat['median']:>8,.2f}  {how}")
    return out
