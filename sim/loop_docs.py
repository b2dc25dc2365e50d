"""The tables of docs/loop.md, generated from the code (a test keeps the doc equal to them).

* ``exit_table``: every ``outcomes.ExitReason``, whether it fails the turn, and the engine
  functions that name it (record it, or test for it), found by reading the engine's
  source for ``ExitReason.<NAME>``;
* ``retry_table``: what the loop does with each error a model call can raise, read from the
  error classes themselves (``transient``) and the settings that bound each answer;
* ``ladder.table``: the empty-reply ladder, from ``ladder.RUNGS``.
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

from hermes_ref import (
    closure,
    context,
    finalizer,
    ladder,
    loop,
    preflight,
    prologue,
    redirect,
    routes,
    tool_round,
)
from hermes_ref import errors as err
from hermes_ref.outcomes import FAILED_EXITS, ExitReason

# The engine modules whose functions end turns (the others only pass an ending along).
ENDING_MODULES: tuple[ModuleType, ...] = (
    loop, ladder, tool_round, finalizer, preflight, prologue, context, redirect, routes, closure,
)
try:  # compaction ends turns too, where it exists
    from hermes_ref import compaction
    ENDING_MODULES += (compaction,)
except ImportError:  # pragma: no cover - the module is optional for this table
    pass


def producers() -> dict[ExitReason, list[str]]:
    """Each exit reason -> the ``module.function`` names whose code names it."""
    found: dict[ExitReason, list[str]] = {r: [] for r in ExitReason}
    for module in ENDING_MODULES:
        tree = ast.parse(inspect.getsource(module))
        short = module.__name__.rsplit(".", 1)[-1]
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) \
                        and inner.value.id == "ExitReason" and inner.attr in ExitReason.__members__:
                    where = f"`{short}.{node.name}`"
                    reason = ExitReason[inner.attr]
                    if where not in found[reason]:
                        found[reason].append(where)
    return found


def exit_table() -> str:
    lines = ["| exit reason | fails the turn | named in |", "|---|---|---|"]
    made = producers()
    for reason in ExitReason:
        where = ", ".join(sorted(made[reason])) or "(no engine path yet)"
        lines.append(f"| `{reason.value}` | {'yes' if reason in FAILED_EXITS else 'no'} | {where} |")
    return "\n".join(lines)


def _provider_errors(base: type[err.ProviderError]) -> list[type[err.ProviderError]]:
    out = [base]
    for sub in base.__subclasses__():
        out.extend(_provider_errors(sub))
    return out


def _decision(cls: type[BaseException]) -> str:
    if issubclass(cls, err.ContextOverflow):
        return ("back to preflight before any count (not one of `outer_loop_errors_max`'s "
                "failed calls): compaction rebuilds the request, or the turn fails closed")
    if issubclass(cls, err.ProviderAuthError):
        return ("renew the credentials through the port (`RefreshCredentials`), at most "
                "`auth_refreshes_max` times, then fall back (LOOP-6) or end "
                "`terminal_provider_error`")
    cut = getattr(err, "StreamCut", None)  # FIN-2's stream cut, where streaming exists
    if cut is not None and issubclass(cls, cut):
        return ("keep the answer when the deltas already hold a whole one (FIN-2); "
                "otherwise as `ProviderServerError`")
    if issubclass(cls, err.ProviderError) and cls.transient:
        wait = "its Retry-After, else " if issubclass(cls, err.RateLimited) else ""
        return (f"sleep {wait}`backoff_base_s`·2^attempt (≤ `backoff_max_s`, seeded jitter), "
                "retry up to `transient_retries_max` times, then fall back (LOOP-6) or end "
                "`terminal_provider_error`")
    if issubclass(cls, err.ProviderError):
        return "end the turn `terminal_provider_error` at once"
    if issubclass(cls, err.LocalProcessingError):
        return "end the turn `local_processing_error` at once, no retry"
    if issubclass(cls, err.Redirected):
        return "start the iteration over: the correction is taken in at the loop's top (LOOP-4)"
    return "end the turn `interrupted`"


def retry_table() -> str:
    """Every error a model call meets and the loop's answer; every failed provider call but
    a context overflow (it goes back to preflight first) also counts against
    `outer_loop_errors_max`, past which the turn ends."""
    lines = ["| error | transient | the loop's answer |", "|---|---|---|"]
    classes: list[type[BaseException]] = [
        *_provider_errors(err.ProviderError)[1:], err.LocalProcessingError, err.Redirected,
        err.TurnInterrupted]
    for cls in classes:
        transient = "yes" if getattr(cls, "transient", False) else "no"
        lines.append(f"| `{cls.__name__}` | {transient} | {_decision(cls)} |")
    return "\n".join(lines)


def ladder_table() -> str:
    return ladder.table()


def render() -> str:
    """The three tables, as ``python -m sim.loop_docs`` prints them for docs/loop.md."""
    return "\n\n".join((exit_table(), retry_table(), ladder_table())) + "\n"


if __name__ == "__main__":
    print(render(), end="")
