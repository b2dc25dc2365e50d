"""Executable stories, one per lifecycle boundary.

Each module groups the stories of one stage of the turn. Importing ``scenarios`` loads
them all into ``sim.harness.REGISTRY``; ``hermes-ref scenarios list`` shows them.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from hermes_ref.errors import BadInput
from sim.harness import REGISTRY, ScenarioSpec


def load_all(package: str = __name__) -> dict[str, ScenarioSpec]:
    """Import every scenario module of ``package`` (once) and return the registry.

    A module that cannot be imported is reported as ``BadInput`` naming its file and the
    line at fault, instead of a traceback from deep inside the import machinery.
    """
    root = sys.modules[package] if package in sys.modules else importlib.import_module(package)
    for info in pkgutil.iter_modules(root.__path__):
        if info.name.startswith("_"):
            continue
        name = f"{package}.{info.name}"
        try:
            importlib.import_module(name)
        except SyntaxError as error:
            raise BadInput(f"scenario file {error.filename}, line {error.lineno}: "
                           f"{error.msg}") from error
        except Exception as error:
            raise BadInput(f"scenario module {name} failed to load: "
                           f"{type(error).__name__}: {error}") from error
    return REGISTRY
