"""The plugin's own tests run other test files with pytester (loaded in pyproject's addopts:
pytest refuses ``pytest_plugins`` in a conftest below the rootdir)."""
