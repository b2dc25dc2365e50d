"""The testing tools' bench rows have their shape and ratios; no timing is asserted."""

from __future__ import annotations

from sim.bench.tooling import audit_rows, build_database, lines, serve_rows

CALIBRATION = {"median": 1000.0, "min": 900.0, "max": 1100.0}


def test_audit_rows_carry_the_size_and_both_ratios() -> None:
    """The audit row says how many messages it read and gives both ratios."""
    report = audit_rows(1, 2_000, CALIBRATION)
    assert report["audit_messages"]["median"] == 2_000
    assert report["audit_share_of_scan"]["median"] > 0
    assert report["audit_messages_per_calibration_turn"]["median"] == (
        report["audit_messages_per_s"]["median"] / 1000.0)


def test_the_generated_database_has_one_open_turn_per_thousand_sessions(tmp_path: object) -> None:
    """The bench database is clean but for its open turns, so the judges do real work."""
    from pathlib import Path

    from sim.audit.cli import audit

    path = Path(str(tmp_path)) / "bench.db"
    build_database(path, 20_000)
    result = audit(path)
    assert (result.messages, len(result.violations), len(result.open_turns)) == (20_000, 0, 2)


def test_serve_rows_give_percentiles_and_ratios() -> None:
    """The latency rows give p50, p99, their ratio, and p50 in calibration turns."""
    report = serve_rows(CALIBRATION, per_client=2, diagnostic=False)
    assert report["serve_latency_ms_p99"]["median"] >= report["serve_latency_ms_p50"]["median"]
    assert report["serve_p99_over_p50"]["median"] >= 1.0
    assert "serve_p50_in_calibration_turns" in report
    assert any("serve_latency_ms_p50" in line for line in lines(report))
