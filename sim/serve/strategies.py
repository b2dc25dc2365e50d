"""The fault catalogue as hypothesis strategies of script steps and whole scripts.

Theory of operation
-------------------
``fault_steps()`` draws one step of a served script: a plain reply (text, tool calls with
well-formed or malformed arguments), an empty reply of each kind (``""``, ``content:
null``, a literal empty ``tool_calls`` list), a text fault (lone surrogate, split pair),
calls sharing an id, every error kind of ``sim.serve.script.ERROR_KINDS`` but ``http``
and ``timeout`` (with a Retry-After sometimes), and a reply with wire trouble: cut
part-way, an error event inside the stream, a JSON body for a stream request, scripted or
absent usage. Stalls and delays are drawn only with ``slow=True``, and then short, so
properties stay fast. Every drawn step validates (``sim.serve.script.step``).

``scripts()`` draws a list of such steps that ends with a plain text answer, so an agent
that retries what it should always reaches an answer. hypothesis is imported when a
strategy is built, never at import time.
"""

from __future__ import annotations

from typing import Any

_ERRORS = ("rate_limited", "server_error", "overloaded", "context_overflow", "auth",
           "forbidden", "not_found", "too_large", "unprocessable", "rejected", "malformed")


def fault_steps(*, slow: bool = False) -> Any:
    """A strategy of script steps, one fault (or none) each."""
    from hypothesis import strategies as st

    words = st.text(alphabet="abcdefghij ", min_size=1, max_size=20)
    call = st.fixed_dictionaries({"name": st.sampled_from(["read_file", "terminal"]),
                                  "arguments": st.one_of(
                                      st.fixed_dictionaries({"path": words}),
                                      st.sampled_from(['{"path": "a', "not json", ""]))})
    replies = st.one_of(
        st.builds(lambda t: {"text": t}, words),
        st.builds(lambda cs: {"tool_calls": cs}, st.lists(call, min_size=1, max_size=3)),
        st.sampled_from([{"text": ""}, {"content": None}, {"tool_calls": []}]),
        st.builds(lambda t, f: {"text": t, "fault": f}, words,
                  st.sampled_from(["lone_surrogate", "split_pair"])),
        st.builds(lambda cs: {"tool_calls": cs, "fault": "shared_id"},
                  st.lists(call, min_size=2, max_size=3)),
    )
    errors = st.builds(
        lambda kind, retry: {"error": kind, **({"retry_after_s": retry} if retry else {})},
        st.sampled_from(_ERRORS), st.sampled_from([None, 0, 0.01]))
    trouble = st.builds(
        lambda t, extra: {"text": t, **extra}, words,
        st.sampled_from([{"cut_after": 1}, {"cut_after": 3}, {"error_after": 2},
                         {"json_body": True}, {"usage": None},
                         {"usage": {"prompt_tokens": 5, "completion_tokens": 2}}]))
    kinds = [replies, errors, trouble]
    if slow:
        kinds.append(st.builds(lambda t, extra: {"text": t, **extra}, words, st.sampled_from(
            [{"delay_s": 0.01}, {"chunk_delay_s": 0.005}, {"stall_after": 1, "stall_s": 0.05}])))
    return st.one_of(*kinds)


def scripts(*, max_faults: int = 4, slow: bool = False) -> Any:
    """A strategy of scripts: up to ``max_faults`` fault steps, then a text answer."""
    from hypothesis import strategies as st

    return st.builds(lambda steps: [*steps, {"text": "final answer"}],
                     st.lists(fault_steps(slow=slow), max_size=max_faults))
