"""A plan written as a scenario: plain ``Story`` calls a reader can follow line by line.

The file makes the very calls ``sim.explore.run.stage`` makes, in the same order, then the
calm phase, so running the scenario replays the explored run exactly (a test compares the
two timelines). Once the bug it found is fixed, the file joins ``scenarios/`` as a
regression test: it declares the invariant ids the run broke and expects every admission
to reach a terminal state.
"""

from __future__ import annotations

import re

from sim.explore import edges, terminal, watch
from sim.explore.lanes import render_lanes, render_settings
from sim.explore.plan import (
    BIG_LOG,
    ClockJump,
    Drain,
    FaultKind,
    Handover,
    Interrupt,
    Kill,
    Redirect,
    Stall,
    Submit,
    WorldPlan,
)
from sim.explore.run import FALLBACK_MODEL, RunReport

_NAMES = ("one", "two", "three", "four", "five", "six", "seven", "eight")


def scenario_name(plan: WorldPlan) -> str:
    return f"explored_seed_{plan.seed}"


def _model_options(plan: WorldPlan) -> str:
    """The explored model's keyword arguments the plan sets, each with its leading comma."""
    return ((f", grace_outages={plan.grace_outages!r}" if plan.grace_outages else "")
            + (", huge_reads_share_id=True" if plan.huge_reads_share_id else "")
            + (", empty_after_correction=True" if plan.empty_after_correction else "")
            + (", refuse_the_check=True" if plan.refuse_the_check else ""))


def render(plan: WorldPlan, report: RunReport, *, title: str | None = None) -> str:
    """The Python source of a scenario module that replays ``plan``."""
    ids = report.invariants or ["ADM-5"]
    found = report.violations[0] if report.violations else (
        f"stuck: {', '.join(report.stuck)}" if report.stuck else report.verdict.value)
    summary = re.sub(r"\s+", " ", found)
    title = title or f"Explored seed {plan.seed}, shrunk: {summary[:90]}"
    names = _NAMES[:plan.processes]
    lines = [
        f'"""Seed {plan.seed} of `hermes-ref explore`, shrunk to {plan.processes} process(es), '
        f"{len(plan.sessions)} session(s), {plan.size[2]} turn(s) and {plan.size[3]} fault(s).",
        "",
        "What the run found:",
        f"    {summary}",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        *(["from hermes_ref.limits import ProviderRoute"] if plan.fallback_window else []),
        *(["from hermes_ref.session import SessionSource"] if plan.lanes is not None else []),
        *edges.render_imports(plan),
        *(["from sim.explore.lanes import LaneWorld"] if plan.lanes is not None else []),
        "from sim.explore.model import ExploreModel",
        "from sim.explore.plan import " + ("BIG_LOG_TEXT, " if any(
            r.kind is FaultKind.HUGE_READ for r in plan.replies) else "") + "FaultKind, ReplyFault",
        "from sim.explore.run import calm_phase, jump_clock, redirect_a_running_turn",
        *_more_imports(plan)[0],
        "from sim.harness import Story, scenario",
        *_more_imports(plan)[1],
        "",
        "",
        f"@scenario({title!r},",
        f"          invariants={tuple(ids)!r}, stage=\"explore\")",
        f"def {scenario_name(plan)}(s: Story) -> None:",
    ]
    body = [f"s.seed = {plan.seed}  # the world's seed: it draws the interleaving",
            's.world.id_style = "seeded"  # turn, admission and call ids drawn from the seed',
            f"model = ExploreModel(({_replies(plan)}), ids=s.world.chooser{_model_options(plan)})",
            "s.use_provider(model)"]
    if plan.files:
        body.append(f"s.files({dict(plan.files)!r})")
    if plan.max_iterations is not None:
        body.append(f"s.limits(max_iterations={plan.max_iterations})")
    body += _options(plan)
    for session, principal in plan.sessions.items():
        body.append(f"s.bind({principal!r}, session={session!r})")
        body.append(f"s.bind({'op-' + session!r}, session={session!r}, role=\"operator\", "
                    "kind=\"operator\")")
    for member, session in plan.members.items():
        body.append(f"s.bind({member!r}, session={session!r})")
    body.append(f"{', '.join(names)} = "
                + ", ".join(["s.main_process()"] + ["s.process()"] * (plan.processes - 1)))
    for fault in plan.replies:
        if fault.kind is FaultKind.SLOW_REPLY:
            body.append(f"s.delay_reply({fault.call}, {fault.seconds!r})")
        elif fault.kind is FaultKind.STREAM_CUT:  # the stream of that call breaks
            body.append(f"s.world.stream_cuts[{fault.call}] = {fault.deltas}")
    body += _store_faults(plan)
    body += watch.render_clients(plan.clients)
    for step in plan.steps:
        body.append(_step(step, names))
    if plan.lanes is not None:
        body += render_lanes(plan.lanes, names)
    body += ["s.run_all()", *_disarmed(plan)]
    body += ["stuck = calm_phase(s)  # faults off: recover, reconcile, drain until done",
             's.expect(not stuck, f"every admission reached a terminal state: {stuck}")']
    return "\n".join(lines + ["    " + line for line in body]) + "\n"


def _disarmed(plan: WorldPlan) -> list[str]:
    """What the faulty phase armed and did not reach, disarmed before the calm phase."""
    lines = []
    if any(r.kind is FaultKind.STREAM_CUT for r in plan.replies):
        lines.append("s.world.stream_cuts.clear()  # a cut not reached is no fault of the calm")
    if plan.lock_stall_s is not None:
        lines.append("s.world.lock_stalls.clear()  # nor a freeze not reached")
    if any(isinstance(s, Redirect) and s.during is not None for s in plan.steps):
        lines.append("s.world.moments.clear()  # nor a correction held for a moment not reached")
    return lines


