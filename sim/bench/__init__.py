"""Benchmarks of the reference engine (``hermes-ref bench``); see ``sim.bench.runner``."""

from __future__ import annotations

from sim.bench.runner import FULL, QUICK, SIZES_ENV, TARGETS, TINY, main, measure

__all__ = ["FULL", "QUICK", "SIZES_ENV", "TARGETS", "TINY", "main", "measure"]
