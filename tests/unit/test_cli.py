"""The command line: listing, narrated runs, the coverage matrix and sabotage verification."""

from __future__ import annotations

import io
import json

from sim.cli import main
from sim.sabotage import SABOTAGES


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_list_shows_every_scenario_with_ids() -> None:
    """'scenarios list' names each story with its stage and invariant ids."""
    code, text = run("scenarios", "list")
    assert code == 0
    assert "tool_call_is_durable_before_it_runs" in text and "TOOL-1" in text


def test_run_narrates_and_counts() -> None:
    """'scenarios run NAME' prints a timeline with writes and a closing count line."""
    code, text = run("scenarios", "run", "crash_after_tool_ran", "--store", "both")
    assert code == 0
    assert "CRASH    after:tools" in text and "write    recovery" in text
    assert text.rstrip().endswith("2 passed, 0 failed")


def test_run_exits_1_when_an_invariant_breaks() -> None:
    """Under a sabotage the narrated run reports the violation and exits 1."""
    with SABOTAGES["execute_before_persist"].applied():
        code, text = run("scenarios", "run", "tool_call_is_durable_before_it_runs", "--store", "memory")
    assert code == 1
    assert "violation: TOOL-1 [persist_before_execute]" in text
    summary = text.split("failing scenarios:\n", 1)[1]
    first = summary.splitlines()[0]  # the ids it broke, sorted (the sabotage's round skips
    assert first.startswith("  tool_call_is_durable_before_it_runs [memory]: ")  # progress too)
    assert "TOOL-1" in first.split(": ", 1)[1].split(", ")


def test_run_points_to_its_legend_and_help_holds_it() -> None:
    """A narrated run starts with where the legend is; '--help' prints that legend."""
    import contextlib

    import pytest

    code, text = run("scenarios", "run", "plain_question_gets_plain_answer", "--store", "memory")
    assert code == 0 and text.startswith("(timeline legend: hermes-ref scenarios run --help)")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["scenarios", "run", "--help"])
    assert "CRASH    the process dies here" in out.getvalue()


def test_verbose_shows_whole_texts_and_the_final_transcript() -> None:
    """'--verbose' narrates texts uncut and prints every session's final rows."""
    code, text = run("scenarios", "run", "crash_after_tool_ran", "--store", "memory", "--verbose")
    assert code == 0
    assert "final transcript:" in text and "   session s-1" in text
    assert "…" not in text.split("final transcript:")[0]


def test_invariants_json_has_the_promised_fields() -> None:
    """'invariants --json' lists every catalog id with scenarios, checker, sabotage, status."""
    code, text = run("invariants", "--json", "--store", "memory")
    rows = json.loads(text)
    assert code == 0 and len(rows) >= 70
    by_id = {r["id"]: r for r in rows}
    for row in rows:
        assert {"id", "scenarios", "checker", "sabotage", "status"} <= set(row)
        assert row["status"] in {"covered", "partial", "missing"}
    assert by_id["TOOL-1"]["status"] == "covered"
    assert "tool_call_is_durable_before_it_runs" in by_id["TOOL-1"]["scenarios"]
    catch = by_id["TOOL-1"]["caught_by"][0]
    assert catch["invariant"] == "TOOL-1" and catch["store"] in {"memory", "sqlite"}
    assert catch["checker"] == "persist_before_execute" and catch["violation"]
    assert {c["store"] for c in by_id["TOOL-1"]["caught_by"]} <= {"memory", "sqlite"}


def test_invariants_prints_each_rule_text() -> None:
    """The plain matrix prints every rule's own words under its status line."""
    from hermes_ref.catalog import BY_ID

    code, text = run("invariants", "--store", "memory")
    assert code == 0 and BY_ID["TOOL-1"].text in text


def test_verify_passes_and_counts_every_sabotage() -> None:
    """'invariants verify' exits 0 with one line per sabotage and a count line."""
    code, text = run("invariants", "verify", "--store", "memory")
    assert code == 0
    assert text.rstrip().endswith(f"{len(SABOTAGES)} passed, 0 failed")


def test_verify_fails_on_a_vacuous_sabotage() -> None:
    """A sabotage that breaks nothing is reported NOT CAUGHT and verify exits 1."""
    import pytest

    from sim.sabotage import Sabotage

    harmless = Sabotage("harmless", ("TOOL-1",), "changes nothing", lambda: [])
    mp = pytest.MonkeyPatch()
    mp.setitem(SABOTAGES, "harmless", harmless)
    try:
        code, text = run("invariants", "verify", "--store", "memory")
    finally:
        mp.undo()
    assert code == 1
    assert "NOT CAUGHT  harmless" in text


def test_fake_provider_serves_a_script_file_then_stops(tmp_path: object) -> None:
    """'fake-provider serve' answers a real HTTP client from a script file, then exits 0."""
    import threading
    from pathlib import Path

    import httpx

    script = Path(str(tmp_path)) / "script.json"
    script.write_text('[{"text": "hello from the script"}]')
    out = io.StringIO()
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(
        main(["fake-provider", "serve", "--script", str(script)], out=out)))
    worker.start()
    for _ in range(100):
        if "at http" in out.getvalue():
            break
        threading.Event().wait(0.05)
    url = out.getvalue().split(" at ", 1)[1].split()[0]
    reply = httpx.post(f"{url}/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    worker.join(timeout=10)
    assert reply.json()["choices"][0]["message"]["content"] == "hello from the script"
    assert result == [0]
