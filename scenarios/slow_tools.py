"""Stories of tools that are slow, stuck or huge: [8] workers, the start gate, the batch
deadline (TOOL-5, and TOOL-3's timed-out calls) and oversized results spilled (TOOL-7)."""

from __future__ import annotations

from hermes_ref.models import Role, ToolCall
from hermes_ref.tool_spill import spilled_path
from sim.harness import Story, scenario
from sim.provider import text, tool_calls
from sim.tools import SimLedgerEntry


def _elapsed(s: Story) -> float:
    return s.world.clock.now() - s.world.timeline.start_s


def _results(s: Story) -> list[tuple[str, str]]:
    return [(r.tool_call_id or "", r.content or "") for r in s.transcript() if r.role is Role.TOOL]


@scenario("Ten parallel reads run on at most eight workers and come back in call order",
          invariants=("TOOL-5", "TOOL-3", "TOOL-4"), stage="tool_round")
def ten_reads_share_eight_workers(s: Story) -> None:
    names = [f"f{i}.txt" for i in range(10)]
    s.files({name: f"content {i}" for i, name in enumerate(names)})
    s.world.tools.slow("read_file", 5.0)
    s.script(tool_calls(*(("read_file", {"path": name}) for name in names)), text("Read all ten."))
    s.turn("Read the ten files.")
    ids = [cid for cid, _ in _results(s)]
    s.expect(ids == [f"call_{i}" for i in range(1, 11)], "ten results, in call order")
    s.expect(all(f"content {i}" in body for i, (_, body) in enumerate(_results(s))),
             "each result is its own call's")
    s.expect(abs(_elapsed(s) - 10.0) < 1e-3, "eight ran at once, then the last two (10 s, not 5)")


@scenario("A stuck tool is cut at the batch deadline while the rest of its batch finishes",
          invariants=("TOOL-5", "TOOL-3", "TOOL-6"), stage="tool_round")
def stuck_tool_is_cut_at_the_deadline(s: Story) -> None:
    s.files({"a.txt": "alpha", "b.txt": "beta", "c.txt": "gamma"})
    s.world.tools.stuck("read_file", path="b.txt")
    s.script(tool_calls(("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"}),
                        ("read_file", {"path": "c.txt"})),
             text("b.txt did not answer."))
    result = s.turn("Read a, b and c.")
    s.expect(result is not None and not result.failed, "the turn goes on after the timeout")
    bodies = dict(_results(s))
    s.expect("alpha" in bodies["call_1"] and "gamma" in bodies["call_3"], "its neighbours answered")
    s.expect("timed out after 420s" in bodies["call_2"], "the stuck call has the timed-out result")
    s.expect(abs(_elapsed(s) - 420.0) < 1e-3, "the batch waited exactly the deadline")


@scenario("A call still running at the deadline does not count, even if it ends later",
          invariants=("TOOL-5", "TOOL-3"), stage="tool_round")
def slow_call_past_the_deadline_is_cut(s: Story) -> None:
    s.files({"a.txt": "alpha", "b.txt": "beta"})
    s.world.tools.slow("read_file", 500.0, path="b.txt")
    s.world.tools.slow("read_file", 420.0, path="a.txt")  # ends on the deadline: it counts
    s.script(tool_calls(("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"})),
             text("a.txt came back; b.txt took too long."))
    s.turn("Read a and b.")
    bodies = dict(_results(s))
    s.expect("alpha" in bodies["call_1"], "the call ending on the deadline counts")
    s.expect("timed out after 420s" in bodies["call_2"], "the call ending at 500 s does not")


@scenario("A call slow to begin holds the others back only until the start gate opens",
          invariants=("TOOL-5", "TOOL-3"), stage="tool_round")
def wedged_start_does_not_starve_the_batch(s: Story) -> None:
    s.files({"a.txt": "alpha", "b.txt": "beta", "c.txt": "gamma"})
    s.world.tools.slow("read_file", 1.0, path="a.txt", start_delay_s=300.0)  # awaiting approval
    s.script(tool_calls(("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"}),
                        ("read_file", {"path": "c.txt"})),
             text("All three read."))
    s.turn("Read a, b and c.")
    starts = {e.call_id: e.at - s.world.timeline.start_s for e in s.world.tools.ledger}
    s.expect(abs(starts["call_2"] - 120.0) < 1e-3 and abs(starts["call_3"] - 120.0) < 1e-3,
             "b and c started when the 120 s gate opened, not when a began")
    s.expect(abs(starts["call_1"] - 300.0) < 1e-3, "a began after its 300 s wait")
    s.expect(not any("timed out" in body for _, body in _results(s)), "nothing timed out")


@scenario("A huge result is spilled to a file and the model gets a summary with its path",
          invariants=("TOOL-7", "TOOL-3"), stage="tool_round")
def huge_result_is_spilled(s: Story) -> None:
    s.files({"big.log": "x" * 120_000 + "\n"})
    s.script(tool_calls(("read_file", {"path": "big.log"})),
             tool_calls(("terminal", {"command": "make build"})),
             text("The log and the build output are saved in the spill files."))
    s.world.tools.print_next("terminal", "".join(f"line {i}\n" for i in range(20_000)))
    s.turn("Show me big.log, then build.")
    files = s.world.tools.snapshot_files()
    for cid, body in _results(s):
        path = spilled_path(body)
        s.expect(path is not None and path in files, f"{cid}'s summary names a spill file")
        s.expect(len(body) <= s.world.tools.output_chars_max, f"{cid}'s summary is under the cap")
    spills = [e for e in s.world.tools.ledger if isinstance(e, SimLedgerEntry) and e.spilled_to]
    s.expect(len(spills) == 2, "both outputs were spilled")
    s.expect(files[spills[1].spilled_to or ""].endswith("line 19999\n[exit code 0]"),
             "the build's spill file holds the whole output")


@scenario("Two huge results of calls that share an id, in two turns, are spilled to two files",
          invariants=("TOOL-7",), stage="tool_round")
def repeated_call_id_spills_to_its_own_file(s: Story) -> None:
    """A provider that numbers calls per request sends the same id in the next turn; the
    spill's sequence number keeps the second output from overwriting the first's file,
    which the first turn's result still names."""
    s.files({"one.log": "1" * 60_000 + "\n", "two.log": "2" * 60_000 + "\n"})
    s.script(tool_calls(ToolCall(id="call_0", name="read_file", arguments='{"path": "one.log"}')),
             text("one.log is spilled."),
             tool_calls(ToolCall(id="call_0", name="read_file", arguments='{"path": "two.log"}')),
             text("two.log is spilled."))
    s.turn("Show me one.log.")
    s.turn("Show me two.log.")
    files = s.world.tools.snapshot_files()
    named = [spilled_path(body) for _, body in _results(s)]
    s.expect(len(named) == 2 and None not in named and named[0] != named[1],
             "each result names a spill file of its own")
    first = files.get(named[0] or "", "") if named else ""
    s.expect("1" * 100 in first and "2" * 100 not in first,
             "the first file still holds the first output")
