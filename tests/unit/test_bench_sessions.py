"""The many-sessions bench row and the 4-commit what-if, at the smallest sizes; no timing asserted."""

from __future__ import annotations

import statistics
from pathlib import Path

from sim import bench
from sim.bench import boundaries, sessions
from sim.bench.ratios import TARGETS
from sim.bench.rig import AsyncRig, check_turn


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


async def test_one_session_makes_five_commits_per_turn_and_sixteen_share_them(
        tmp_path: Path) -> None:
    """Alone, a turn commits each of its 5 boundaries (the grant with the user row); 16 in
    flight share commits."""
    row = await sessions.sessions_throughput(tmp_path, bench.TINY)
    assert set(row.commits_per_turn[1]) == {5.0}
    assert max(row.commits_per_turn[16]) < 5.0
    assert min(row.writes_per_commit[16]) > 1.0


async def test_the_four_commit_store_leaves_the_same_transcript_in_four_commits(
        tmp_path: Path) -> None:
    """The what-if store commits the final row and the release together: 4, same rows."""
    five = await AsyncRig.open(tmp_path / "five.db")
    four = AsyncRig(await boundaries.FourCommitStore.open(tmp_path / "four.db"))
    try:
        for rig in (five, four):
            check_turn(await rig.turn("warm"))
        commits = {}
        for name, rig in (("five", five), ("four", four)):
            before = rig.store.commits
            check_turn(await rig.turn("s-1"))
            commits[name] = rig.store.commits - before
        rows = [[(m.role, m.content, m.tool_call_id) for m in (await rig.store.snapshot())
                 .transcript("s-1")] for rig in (five, four)]
    finally:
        await five.close()
        await four.close()
    assert commits == {"five": 5, "four": 4}
    assert rows[0] == rows[1] and len(rows[0]) == 4
