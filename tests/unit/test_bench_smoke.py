"""``hermes-ref bench`` runs end to end at the smallest sizes; no timing is asserted.

The figures themselves are only checked for shape; what is asserted for real is the
structure of the report (every target on a ratio, each ratio with its target), that the
commit shares are paired (one share per timed chunk, over the ceiling measured beside it,
and the target judges their median) and that the calibration replays the very effect
sequence of a real turn of the memory rig.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest

from hermes_ref.effects import Now
from hermes_ref.errors import OperatingError
from sim import bench
from sim.bench import calibration
from sim.bench import probes as bench_probes
from sim.bench import render as bench_render
from sim.bench.rig import SyncRig
from sim.bench.rows import Throughput
from sim.store import MemoryStore

STAT_KEYS = (
    "calibration_turns_per_s",
    "calibration_effects_per_turn",
    "memory_turns_per_s",
    "memory_share_of_calibration",
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
def report() -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(bench.SIZES_ENV, "tiny")
        out = StringIO()
        assert bench.main(quick=True, as_json=True, out=out) == 0
    parsed: dict[str, Any] = json.loads(out.getvalue())
    return parsed


@pytest.mark.parametrize("key", STAT_KEYS)
def test_figure_has_positive_median_min_max(report: dict[str, object], key: str) -> None:
    """Every figure is a median within [min, max], positive unless it is a share of time."""
    stat = report[key]
    assert isinstance(stat, dict)
    assert set(stat) >= {"median", "min", "max"}
    assert stat["min"] <= stat["median"] <= stat["max"]
    share_or_ratio = key.endswith("_share")
    assert stat["min"] >= 0 if share_or_ratio else stat["min"] > 0


def test_fsyncs_are_counted_or_explained(report: dict[str, object]) -> None:
    """fsyncs per turn are a counted figure, or null with the reason in the notes."""
    stat = report["durable_fsyncs_per_turn"]
    notes = report["notes"]
    assert isinstance(notes, dict)
    if stat is None:
        assert notes["durable_fsyncs_per_turn"].startswith("not measured")
    else:
        assert isinstance(stat, dict)
        assert stat["median"] > 0


def test_scripted_turn_commits_every_boundary(report: dict[str, object]) -> None:
    """The durable scripted turn commits once per durable boundary, the grant with the user row."""
    commits = report["durable_commits_per_turn"]
    assert isinstance(commits, dict)
    assert commits["median"] == 4  # session+lease+user, calls, results, final+release


def test_every_target_is_a_ratio_with_value_target_and_verdict(report: dict[str, object]) -> None:
    """The ratios section holds every target, each with its value, bound and a true verdict."""
    ratios = report["ratios"]
    assert isinstance(ratios, dict)
    assert set(ratios) == set(bench.TARGETS)
    assert {"memory_share_of_calibration", "durable_commit_share_of_ceiling",
            "memory_growth_late_over_early", "durable_growth_late_over_early"} <= set(ratios)
    for name, ratio in ratios.items():
        assert not name.endswith("_turns_per_s")  # never a target on an absolute rate
        assert set(ratio) >= {"value", "min", "max", "target", "pass", "what"}
        op, bound = ratio["target"]["op"], ratio["target"]["bound"]
        assert op in (">=", "<=")
        assert ratio["value"] == report[name]["median"]  # type: ignore[index]
        assert ratio["pass"] is (ratio["value"] >= bound if op == ">=" else ratio["value"] <= bound)


PAIRED = {"durable_commit_share_of_ceiling": ("durable", "aiosqlite_commit_ceiling_per_s"),
          "sim_sqlite_commit_share_of_ceiling": ("sim_sqlite", "sqlite_commit_ceiling_per_s")}


@pytest.mark.parametrize("name", sorted(PAIRED))
def test_commit_share_is_the_median_of_its_pairs(report: dict[str, Any], name: str) -> None:
    """A commit share is the median [min-max] of one share per chunk, each listed in the report."""
    row, _ = PAIRED[name]
    figure, details = report[name], report["pairs"][row]
    assert len(figure["pairs"]) == bench.TINY.reps * bench.TINY.pair_chunks
    assert figure["pairs"] == [pair["share"] for pair in details]
    assert figure["median"] == statistics.median(figure["pairs"])
    assert (figure["min"], figure["max"]) == (min(figure["pairs"]), max(figure["pairs"]))


@pytest.mark.parametrize("name", sorted(PAIRED))
def test_each_pair_divides_by_the_ceiling_beside_it(report: dict[str, Any], name: str) -> None:
    """A pair's share divides by the slices either side; the ceiling is each rep's mean slice."""
    row, ceiling_name = PAIRED[name]
    details = report["pairs"][row]
    for pair in details:
        beside = (pair["ceiling_before"] + pair["ceiling_after"]) / 2
        assert pair["share"] == pytest.approx(pair["commits_per_s"] / beside)
    chunks = bench.TINY.pair_chunks
    per_rep = []
    for rep in range(bench.TINY.reps):
        pairs = details[rep * chunks:(rep + 1) * chunks]
        slices = [pair["ceiling_before"] for pair in pairs] + [pairs[-1]["ceiling_after"]]
        per_rep.append(statistics.mean(slices))
    ceiling = report[ceiling_name]
    assert (ceiling["min"], ceiling["max"]) == pytest.approx((min(per_rep), max(per_rep)))


def test_target_judges_the_paired_durable_share(report: dict[str, Any]) -> None:
    """The durable target's value is the median of the per-pair shares, which it carries."""
    ratio = report["ratios"]["durable_commit_share_of_ceiling"]
    pairs = report["durable_commit_share_of_ceiling"]["pairs"]
    assert ratio["pairs"] == pairs
    assert ratio["value"] == statistics.median(pairs)
    assert ratio["pass"] is (ratio["value"] >= 0.55)


