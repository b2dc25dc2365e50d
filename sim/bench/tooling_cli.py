"""``python -m sim.bench.tooling_cli``: the testing tools' rows alone (``nox -s audit_bench``).

Theory of operation
-------------------
It measures the calibration (a quick run of ``sim.bench.calibration``), then the rows of
``sim.bench.tooling`` beside it, at the size asked for (1,000,000 messages by default), and
prints them as lines or JSON. It is a module of its own because ``sim.bench`` imports
``sim.bench.tooling`` for ``hermes-ref bench``, and ``python -m`` would import it twice.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sim.bench import calibration
from sim.bench.runner import QUICK
from sim.bench.tooling import audit_rows, lines, serve_rows, stat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.bench.tooling_cli",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    tape = calibration.record()
    rates = calibration.calibration_throughput(tape, QUICK).rates
    report: dict[str, Any] = {"calibration_turns_per_s": stat(list(rates))}
    report.update(audit_rows(args.reps, args.messages, report["calibration_turns_per_s"],
                             sys.stderr))
    report.update(serve_rows(report["calibration_turns_per_s"]))
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json
                     else "\n".join(lines(report)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
