"""I/O adapters: httpx provider, SQLite store, workspace tools. Only drivers import these."""
