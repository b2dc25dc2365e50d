"""The plugin's own tests run other test files with pytester."""

from __future__ import annotations

pytest_plugins = ["pytester"]