def test_pairs_cut_a_rep_into_chunks_between_ceiling_slices() -> None:
    """Chunk k pairs with slices k and k + 1; the rep's rate still counts every chunk."""
    out = Throughput()
    out.add_paired([(10, 1.0, 60), (20, 1.0, 120)], [100.0, 200.0, 300.0], gc_s=0.0)
    assert [p.share for p in out.pairs] == [60 / 150, 120 / 250]
    assert out.ceiling_rates == [200.0]
    assert out.rates == [15.0] and out.commits_per_turn == [6.0]
    unpaired = Throughput()
    unpaired.add_paired([(10, 1.0, 0)], [], gc_s=0.0)
    assert unpaired.pairs == [] and unpaired.rates == [10.0]


def test_ratio_targets_are_the_agreed_bounds() -> None:
    """Durable share >= 0.55, growth <= 1.3x, memory share of the calibration >= 0.25."""
    bounds = {name: (t.op, t.bound) for name, t in bench.TARGETS.items()}
    assert bounds["durable_commit_share_of_ceiling"] == (">=", 0.55)
    assert bounds["memory_growth_late_over_early"] == ("<=", 1.3)
    assert bounds["durable_growth_late_over_early"] == ("<=", 1.3)
    assert bounds["memory_share_of_calibration"] == (">=", 0.25)


def test_report_has_machine_profile_and_no_peer_figures(report: dict[str, object]) -> None:
    """The report names the machine and the profile's top costs, and quotes no other project."""
    assert "peers" not in report
    machine = report["machine"]
    assert isinstance(machine, dict)
    assert {"cpu_count", "python", "sqlite", "platform"} <= set(machine)
    profile = report["profile"]
    assert isinstance(profile, dict)
    assert profile["cumulative"] and profile["self"] and profile["by_file"]
    assert abs(sum(layer["share"] for layer in profile["by_layer"]) - 1.0) < 1e-6
    bound = report["memory_bound"]
    assert isinstance(bound, dict)
    assert bound["us_beyond_calibration"] == pytest.approx(
        bound["memory_us_per_turn"] - bound["calibration_us_per_turn"])


