"""The many-sessions bench row and the 4-commit what-if, at the smallest sizes; no timing asserted."""

from __future__ import annotations

import statistics
from pathlib import Path

from sim import bench
from sim.bench import sessions
from sim.bench.ratios import TARGETS


async def test_the_row_runs_every_level_in_every_rep_and_judges_16_over_1(tmp_path: Path) -> None:
    """Each rep runs 1, 4 and 16 sessions twice; 16 over 1 is per rep, of that rep's rates."""
    row = await sessions.sessions_throughput(tmp_path, bench.TINY)
    assert [c.sessions for c in row.chunks] == list(sessions.ORDER) * bench.TINY.reps
    assert len(row.over_1) == bench.TINY.reps
    assert row.over_1 == [r16 / r1 for r16, r1 in zip(row.rates[16], row.rates[1], strict=True)]
    assert all(c.turns >= c.sessions for c in row.chunks)  # every lane ends at least one turn
    report = sessions.report_rows(row, {"median": 1e5, "min": 1e5, "max": 1e5})
    figure = report["durable_sessions_16_over_1"]
    assert figure["median"] == statistics.median(row.over_1) and figure["reps"] == row.over_1
    assert (TARGETS["durable_sessions_16_over_1"].op,
            TARGETS["durable_sessions_16_over_1"].bound) == (">=", 5.0)
    # the bound CPU alone allows: 1-session wall per turn over 16-session CPU per turn, per rep
    bound = [1000 / r1 / cpu16 for r1, cpu16 in zip(row.rates[1], row.cpu_ms_per_turn[16], strict=True)]
    assert report["durable_sessions_16_over_1_cpu_bound"]["reps"] == bound
    assert all(c.cpu_s > 0 for c in row.chunks)
    # the disk it ran on, timed beside each rep; the probe leaves no file behind
    assert len(row.fsync_us) == bench.TINY.reps and all(us > 0 for us in row.fsync_us)
    assert report["durable_sessions_fsync_us"]["reps"] == row.fsync_us
    assert not list(tmp_path.glob("*.fsync-probe"))


def test_the_fsync_probe_times_each_write_and_removes_its_file(tmp_path: Path) -> None:
    """One sample per timed page write, each positive; the probe file is gone after."""
    samples = sessions.fsync_samples_us(tmp_path / "probe", count=5)
    assert len(samples) == 5 and all(us > 0 for us in samples)
    assert not (tmp_path / "probe").exists()


async def test_one_session_makes_four_commits_per_turn_and_sixteen_share_them(
        tmp_path: Path) -> None:
    """Alone, a tool-round turn commits each of its 4 boundaries (the grant with the user
    row, the call row, the results, the final row with the release); 16 in flight share
    commits."""
    row = await sessions.sessions_throughput(tmp_path, bench.TINY)
    assert set(row.commits_per_turn[1]) == {4.0}
    assert max(row.commits_per_turn[16]) < 4.0
    assert min(row.writes_per_commit[16]) > 1.0
