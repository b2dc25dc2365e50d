"""The real Hermes Agent 0.19.0 against the served simulator (nox -s hermes_agent).

Skipped unless HERMES_AGENT_BIN names a ``hermes`` executable (its own venv: nox makes it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.audit.cli import audit
from sim.serve.hermes_agent import CASES, HERMES_BIN_ENV, PROMPT, case_script, run

HERMES = os.environ.get(HERMES_BIN_ENV, "")
pytestmark = pytest.mark.skipif(
    not HERMES or not Path(HERMES).exists(),
    reason=f"set {HERMES_BIN_ENV} to a Hermes Agent 0.19.0 'hermes' (run: nox -s hermes_agent)")

ANSWERS = {"happy": "tool-ok", "rate_limited": "tool-ok", "stream_cut": "tool-ok"}
FINDINGS = {"stream_cut": ["SCAF-1"], "context_overflow": ["FIN-5"], "rejected": ["FIN-5"]}


@pytest.mark.parametrize("name", list(CASES))
def test_hermes_meets_each_fault_and_its_database_audits(tmp_path: Path, name: str) -> None:
    """Hermes answers (or fails) as it does against a real provider; its state.db audits."""
    result = run(HERMES, case_script(name), tmp_path, PROMPT)
    assert result.exit_code == 0, result.stderr
    posts = [r for r in result.records if r["method"] == "POST"]
    assert all(r["status"] != 400 or r.get("step") for r in posts), "a valid request refused"
    if name in ANSWERS:
        assert result.stdout.strip() == ANSWERS[name]
        assert result.usage["completed"] is True
    if name == "rate_limited":
        assert posts[1]["gap_s"] >= 0.9  # Retry-After: 1 was honoured
    assert [f.invariant for f in audit(result.state_db).findings] == FINDINGS.get(name, [])


def test_hermes_passes_reasoning_back_and_it_is_accepted(tmp_path: Path) -> None:
    """For a reasoning model's name Hermes sends reasoning_content back: 200, journaled."""
    script = {"model": "deepseek-reasoner", "steps": [
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo tool-ok"}}],
         "reasoning": "I should run it."},
        {"text": "tool-ok", "reasoning": "Done."}]}
    result = run(HERMES, script, tmp_path, PROMPT, model="deepseek-reasoner")
    assert result.stdout.strip() == "tool-ok"
    second = [r for r in result.records if r["method"] == "POST"][1]
    assert second["status"] == 200
    assert any(u.endswith(".reasoning_content") for u in second["unknown"])


def test_a_chat_run_that_fails_leaves_an_open_turn(tmp_path: Path) -> None:
    """'hermes chat -q' does not end its session: a failed turn is an open turn, not a violation."""
    result = run(HERMES, case_script("rejected"), tmp_path, PROMPT, chat=True)
    checked = audit(result.state_db)
    assert [(f.kind, f.invariant) for f in checked.findings] == [("open", "FIN-5")]
    assert not checked.failed() and checked.failed(strict=True)
