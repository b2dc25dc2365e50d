"""Sessions: tests (default), lint, types, sweep (long property sweeps), bench, mutants,
hermes_agent (the real Hermes Agent against the served simulator), audit_bench,
explore_long (seed sweeps, the world state machine and the sabotage hunt, at length)."""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["tests", "lint", "types"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The default suite: unit, contract, property, scenario and real-crash tests."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "hermes_ref", "sim", "scenarios", "tests", "noxfile.py")


@nox.session(python=PYTHON)
def types(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session(python=PYTHON)
def sweep(session: nox.Session) -> None:
    """Long sweeps: many more generated scripts and crash points. Minutes, not seconds."""
    session.install("-e", ".[test]")
    examples = session.posargs[0] if session.posargs else "2000"
    session.env["HERMES_REF_PROPERTY_EXAMPLES"] = examples
    session.env["HERMES_REF_SWEEP_EXAMPLES"] = examples
    session.run("python", "-m", "pytest", "--run-slow", "tests/properties", "-p", "no:cacheprovider")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Throughput and scaling benchmarks; prints medians, ranges and ratios to the machine."""
    session.install("-e", ".[dev]")
    session.run("hermes-ref", "bench", *session.posargs)


@nox.session(python=PYTHON)
def mutants(session: nox.Session) -> None:
    """Mutation testing of the engine core (mutmut 3, configured in pyproject.toml), then
    the kill-rate table per module. Tens of minutes on two cores: never a default session.

    Starts from a fresh ``mutants/`` so the figures describe the tree as it is; posargs are
    mutmut's mutant globs, e.g. ``nox -s mutants -- "hermes_ref.loop*"``.
    """
    session.install("-e", ".[test]", "mutmut>=3.8,<4")
    shutil.rmtree("mutants", ignore_errors=True)
    session.env["HERMES_REF_PROPERTY_EXAMPLES"] = "10"  # the property tests, kept short
    session.run("mutmut", "run", *session.posargs)
    session.run("python", "-m", "sim.mutation_report", "--survivors")


@nox.session(python=PYTHON)
def hermes_agent(session: nox.Session) -> None:
    """The real Hermes Agent 0.19.0 (PyPI, in a venv of its own) against `sim serve`, each
    fault of sim.serve.hermes_agent.CASES, and its state.db audited. Needs the network once."""
    session.install("-e", ".[test]")
    venv = os.path.abspath(f"{session.cache_dir}/hermes-agent-0.19.0")
    hermes = f"{venv}/bin/hermes"
    if not shutil.which(hermes):
        session.run("python", "-m", "venv", venv, external=True)
        session.run(f"{venv}/bin/pip", "install", "-q", "hermes-agent==0.19.0", external=True)
    session.env["HERMES_AGENT_BIN"] = hermes
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider",
                "tests/unit/test_serve_hermes_agent.py", *session.posargs)


@nox.session(python=PYTHON)
def audit_bench(session: nox.Session) -> None:
    """The auditor's throughput on a generated 1,000,000-message database, and the served
    simulator's latency at 20 clients, each beside the calibration of the same run."""
    session.install("-e", ".")
    session.run("python", "-m", "sim.bench.tooling_cli", "--messages", "1000000", *session.posargs)


@nox.session(python=PYTHON)
def explore_long(session: nox.Session) -> None:
    """A long exploration: a 20,000-seed sweep on every core with the determinism
    self-check on its first 500 seeds, the world state machine with a large budget, and the
    hunt for every registered sabotage (1,000 seeds each). About half an hour on two cores.

    posargs: the number of seeds of the sweep (default 20000).
    """
    session.install("-e", ".[test]")
    seeds = session.posargs[0] if session.posargs else "20000"
    workers = str(os.cpu_count() or 1)
    session.run("hermes-ref", "explore", "--seeds", seeds, "--workers", workers)
    session.run("hermes-ref", "explore", "--seeds", "500", "--workers", workers,
                "--check-determinism")
    session.env["HERMES_MACHINE_EXAMPLES"] = "400"
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider",
                "tests/properties/test_world_machine.py")
    session.run("hermes-ref", "explore", "--hunt", "--workers", workers)
