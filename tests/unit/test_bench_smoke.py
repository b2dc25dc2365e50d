"""``hermes-ref bench`` runs end to end at the smallest sizes; no timing is asserted."""

from __future__ import annotations

import json
from io import StringIO

import pytest

from sim import bench
from sim.bench import probes as bench_probes
from sim.bench import render as bench_render

STAT_KEYS = (
    "memory_turns_per_s",
    "memory_gc_share",
    "memory_turns_per_s_gc_paused",
    "sim_sqlite_turns_per_s",
    "sim_sqlite_commits_per_turn",
    "sim_sqlite_commit_share_of_ceiling",
    "durable_turns_per_s",
    "durable_commits_per_turn",
    "durable_store_hops_per_turn",
    "durable_commit_share_of_ceiling",
    "memory_growth_late_over_early",
    "memory_turn_ms_early",
    "memory_turn_ms_late",
    "durable_growth_late_over_early",
    "http_encode_growth_late_over_early",
    "bytes_per_turn_early",
    "bytes_per_turn_late",
    "bytes_late_over_early",
    "sqlite_commit_ceiling_per_s",
    "aiosqlite_commit_ceiling_per_s",
)


@pytest.fixture(scope="module")
def report() -> dict[str, object]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(bench.SIZES_ENV, "tiny")
        out = StringIO()
        assert bench.main(quick=True, as_json=True, out=out) == 0
    parsed: dict[str, object] = json.loads(out.getvalue())
    return parsed


@pytest.mark.parametrize("key", STAT_KEYS)
def test_figure_has_positive_median_min_max(report: dict[str, object], key: str) -> None:
    stat = report[key]
    assert isinstance(stat, dict)
    assert set(stat) >= {"median", "min", "max"}
    assert stat["min"] <= stat["median"] <= stat["max"]
    share_or_ratio = key.endswith("_share")
    assert stat["min"] >= 0 if share_or_ratio else stat["min"] > 0


def test_fsyncs_are_counted_or_explained(report: dict[str, object]) -> None:
    stat = report["durable_fsyncs_per_turn"]
    notes = report["notes"]
    assert isinstance(notes, dict)
    if stat is None:
        assert notes["durable_fsyncs_per_turn"].startswith("not measured")
    else:
        assert isinstance(stat, dict)
        assert stat["median"] > 0


def test_scripted_turn_commits_every_boundary(report: dict[str, object]) -> None:
    commits = report["durable_commits_per_turn"]
    assert isinstance(commits, dict)
    assert commits["median"] >= 6  # session, lease, user, calls, results, final, release


def test_targets_machine_and_profile(report: dict[str, object]) -> None:
    targets = report["targets"]
    assert isinstance(targets, dict)
    assert set(targets) == set(bench.TARGETS)
    for verdict in targets.values():
        assert isinstance(verdict["pass"], bool)
    machine = report["machine"]
    assert isinstance(machine, dict)
    assert {"cpu_count", "python", "sqlite"} <= set(machine)
    profile = report["profile"]
    assert isinstance(profile, dict)
    assert profile["cumulative"] and profile["self"]


def test_table_renders_every_target(report: dict[str, object]) -> None:
    text = bench_render.render(report)
    for name in bench.TARGETS:
        assert name in text
    assert "PASS" in text or "MISS" in text


def test_fsyncs_without_strace_are_null_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_probes.shutil, "which", lambda name: None)
    per_turn, per_commit, note = bench_probes.count_fsyncs(bench.TINY)
    assert per_turn is None and per_commit is None
    assert note == "not measured: strace is not on PATH"


def test_strace_summary_is_parsed() -> None:
    summary = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 90.00    0.008695          79       109           fdatasync
 10.00    0.000100          10        10         1 fsync
------ ----------- ----------- --------- --------- ----------------
100.00    0.008795          73       119         1 total
"""
    assert bench_probes.parse_strace_counts(summary) == 119
