"""The served simulator: an OpenAI-compatible chat-completions server driven by a script.

Theory of operation
-------------------
``hermes-ref sim serve --script FILE`` lets any OpenAI-compatible agent meet every
provider fault the catalogue knows, over a real socket. The pieces, one concern each:

* ``script``: the script file's model and its validation (one-line errors naming the
  file, the step and the key);
* ``request``: a request body read as OpenAI reads it: every shape the API accepts is
  taken, unknown fields are noted for the journal, and only what OpenAI refuses is
  refused, with OpenAI's error shape;
* ``cursor``: which route a request belongs to (the main loop's, or a side call's) and
  which step answers it; it counts what was consumed and what was left;
* ``wire``: a step and a request → a plan of bytes (status, headers, SSE events with
  delays, stalls and cuts), deterministic per seed;
* ``journal``: one JSONL record per request, with the gap since the last one;
* ``server``: the threaded HTTP server, and the httpx handler that plays a plan in
  process; ``handler`` reads one connection's requests safely and plays their plans;
* ``cli``: the ``sim serve`` command (and its alias ``fake-provider serve``), its
  signals, the closing summary and the exit code;
* ``strategies``: the fault catalogue as hypothesis strategies of steps and scripts;
* ``hermes_agent``: a run of the real Hermes Agent (its own venv) against a script.

``sim.pytest_plugin`` offers all of it to other projects' tests; the user's guide is
``docs/test-your-own-agent.md``.
"""

from __future__ import annotations
