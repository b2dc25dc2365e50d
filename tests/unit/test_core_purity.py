"""The engine core performs no I/O: every module of ``hermes_ref`` outside ``hermes_ref.shell``
imports no clock, randomness, network, disk or event loop, nor the shell, nor the harness."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hermes_ref

FORBIDDEN = {"asyncio", "httpx", "aiosqlite", "time", "random", "uuid", "sqlite3", "os",
             "subprocess", "socket", "threading", "secrets"}
ROOT = Path(hermes_ref.__file__).parent
SHELL = ROOT / "shell"
CORE = sorted(p for p in ROOT.rglob("*.py") if SHELL not in p.parents)
ENGINE = sorted(ROOT.rglob("*.py"))
HARNESS = {"sim", "scenarios", "tests"}


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
                "hermes_ref.shell"):
            found.add("hermes_ref.shell")
    return found


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_module_imports_no_io(path: Path) -> None:
    """A core module imports none of the I/O modules, nor the adapters."""
    bad = _imports(path) & (FORBIDDEN | {"hermes_ref.shell"})
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", ENGINE, ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_never_reaches_into_its_harness(path: Path) -> None:
    """Nothing in ``hermes_ref`` (core or shell) imports the simulator, scenarios or tests."""
    bad = _imports(path) & HARNESS
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_shell_is_a_package_apart() -> None:
    """The shell holds the asyncio driver and the runtime, and the core holds neither."""
    shell = {p.name for p in SHELL.glob("*.py")}
    assert {"driver.py", "runtime.py", "http_provider.py", "sqlite_store.py"} <= shell
    assert not {"driver.py", "runtime.py", "cli.py"} & {p.name for p in CORE}


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