def test_table_renders_every_ratio_with_its_target(report: dict[str, object]) -> None:
    """The text table shows every targeted ratio with its target and verdict, and no peers."""
    text = bench_render.render(report)
    for name, target in bench.TARGETS.items():
        assert name in text
        assert f"{target.op} {target.bound:g}" in text
    assert "PASS" in text or "MISS" in text
    assert "peer" not in text
    assert "pairs of durable_commit_share_of_ceiling, in time order" in text


def _real_turn_kinds() -> tuple[str, ...]:
    """The effect kinds of one real turn of the memory rig, seen by the driver's dispatch.

    Wrapping the handlers of ``SimDriver`` (its private table) observes the turn without
    the calibration's recorder, so the comparison below is not circular. The turn's own
    effects are the ones performed for the turn actor; its lease refresher is an actor of
    its own, beside it (its effects are counted, not listed).
    """
    rig = SyncRig(MemoryStore())
    rig.turn("warm")
    seen: list[str] = []
    handled = [0]

    def seeing(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def handle(effect: Any) -> Any:
            handled[0] += 1
            current = rig.driver.current
            if current is not None and current.parent is None:
                seen.append(type(effect).__name__)
            return handler(effect)
        return handle

    handlers = rig.driver._handlers
    for kind, handler in list(handlers.items()):
        handlers[kind] = seeing(handler)
    before = rig.driver.effects_performed
    rig.turn("observed")
    assert rig.driver.effects_performed - before == handled[0]
    return tuple(seen)


def test_recorded_calibration_has_the_effects_of_a_real_turn(report: dict[str, object]) -> None:
    """The recorded tape has the same count and kinds of effects, in order, as a real turn."""
    real = _real_turn_kinds()
    tape = calibration.record()
    assert tape.kinds() == real
    assert len(tape.steps) == len(real) > 0
    assert report["calibration"] == {"effects": list(real)}
    assert report["calibration_effects_per_turn"] == {
        "median": len(real), "min": len(real), "max": len(real)}


def test_replay_awaits_the_recorded_effects_and_returns_the_result() -> None:
    """The bare replay yields exactly the recorded effect objects and returns the turn's result."""
    tape = calibration.record()
    assert calibration.run_tape(calibration.replay(tape), tape.steps) is tape.result
    with pytest.raises(calibration.ReplayMismatch):
        calibration.run_tape(calibration.replay(tape), tape.steps[:-1])
    with pytest.raises(calibration.ReplayMismatch):
        calibration.run_tape(calibration.replay(tape), tape.steps[1:])


def test_replay_throws_a_recorded_error_like_the_driver() -> None:
    """A step recorded with an error is thrown into the coroutine, again on every replay."""
    now = Now()

    async def turn() -> str:
        try:
            await now
        except OperatingError as failure:
            return f"caught {failure}"
        return "not thrown"

    error = OperatingError("disk")
    steps = (calibration.Step(now, None, error),)
    depths = []
    for _ in range(3):
        assert calibration.run_tape(turn(), steps) == "caught disk"
        depths.append(_traceback_depth(error))
    assert depths[0] == depths[1] == depths[2]  # the replayed error's traceback never grows


def _traceback_depth(error: BaseException) -> int:
    depth, tb = 0, error.__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    return depth


def test_fsyncs_without_strace_are_null_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without strace on PATH the fsync figures are null and the note says why."""
    monkeypatch.setattr("sim.bench.probes.shutil.which", lambda name: None)
    per_turn, per_commit, note = bench_probes.count_fsyncs(bench.TINY)
    assert per_turn is None and per_commit is None
    assert note == "not measured: strace is not on PATH"


def test_strace_summary_is_parsed() -> None:
    """fsync and fdatasync calls are summed from an strace -c summary table."""
    summary = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 90.00    0.008695          79       109           fdatasync
 10.00    0.000100          10        10         1 fsync
------ ----------- ----------- --------- --------- ----------------
100.00    0.008795          73       119         1 total
"""
    assert bench_probes.parse_strace_counts(summary) == 119
