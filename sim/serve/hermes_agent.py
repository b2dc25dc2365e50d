"""Run the real Hermes Agent (from PyPI, in its own venv) against the served simulator.

Theory of operation
-------------------
``run(hermes, script, folder, prompt)`` serves ``script`` in process on 127.0.0.1, writes
a ``HERMES_HOME`` whose ``config.yaml`` points Hermes at it (``provider: custom``, a
``context_length`` so Hermes does not probe for one, the tirith scanner off so nothing is
downloaded, and a fresh update-check cache so no version check leaves the machine),
runs ``hermes -z PROMPT -t terminal`` in an empty working folder with ``HOME`` set to
the folder, and returns what happened: Hermes' exit code and output, its usage report,
the journal of every request it sent, the simulator's report, and the path of the
``state.db`` it wrote, ready for ``hermes-ref audit``.

Hermes is never imported: its top-level module names (``tools``, ``agent``, ``cli``) are
generic, so it runs from its own venv. ``nox -s hermes_agent`` installs 0.19.0 there and
runs ``tests/unit/test_serve_hermes_agent.py`` with ``HERMES_AGENT_BIN`` set; without it
those tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.serve import script as script_file
from sim.serve.cursor import Report
from sim.serve.journal import Journal, open_journal
from sim.serve.server import Simulator, start

HERMES_BIN_ENV = "HERMES_AGENT_BIN"
PROMPT = "Run echo tool-ok in the terminal and report the output."
_TOOL = {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo tool-ok"}}]}
_DONE = {"text": "tool-ok"}
CASES: dict[str, list[dict[str, Any]]] = {
    # name: the main route's steps; every case also answers tool-less side calls
    "happy": [_TOOL, _DONE],
    "rate_limited": [{"error": "rate_limited", "retry_after_s": 1}, _TOOL, _DONE],
    "stream_cut": [{"text": "a partial answer, cut", "cut_after": 3}, _TOOL, _DONE],
    "context_overflow": [{"error": "context_overflow"}],
    "rejected": [{"error": "rejected", "message": "bad request"}],
    "empty_replies": [{"content": None}] * 4,
}


CHAT_CASES = {"chat_rejected": "rejected"}  # run with ``hermes chat -q``: no session end


def case_script(name: str) -> dict[str, Any]:
    """The whole script of a named case: its steps, and a route for side calls."""
    return {"model": "fake-model", "steps": CASES[name], "routes": [
        {"name": "side", "match": {"tools": False},
         "steps": [{"text": "A short summary.", "repeat": "always"}]}]}


@dataclass
class HermesRun:
    exit_code: int
    stdout: str
    stderr: str
    usage: dict[str, Any]
    records: list[dict[str, Any]]
    report: Report
    state_db: Path


def _home(folder: Path, url: str, model: str) -> Path:
    home = folder / "home"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text(
        "model:\n  provider: custom\n"
        f"  base_url: {url}\n  default: {model}\n  api_key: sk-fake-local\n"
        "  context_length: 131072\nsecurity:\n  tirith_enabled: false\n")
    (home / ".update_check").write_text(json.dumps(
        {"ts": int(time.time()), "behind": 0, "rev": None, "ver": "0.19.0"}))
    return home


def run(hermes: str | Path, script: object, folder: Path, prompt: str,
        timeout_s: float = 180.0, model: str = "fake-model", chat: bool = False) -> HermesRun:
    """One ``hermes -z`` run against ``script`` (a path or a decoded script), with
    ``model`` as Hermes' model name (some names make it pass reasoning back). ``chat``
    runs ``hermes chat -q`` instead, which leaves its session un-ended."""
    parsed = script_file.load(script) if isinstance(script, str | Path) else (
        script_file.parse(script))
    journal = Journal(open_journal(folder / "journal.jsonl"))
    simulator = Simulator(parsed, journal)
    server = start(simulator)
    try:
        home = _home(folder, server.url, model)
        work = folder / "work"
        work.mkdir()
        env = {**os.environ, "HERMES_HOME": str(home), "HOME": str(folder),
               "HERMES_DISABLE_LAZY_INSTALLS": "1"}
        usage_file = folder / "usage.json"
        argv = ([str(hermes), "chat", "-q", prompt, "-Q", "-t", "terminal", "--yolo"] if chat
                else [str(hermes), "-z", prompt, "-t", "terminal", "--usage-file", str(usage_file)])
        done = subprocess.run(
            argv,
            cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    finally:
        server.stop()
        journal.close()
    usage = json.loads(usage_file.read_text()) if usage_file.exists() else {}
    return HermesRun(done.returncode, done.stdout, done.stderr, usage,
                     list(simulator.journal.records), simulator.cursor.report(),
                     home / "state.db")


SYNTHETIC_PLACEHOLDER = "[System: (a synthetic message of Hermes Agent; its text removed)]"


def scrubbed_copy(state_db: Path, dest: Path) -> None:
    """A compact copy of a run's ``state.db`` without Hermes' own prompt text.

    The system prompt and the synthetic ``[System: …]`` messages (Hermes' wording) are
    replaced by placeholders, in the copy only; everything else the auditor judges is kept
    as Hermes wrote it.
    """
    import sqlite3

    source = sqlite3.connect(state_db.resolve().as_uri() + "?mode=ro", uri=True)
    source.execute("VACUUM INTO ?", (str(dest),))
    source.close()
    copy = sqlite3.connect(dest, isolation_level=None)
    copy.execute("UPDATE sessions SET system_prompt = '(system prompt removed)', "
                 "model_config = NULL, cwd = NULL")
    copy.execute("UPDATE messages SET content = ? WHERE role = 'user' AND content LIKE "
                 "'[System:%'", (SYNTHETIC_PLACEHOLDER,))
    copy.execute("PRAGMA journal_mode=delete")
    copy.execute("VACUUM")
    copy.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m sim.serve.hermes_agent HERMES_BIN OUT_DIR``: record every case's state.db
    (the ``-z`` cases, then the ``chat -q`` ones)."""
    import sys
    import tempfile

    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        sys.stderr.write("usage: python -m sim.serve.hermes_agent HERMES_BIN OUT_DIR\n")
        return 2
    hermes, out = args
    if not Path(hermes).is_file() or not os.access(hermes, os.X_OK):
        sys.stderr.write(f"error: {hermes}: not an executable file (a Hermes Agent 'hermes')\n")
        return 2
    if not Path(out).is_dir():
        sys.stderr.write(f"error: {out}: no such folder\n")
        return 2
    every = [(name, name, False) for name in CASES]
    every += [(name, case, True) for name, case in CHAT_CASES.items()]
    for name, case, chat in every:
        with tempfile.TemporaryDirectory(prefix=f"hermes-{name}-") as tmp:
            result = run(hermes, case_script(case), Path(tmp), PROMPT, chat=chat)
            scrubbed_copy(result.state_db, Path(out) / f"{name}.db")
            sys.stdout.write(f"{name}: exit {result.exit_code}, {len(result.records)} "
                             f"request(s), {result.stdout.strip()[:60]!r}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