def _store_faults(plan: WorldPlan) -> list[str]:
    """The crash point, the crash at an effect and the write failures, as one call."""
    if plan.crash is None and plan.crash_at_effect is None and not plan.write_failures:
        return []
    crash = repr(plan.crash.name) if plan.crash else "None"
    writes = {s.value: n for s, n in plan.write_failures.items()}
    return [f"s.faults(crash={crash}, crash_at_effect={plan.crash_at_effect!r}, "
            f"fail_writes={writes!r})"]


def _replies(plan: WorldPlan) -> str:
    parts = [f"ReplyFault(call={r.call}, kind=FaultKind.{r.kind.name}"
             + (f", seconds={r.seconds!r}" if r.seconds else "")
             + (f", deltas={r.deltas}" if r.deltas else "") + ")" for r in plan.replies]
    return "".join(p + ", " for p in parts)


def _options(plan: WorldPlan) -> list[str]:
    """The slow tools, the context window and the fallback route, as ``stage`` sets them."""
    lines = []
    if any(r.kind is FaultKind.HUGE_READ for r in plan.replies):
        lines.append(f"s.files({{{BIG_LOG!r}: BIG_LOG_TEXT}})  # a log of 120,000 characters")
    if plan.verify_before_answer:
        lines.append("s.limits(verify_before_answer=True)")
    for t in plan.tool_timings:
        stall = f", stall_s={t.stall_s!r}" if t.stall_s > 0 else ""
        if t.stuck:
            lines.append(f"s.world.tools.stuck({t.tool!r}, path={t.path!r}, "
                         f"start_delay_s={t.start_delay_s!r}{stall})")
        else:
            lines.append(f"s.world.tools.slow({t.tool!r}, {t.seconds!r}, path={t.path!r}, "
                         f"start_delay_s={t.start_delay_s!r}{stall})")
    if plan.context_window is not None:
        lines.append(f"s.limits(context_window_tokens={plan.context_window})")
    if plan.fallback_window is not None:
        lines += [f"s.limits(fallback_providers=(ProviderRoute(model={FALLBACK_MODEL!r}, "
                  f"context_window_tokens={plan.fallback_window}, token_ratio=1.25),))",
                  f"s.use_provider_for({FALLBACK_MODEL!r}, model.for_fallback())"]
    if plan.lanes is not None:
        lines.append(render_settings(plan.lanes))
    return lines + terminal.render_options(plan.terminals, plan.lease_wait_s, plan.build_log_s) \
        + edges.render_options(plan)


def _more_imports(plan: WorldPlan) -> tuple[list[str], list[str]]:
    """The imports of the later parts' helpers the plan uses: those sorted before
    ``sim.harness`` and those after it."""
    ops = {step.op for step in plan.steps}
    before = (["from sim.explore.terminal import redact_later"] if "redact" in ops else []) + (
        ["from sim.explore.watch import recover_later"] if "recover" in ops else [])
    moments = any(isinstance(s, Redirect) and s.during is not None for s in plan.steps)
    after = (["from sim.interventions import correct_at_a_moment"] if moments else []) + (
        ["from sim.stream_client import SimClient"] if plan.clients else [])
    return before, after


def _door_extras(step: Submit) -> str:
    """A submission's intent and internal kind, written only when not the default."""
    extras = f", intent={step.intent!r}" if step.intent != "queue" else ""
    return extras + (f", kind={step.kind!r}" if step.kind is not None else "")


def _step(step: object, names: tuple[str, ...]) -> str:
    if isinstance(step, Submit):
        payload = {"text": step.text, **step.claims}
        return (f"s.start_submit({names[step.process]}, {step.principal!r}, "
                f"{step.request_id!r}, {payload!r}, session={step.session!r}, "
                f"after_s={step.at_s!r}{_door_extras(step)})")
    if isinstance(step, Drain):
        return f"s.start_drain({names[step.process]}, {step.session!r}, after_s={step.at_s!r})"
    if isinstance(step, Kill):
        return f"s.kill({names[step.process]}, after_s={step.at_s!r})"
    if isinstance(step, Stall):
        return f"s.stall({names[step.process]}, {step.seconds!r}, after_s={step.at_s!r})"
    if isinstance(step, ClockJump):
        return f"jump_clock(s, {step.seconds!r}, after_s={step.at_s!r})"
    if isinstance(step, Interrupt):
        return f"s.interrupt(after_s={step.at_s!r}, session={step.session!r})"
    if isinstance(step, Redirect) and step.during is not None:
        return (f"correct_at_a_moment(s, {step.text!r}, after_s={step.at_s!r}, "
                f"session={step.session!r}, during={step.during!r}, slow_s={step.slow_s!r}"
                + (f", calls={step.calls})" if step.calls else ")"))
    if isinstance(step, Redirect):
        return (f"redirect_a_running_turn(s, {step.text!r}, after_s={step.at_s!r}, "
                f"session={step.session!r})")
    line = terminal.render_step(step, names) or watch.render_step(step, names)
    if line is not None:
        return line
    if isinstance(step, Handover):  # the caller's own list, handed with the turn
        return (f"s.start_turn({step.text!r}, session={step.into!r}, "
                f"process={names[step.process]}, after_s={step.at_s!r}, "
                f"history=handed_history({step.history}))")
    raise TypeError(f"unknown step {step!r}")
