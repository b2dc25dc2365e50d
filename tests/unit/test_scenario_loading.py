"""A broken scenario file is reported by name and line, and nothing else is affected."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import scenarios
from hermes_ref.errors import BadInput


def _package(tmp_path: Path, name: str, body: str) -> str:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text(body)
    sys.path.insert(0, str(tmp_path))
    return name


def test_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    """A scenario module with a syntax error gives BadInput with its path and line."""
    pkg = _package(tmp_path, "scen_syntax", "x = 1\ndef broken(:\n")
    try:
        with pytest.raises(BadInput, match=r"broken\.py, line 2"):
            scenarios.load_all(pkg)
    finally:
        sys.path.remove(str(tmp_path))


def test_import_error_names_the_module(tmp_path: Path) -> None:
    """A scenario module that raises on import gives BadInput naming the module."""
    pkg = _package(tmp_path, "scen_raise", "raise RuntimeError('no such fixture')\n")
    try:
        with pytest.raises(BadInput, match=r"scen_raise\.broken failed to load: RuntimeError"):
            scenarios.load_all(pkg)
    finally:
        sys.path.remove(str(tmp_path))


def test_the_cli_reports_bad_input_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown scenario name is a usage error, exit 2, with a hint."""
    from sim.cli import main

    assert main(["scenarios", "run", "no_such_story"]) == 2
    assert "scenarios list" in capsys.readouterr().err


def test_a_fault_at_an_unknown_site_is_refused() -> None:
    """fail_writes naming a site no effect has is a clear error, not a fault that never fires."""
    from sim.harness import Story

    story = Story(store_kind="memory", workdir=Path("."))
    with pytest.raises(BadInput, match="where nothing is written"):
        story.faults(fail_writes={"session": 1})


def test_a_write_failure_at_tool_execution_is_refused() -> None:
    """'tools' is where a tool runs, not a write: a plan to fail a write there is refused."""
    from sim.harness import Story

    with pytest.raises(BadInput, match="tools where nothing is written"):
        Story(store_kind="memory", workdir=Path(".")).faults(fail_writes={"tools": 1})
