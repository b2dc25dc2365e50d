"""Executable stories, one per lifecycle boundary.

Each module groups the stories of one stage of the turn. Importing ``scenarios`` loads
them all into ``sim.harness.REGISTRY``; ``hermes-ref scenarios list`` shows them.
"""

from __future__ import annotations

import importlib
import pkgutil

from sim.harness import REGISTRY, ScenarioSpec


def load_all() -> dict[str, ScenarioSpec]:
    """Import every scenario module (once) and return the registry, in definition order."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return REGISTRY
