"""The engine core performs no I/O: it imports no clock, randomness, network, disk or event loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hermes_ref

FORBIDDEN = {"asyncio", "httpx", "aiosqlite", "time", "random", "uuid", "sqlite3", "os",
             "subprocess", "socket", "threading", "secrets"}
EDGE = {"driver.py", "runtime.py", "cli.py"}  # the asyncio driver and the entry points
ROOT = Path(hermes_ref.__file__).parent
CORE = sorted(p for p in ROOT.glob("*.py") if p.name not in EDGE)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
            if node.module == "hermes_ref":
                found.update(f"hermes_ref.{a.name}" for a in node.names)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                "hermes_ref.adapters"):
            found.add("hermes_ref.adapters")
    return found


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_module_imports_no_io(path: Path) -> None:
    """A core module imports none of the I/O modules, nor the adapters."""
    bad = _imports(path) & (FORBIDDEN | {"hermes_ref.adapters"})
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_core_list_is_not_empty() -> None:
    """The purity check looks at the whole story: engine, loop, tool round, finalizer."""
    names = {p.name for p in CORE}
    assert {"engine.py", "loop.py", "tool_round.py", "finalizer.py", "prologue.py"} <= names


def test_no_effect_inside_except_or_finally() -> None:
    """House rule: no await inside an except or finally block of the core."""
    for path in CORE:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            blocks: list[ast.AST] = []
            if isinstance(node, ast.Try):
                blocks = [*node.handlers, *node.finalbody]
            for block in blocks:
                for inner in ast.walk(block):
                    assert not isinstance(inner, ast.Await), (
                        f"{path.name}:{getattr(inner, 'lineno', '?')} awaits inside except/finally")
