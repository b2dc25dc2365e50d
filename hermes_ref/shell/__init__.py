"""The imperative shell: the only part of ``hermes_ref`` that touches the world.

Everything outside this package is the pure core: it performs no I/O and only awaits
effects (``hermes_ref.effects``). This package performs them for production:

* ``driver``: the asyncio driver that runs an engine coroutine and answers its effects;
* ``runtime``: one process's stack wired in one call (``open_runtime``);
* adapters: the httpx chat-completions client (``http_provider``, ``chat_wire``), the
  aiosqlite store (``sqlite_*``), the workspace tools (``workspace_tools``) and the
  holder identity and pid liveness of the lease (``liveness``).

The core never imports from here (a test says so); the simulator in ``sim/`` has its
own driver and world and uses these adapters only where it runs on real SQLite.
"""
