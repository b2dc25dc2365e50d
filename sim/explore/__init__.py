"""Seeded exploration: worlds drawn from a seed, run with faults, then calm; replay and shrink.

``plan`` draws a world from a seed (``generate``) and describes it as data; ``run`` runs
one plan through the scenario harness and judges it (safety, liveness, engine crash) with
every checker; ``sweep`` runs many seeds across workers and shards and reports which
faults fired; ``shrink`` reduces a failing plan and ``render`` writes it as a scenario.
``hermes-ref explore`` is the command line over all of them (docs/explore.md).
"""
