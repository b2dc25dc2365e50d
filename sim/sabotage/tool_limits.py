"""Broken tool batches: results in the order they finished, no bound on workers, no
deadline, a start gate that never opens or opens late, an oversized result sent inline or
a spill name that forgets its sequence number (TOOL-5, TOOL-7)."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

from hermes_ref import tool_batch, tool_round, tool_spill
from hermes_ref.context import TurnContext
from hermes_ref.effects import ExecuteTools
from hermes_ref.models import ToolResult
from hermes_ref.shell import workspace_tools
from hermes_ref.tool_batch import BatchBounds
from hermes_ref.tool_specs import GuardedRunner, call_problem
from sim import tools as sim_tools
from sim.sabotage.base import sabotage

# ---- TOOL-5: results as the tools finished ---------------------------------------------


async def _finish_order(ctx: TurnContext, segment: Any, specs: Any) -> tuple[ToolResult, ...]:
    problems = {c.id: call_problem(c, specs) for c in segment.calls}
    dispatch = tuple(c for c in segment.calls if problems[c.id] is None)
    if len(dispatch) < len(segment.calls):
        return await _original_run_segment(ctx, segment, specs)
    return await ExecuteTools(ctx.token, ctx.session_id, dispatch, segment.parallel,
                              tool_round.batch_bounds(ctx.limits))  # no problem: use them as is


_original_run_segment = tool_round._run_segment


@sabotage("results_in_finish_order", ("TOOL-5",),
          "a segment with nothing to answer in place hands back the driver's results as they "
          "came, in the order the tools finished")
def _p_results_in_finish_order() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(tool_round, "_run_segment", _finish_order)]


# ---- TOOL-5: every call of a batch at once -----------------------------------------------


@sabotage("workers_unbounded", ("TOOL-5",),
          "a parallel batch gets one worker per call instead of at most [8]")
def _p_workers_unbounded() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(BatchBounds, "workers", lambda self, calls: max(1, calls))]


# ---- TOOL-5: no deadline --------------------------------------------------------------------


@sabotage("deadline_not_enforced", ("TOOL-5",),
          "the batch waits for every call however long it takes, so a result that ended past "
          "the deadline counts")
def _p_deadline_not_enforced() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(tool_batch, "gives_up_at", lambda bounds: math.inf)]


# ---- TOOL-5: the gate never opens ----------------------------------------------------------


def _strict_order(ready_s: float, now_s: float, earlier_started: bool, bounds: BatchBounds) -> bool:
    return earlier_started  # the bounded wait forgotten: strict start order, however long


@sabotage("start_gate_ignored", ("TOOL-5",),
          "a ready call waits for the earlier calls to start however long that takes, so one "
          "call slow to begin holds back the whole batch")
def _p_start_gate_ignored() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(tool_batch, "may_start", _strict_order)]


# ---- TOOL-5: the gate takes the larger bound ------------------------------------------------


def _wide_gate(self: BatchBounds) -> float:
    return max(self.start_gate_s, self.deadline_s / 2)  # max where min belongs


@sabotage("start_gate_takes_the_larger_bound", ("TOOL-5",),
          "the start gate is max([120 s], deadline / 2) instead of the min, so a call slow "
          "to begin holds back the calls behind it for half the deadline")
def _p_start_gate_wide() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(BatchBounds, "gate_s", property(_wide_gate))]


# ---- TOOL-7: the whole text inline ------------------------------------------------------------


def _inline(self: GuardedRunner, call: Any, result: ToolResult) -> ToolResult:
    return result  # the cap check dropped: whatever the tool printed goes to the model


@sabotage("oversized_result_inline", ("TOOL-7",),
          "a result over the cap is sent to the model whole instead of spilled to a file")
def _p_oversized_result_inline() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(GuardedRunner, "spill", _inline)]



# ---- TOOL-7: a spill's name forgets its sequence number ---------------------------------------


def _name_by_call_id(seq: int, call_id: str) -> str:
    safe = tool_spill._UNSAFE.sub("_", call_id)[:64].strip(".") or "call"
    return f"{tool_spill.SPILL_DIR}/{safe}.txt"  # the sequence number dropped: "ids are unique"


@sabotage("spill_named_by_call_id_only", ("TOOL-7",),
          "a spill file is named by its call id alone, so a call id that repeats in a later "
          "turn finds its name taken and the output is not spilled")
def _p_spill_named_by_call_id() -> list[AbstractContextManager[Any]]:
    return [mock.patch.object(module, "spill_name", _name_by_call_id)
            for module in (tool_spill, sim_tools, workspace_tools)]
