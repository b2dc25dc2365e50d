"""``python -m sim.bench``: the benchmarks, and the child side of the fsync probe."""

from __future__ import annotations

from sim.bench.runner import cli

raise SystemExit(cli())
