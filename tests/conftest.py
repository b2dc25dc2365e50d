"""Shared pytest configuration: the slow-sweep flag."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="run long sweeps marked slow (nox -s sweep)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long sweep: pass --run-slow (or run 'nox -s sweep')")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
