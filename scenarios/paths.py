"""Stories of where tools act: one file named three ways is still one file to the planner.

The model may name a workspace file by its relative path, by its absolute path inside
the root, or through a symlink. The segment planner asks the tool world where each path
lands (``ResolvePaths``) before it decides what may run together, so a write through any
of those names waits for a read of the same file (TOOL-4). The checker judges the paths
the simulated tools recorded when they ran, not the engine's plan.
"""

from __future__ import annotations

from hermes_ref.models import Role
from sim.harness import Story, scenario
from sim.provider import text, tool_calls
from sim.tools import SIM_ROOT


@scenario("A write through the absolute path of a file waits for the read of that file",
          invariants=("TOOL-4", "TOOL-1"), stage="tool_round")
def absolute_path_write_waits_for_the_read(s: Story) -> None:
    s.files({"a.txt": "old", "b.txt": "beta"})
    s.script(tool_calls(("read_file", {"path": "a.txt"}),
                        ("write_file", {"path": f"{SIM_ROOT}/a.txt", "content": "new"}),
                        ("read_file", {"path": "b.txt"})),
             text("Rewritten."))
    s.turn("Read a.txt, rewrite it by its full path, and read b.txt.")
    s.expect(s.world.batches == [("call_1",), ("call_2", "call_3")],
             "the read of a.txt ran alone, then the write alongside the unrelated read")
    reads = [r.content or "" for r in s.transcript() if r.role is Role.TOOL]
    s.expect("old" in reads[0], "the read saw the file before the write")
    s.expect(s.world.tools.snapshot_files()["a.txt"] == "new", "the write landed on a.txt")


@scenario("A write through a symlink waits for the read of the file it points to",
          invariants=("TOOL-4", "TOOL-1"), stage="tool_round")
def symlink_write_waits_for_the_read(s: Story) -> None:
    s.files({"a.txt": "old"})
    s.symlinks({"link.txt": "a.txt"})
    s.script(tool_calls(("read_file", {"path": "a.txt"}),
                        ("write_file", {"path": "link.txt", "content": "new"})),
             text("Rewritten."))
    s.turn("Read a.txt, then rewrite it through link.txt.")
    s.expect(s.world.batches == [("call_1",), ("call_2",)], "the write ran after the read")
    reads = [r.content or "" for r in s.transcript() if r.role is Role.TOOL]
    s.expect("old" in reads[0], "the read saw the file before the write")
    files = s.world.tools.snapshot_files()
    s.expect(files == {"a.txt": "new"}, "the write went through the link to a.txt")


@scenario("A search of a folder waits for a write inside it that the model asked for first",
          invariants=("TOOL-4",), stage="tool_round")
def folder_search_waits_for_the_write_inside_it(s: Story) -> None:
    s.files({"src/a.py": "old = 1\n", "notes.txt": "n"})
    s.script(tool_calls(("write_file", {"path": "src/a.py", "content": "new = 2\n"}),
                        ("search_files", {"pattern": "new", "path": "src"}),
                        ("read_file", {"path": "notes.txt"})),
             text("Rewritten and found."))
    s.turn("Rewrite src/a.py, then search src for the new name, and read notes.txt.")
    s.expect(s.world.batches == [("call_1",), ("call_2", "call_3")],
             "the write inside src ran alone, then the search of src beside the unrelated read")
    found = [r.content or "" for r in s.transcript() if r.role is Role.TOOL][1]
    s.expect("src/a.py" in found and "new = 2" in found, "the search saw the written file")
