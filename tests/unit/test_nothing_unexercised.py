"""Settings and flags say what they are: each one is read (or produced) by code, or listed as not yet."""

from __future__ import annotations

import ast
from pathlib import Path

import hermes_ref
import sim
from hermes_ref.limits import NOT_YET_READ, Limits
from hermes_ref.models import SCAFFOLD_FLAGS_NOT_YET_PRODUCED, ScaffoldFlag
from hermes_ref.outcomes import EXITS_NOT_YET_PRODUCED, ExitReason

ROOTS = (Path(hermes_ref.__file__).parent, Path(sim.__file__).parent)


def _attributes_read() -> set[str]:
    names: set[str] = set()
    for root in ROOTS:
        for path in root.rglob("*.py"):
            if path.name == "limits.py" and path.parent.name == "hermes_ref":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute):
                    names.add(node.attr)
    return names


def test_every_setting_is_read_or_listed_as_not_yet_read() -> None:
    """A Limits field nothing reads is in NOT_YET_READ, and a listed one is truly unread."""
    read = _attributes_read()
    fields = set(Limits.model_fields)
    unread = {f for f in fields if f not in read}
    assert unread == set(NOT_YET_READ), (
        f"read but listed: {sorted(set(NOT_YET_READ) - unread)}; "
        f"unread and unlisted: {sorted(unread - set(NOT_YET_READ))}")


def test_every_scaffold_flag_is_produced_or_listed_as_not_yet() -> None:
    """A ScaffoldFlag member the engine never sets is listed as not yet produced."""
    produced: set[str] = set()
    for path in Path(hermes_ref.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "ScaffoldFlag" and path.name != "models.py":
                produced.add(node.attr)
    never = {f for f in ScaffoldFlag if f.name not in produced}
    assert never == set(SCAFFOLD_FLAGS_NOT_YET_PRODUCED)


def test_every_exit_reason_is_recorded_somewhere_or_listed_as_not_yet() -> None:
    """An ExitReason no engine module names (outside outcomes.py) is listed as not yet produced."""
    named: set[str] = set()
    for path in Path(hermes_ref.__file__).parent.glob("*.py"):
        if path.name == "outcomes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "ExitReason":
                named.add(node.attr)
    never = {r for r in ExitReason if r.name not in named}
    assert never == set(EXITS_NOT_YET_PRODUCED)
