"""House style that can be checked: no function of the engine, harness or scenarios exceeds 70 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import hermes_ref

ROOT = Path(hermes_ref.__file__).parent.parent
PACKAGES = ("hermes_ref", "sim", "scenarios")
LINES_MAX = 70


def test_no_function_is_over_seventy_lines() -> None:
    """Every function and method of hermes_ref, sim and scenarios spans at most 70 lines."""
    long: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    span = (node.end_lineno or node.lineno) - node.lineno + 1
                    if span > LINES_MAX:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({span})")
    assert not long, long
