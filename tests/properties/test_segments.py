"""Property: running the planner's segments concurrently gives what running the calls one by
one gives (TOOL-4, TOOL-5).

Hypothesis generates lists of calls over path-scoped readers (``read_file``,
``search_files``), writers (``write_file``, ``patch``) on a few overlapping paths (a file,
the same file spelled another way, a folder and a file in it, a symlink), a parallel-safe
tool (``terminal`` printing with ``echo``, declared parallel-safe for the planner: it
touches no file) and an interactive barrier. Each list is run twice on fresh simulated
tools: once call after call, and once segment by segment as ``plan_segments`` cuts it,
with the calls of a parallel segment run in an order Hypothesis picks (any interleaving a
pool of workers may produce). The results, in call order, and the final files must be the
same: the planner only lets calls run together when no two of them conflict.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_ref.models import ToolCall, ToolKind, ToolSpec
from hermes_ref.tool_round import plan_segments
from hermes_ref.tool_specs import TOOLS_BY_NAME
from sim.tools import SimTools

MAX_EXAMPLES = int(os.environ.get("HERMES_REF_PROPERTY_EXAMPLES", "200"))

FILES = {"a.txt": "alpha one\n", "d/c.txt": "gamma one\n", "d/e.txt": "eps one\n"}
LINKS = {"link.txt": "d/c.txt"}
PATHS = ("a.txt", "./a.txt", "d", "d/c.txt", "d/../d/c.txt", "d/e.txt", "link.txt", "new.txt")
SPECS: dict[str, ToolSpec] = {
    **TOOLS_BY_NAME,
    "terminal": TOOLS_BY_NAME["terminal"].model_copy(update={"kind": ToolKind.PARALLEL_SAFE}),
}

PATH = st.sampled_from(PATHS)
WORD = st.sampled_from(["one", "two", "alpha", "gamma", "x"])
CALL = st.one_of(
    st.builds(lambda p: ("read_file", {"path": p}), PATH),
    st.builds(lambda p, w: ("search_files", {"pattern": w, "path": p}), PATH, WORD),
    st.builds(lambda p, w: ("write_file", {"path": p, "content": f"{w} written\n"}), PATH, WORD),
    st.builds(lambda p, a, b: ("patch", {"path": p, "old_string": a, "new_string": b}),
              PATH, WORD, WORD),
    st.builds(lambda w: ("terminal", {"command": f"echo {w}"}), WORD),
    st.just(("clarify", {"question": "which one?"})),
)


def _calls(specs: list[tuple[str, dict[str, Any]]]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(id=f"call_{i}", name=name, arguments=json.dumps(args))
                 for i, (name, args) in enumerate(specs, start=1))


def _world() -> SimTools:
    tools = SimTools(FILES)
    tools.add_links(LINKS)
    return tools


def _outcome(result: Any) -> tuple[str, bool, str]:
    return result.call_id, result.is_error, result.content


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(specs=st.lists(CALL, min_size=1, max_size=8), data=st.data())
def test_segmented_execution_equals_sequential_execution(
        specs: list[tuple[str, dict[str, Any]]], data: st.DataObject) -> None:
    """Whatever the calls, segment-by-segment runs with any order inside a parallel segment
    give the same results, in call order, and the same files as one-by-one runs."""
    calls = _calls(specs)
    one_by_one = _world()
    expected = [_outcome(one_by_one.run(call)) for call in calls]

    segmented = _world()
    paths = tuple(dict.fromkeys(p for c in calls if (p := (c.arguments_object or {}).get("path"))))
    resolved = dict(zip(paths, segmented.resolve_paths(paths), strict=True))
    got: dict[str, tuple[str, bool, str]] = {}
    for segment in plan_segments(calls, SPECS, resolved):
        order = list(segment.calls)
        if segment.parallel:
            order = data.draw(st.permutations(order), label="order inside a parallel segment")
        for call in order:
            got[call.id] = _outcome(segmented.run(call))
    assert [got[c.id] for c in calls] == expected
    assert segmented.snapshot_files() == one_by_one.snapshot_files()


def test_the_generator_reaches_parallel_segments_with_writers() -> None:
    """The property is not vacuous: the paths and tools generated do form parallel segments
    holding a writer, and segments the planner must split."""
    calls = _calls([("write_file", {"path": "a.txt", "content": "x"}),
                    ("read_file", {"path": "d/e.txt"}), ("read_file", {"path": "./a.txt"})])
    tools = _world()
    paths = ("a.txt", "d/e.txt", "./a.txt")
    plan = plan_segments(calls, SPECS, dict(zip(paths, tools.resolve_paths(paths), strict=True)))
    assert [(len(s.calls), s.parallel) for s in plan] == [(2, True), (1, False)]
