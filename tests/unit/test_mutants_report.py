"""The kill-rate table is computed from mutmut's records, and the equivalents from the doc."""

from __future__ import annotations

import io
import json
from pathlib import Path

from sim import mutation_report as report

DOC = """# Mutation testing

## Equivalent mutants

| mutant | why |
|---|---|
| `hermes_ref.loop.x_run_loop__mutmut_6` | break and return both end the function |
| `hermes_ref.loop.x_run_loop__mutmut_2` | declared, but killed |

## What is not covered

`hermes_ref.loop.x_run_loop__mutmut_3` is only mentioned here.
"""


def _run(tmp_path: Path, codes: dict[str, int | None], doc: str = DOC) -> tuple[int, str]:
    meta = tmp_path / "mutants" / "hermes_ref" / "loop.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}), "utf-8")
    (tmp_path / "mutation.md").write_text(doc, "utf-8")
    out = io.StringIO()
    code = report.report(tmp_path / "mutants", tmp_path / "mutation.md", out, survivors=True)
    return code, out.getvalue()


def test_verdicts_follow_mutmut_exit_codes() -> None:
    """Exit 1 is killed, 0 survived, 33 no tests, 36 timeout, None not checked, else suspicious."""
    assert [report.verdict(c) for c in (1, 0, 33, 36, None, 99)] == [
        "killed", "survived", "no tests", "timeout", "not checked", "suspicious"]


def test_only_the_equivalents_section_declares_mutants(tmp_path: Path) -> None:
    """Names quoted under the equivalents heading count; a mention elsewhere does not."""
    (tmp_path / "m.md").write_text(DOC, "utf-8")
    assert report.declared_equivalents(tmp_path / "m.md") == [
        "hermes_ref.loop.x_run_loop__mutmut_6", "hermes_ref.loop.x_run_loop__mutmut_2"]
    assert report.declared_equivalents(tmp_path / "missing.md") == []


def test_the_table_counts_verdicts_and_leaves_equivalents_out_of_the_second_rate(
        tmp_path: Path) -> None:
    """3 killed, 1 timeout, 1 equivalent, 1 undetected of 6 judged: 66.7% and 80.0%."""
    codes = {f"hermes_ref.loop.x_run_loop__mutmut_{i}": c
             for i, c in enumerate([1, 1, 1, 36, 0, 0, None], start=1)}
    codes["hermes_ref.loop.x_run_loop__mutmut_2"] = 1
    figures = report.load(tmp_path, ())
    assert figures == []
    code, text = _run(tmp_path, codes)
    assert code == 0
    row = next(line.split() for line in text.splitlines() if line.startswith("hermes_ref.loop"))
    assert row == ["hermes_ref.loop", "7", "3", "2", "1", "0", "1", "1", "66.7%", "80.0%"]
    assert "declared equivalent but detected" in text and "mutmut_2: killed" in text
    assert text.rstrip().endswith("hermes_ref.loop.x_run_loop__mutmut_5")


def test_a_declared_name_the_run_does_not_know_is_flagged(tmp_path: Path) -> None:
    """A declaration left over from older code is reported, so the list stays true."""
    _, text = _run(tmp_path, {"hermes_ref.loop.x_run_loop__mutmut_1": 1})
    assert "not generated" in text and "x_run_loop__mutmut_6" in text


def test_markdown_output_is_a_table(tmp_path: Path) -> None:
    """--markdown prints a header, an alignment row and one row per module and total."""
    meta = tmp_path / "mutants" / "hermes_ref" / "closure.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {"hermes_ref.closure.x_f__mutmut_1": 1}}))
    out = io.StringIO()
    assert report.main(["--mutants", str(tmp_path / "mutants"), "--equivalents",
                        str(tmp_path / "none.md"), "--markdown"], out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("| module |") and lines[1].startswith("|---|")
    assert [line.split("|")[1].strip() for line in lines[2:]] == [
        "hermes_ref.closure", "decision modules", "all modules"]


def test_no_run_is_an_error(tmp_path: Path) -> None:
    """Without mutmut's records the report says so and exits 1."""
    out = io.StringIO()
    assert report.report(tmp_path / "mutants", tmp_path / "doc.md", out) == 1
    assert "nox -s mutants" in out.getvalue()
