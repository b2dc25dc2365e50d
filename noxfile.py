"""Sessions: tests (default), lint, types, sweep (long property sweeps), bench."""

from __future__ import annotations

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
