"""One resolution of tool paths: the planner, the real tools and the simulated tools agree."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_ref import tool_round
from hermes_ref.effects import ExecuteTools, ResolvePaths
from hermes_ref.engine import Engine
from hermes_ref.errors import BadInput
from hermes_ref.models import Role, ToolCall, ToolResult
from hermes_ref.prologue import TurnInput
from hermes_ref.shell.driver import AsyncDriver
from hermes_ref.shell.http_provider import HttpProvider
from hermes_ref.shell.sqlite_store import AsyncSqliteStore
from hermes_ref.shell.workspace_tools import WorkspaceTools
from hermes_ref.tool_round import plan_segments
from hermes_ref.tool_specs import REFERENCE_TOOLS, TOOLS_BY_NAME, normalize_in_root
from sim.provider import ScriptedProvider, text, tool_calls
from sim.provider_http import fake_transport
from sim.tools import SimLedgerEntry, SimTools

FILES = {"a.txt": "old\n", "sub/b.txt": "beta\n", "sub/deep/c.txt": "gamma\n"}
LINKS = {"link.txt": "a.txt", "sub/up.txt": "../a.txt", "d": "sub", "sub/deep/back": "../..",
         "loop1": "loop2", "loop2": "loop1", "out": "../outside", "dangling": "missing/x.txt",
         "dd": "d/deep"}


def call(name: str, call_id: str = "c", **args: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=json.dumps(args))


def both_worlds(root: Path) -> tuple[WorkspaceTools, SimTools]:
    """The same tree on disk and in memory, the simulated root named like the real one."""
    for rel, body in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    for rel, target in LINKS.items():
        os.symlink(target, root / rel)
    (root / "abs.txt").symlink_to(root / "a.txt")
    sim = SimTools(FILES, root=str(root))
    sim.add_links({**LINKS, "abs.txt": str(root / "a.txt")})
    return WorkspaceTools(root), sim


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


# -- the shared lexical step ------------------------------------------------------------
@pytest.mark.parametrize(("path", "expected"), [
    ("a.txt", "a.txt"), ("./sub//b.txt", "sub/b.txt"), ("sub/../a.txt", "a.txt"), ("", "."),
    (".", "."), ("/r", "."), ("/r/a.txt", "a.txt"), ("/r/../r/a.txt", "a.txt"), ("..", None),
    ("../r/a.txt", "a.txt"), ("../x", None), ("/etc/passwd", None), ("/rr/a.txt", None),
    ("/", None),
])
def test_normalize_in_root_is_string_work(path: str, expected: str | None) -> None:
    """In-root paths, relative or absolute or back in through "..", become one relative form."""
    assert normalize_in_root(path, "/r") == expected


# -- the two resolvers ----------------------------------------------------------------------
PATHS = ["a.txt", "link.txt", "sub/up.txt", "d/b.txt", "d/../a.txt", "sub/deep/back/a.txt",
         "loop1", "loop1/x", "out", "out/x", "abs.txt", "dangling", "dd/c.txt", "dd/../b.txt",
         "d/deep/back/sub/b.txt", ".", "", "..", "/etc/passwd", "link.txt/x", "{root}",
         "{root}/a.txt", "{root}/link.txt", "{root}/../ws/a.txt", "../ws/a.txt"]


def test_sim_and_workspace_resolve_every_path_alike(root: Path) -> None:
    """Absolute paths, links, '..' after a link, loops and escapes land alike in both worlds."""
    ws, sim = both_worlds(root)
    paths = tuple(p.format(root=root) for p in PATHS)
    assert sim.resolve_paths(paths) == ws.resolve_paths(paths)
    assert ws.resolve_paths(paths)[:4] == ("a.txt", "a.txt", "a.txt", "sub/b.txt")


def test_sim_and_workspace_act_alike_through_links(root: Path) -> None:
    """Reads, writes, patches and searches through links and absolute paths agree, files too."""
    ws, sim = both_worlds(root)
    script = [("read_file", {"path": "link.txt"}), ("write_file", {"path": f"{root}/a.txt",
                                                                   "content": "one\n"}),
              ("patch", {"path": "sub/up.txt", "old_string": "one", "new_string": "two"}),
              ("read_file", {"path": "d/deep/back/a.txt"}), ("search_files", {"pattern": "two"}),
              ("write_file", {"path": "dangling", "content": "made\n"}),
              ("read_file", {"path": "out"}), ("write_file", {"path": "d", "content": "x"})]

    def results(tools: WorkspaceTools | SimTools) -> list[ToolResult]:
        return [tools.run(call(name, **args)) for name, args in script]

    assert results(sim) == results(ws)
    on_disk = {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*")
               if p.is_file() and not p.is_symlink()}
    assert sim.snapshot_files() == on_disk
    assert on_disk["a.txt"] == "two\n" and on_disk["missing/x.txt"] == "made\n"


def test_sim_ledger_records_where_each_call_landed() -> None:
    """Each ledger entry names the resolved path its call was aimed at, None when refused."""
    sim = SimTools({"a.txt": "x"})
    sim.add_links({"link.txt": "a.txt"})
    for name, args in [("read_file", {"path": "/workspace/a.txt"}),
                       ("write_file", {"path": "link.txt", "content": "y"}),
                       ("search_files", {"pattern": "y"}), ("read_file", {"path": "../a.txt"}),
                       ("terminal", {"command": "ls"})]:
        sim.run(call(name, **args))
    assert all(isinstance(e, SimLedgerEntry) for e in sim.ledger)
    assert [getattr(e, "path", "?") for e in sim.ledger] == ["a.txt", "a.txt", ".", None, None]


@pytest.mark.parametrize("links", [{"../x": "a.txt"}, {".": "a.txt"}, {"a.txt": "b.txt"},
                                   {"sub": "a.txt"}, {"l": ""}])
def test_sim_links_are_placed_like_real_ones(links: dict[str, str]) -> None:
    """A link outside the root, over a file or folder, or with no target is a broken setup."""
    sim = SimTools({"a.txt": "x", "sub/b.txt": "y"})
    with pytest.raises(BadInput):
        sim.add_links(links)


# -- the planner ----------------------------------------------------------------------------
def shape(segments: list[tool_round.Segment]) -> list[tuple[bool, list[str]]]:
    return [(s.parallel, [c.id for c in s.calls]) for s in segments]


def test_planner_compares_where_calls_land_not_their_strings() -> None:
    """With the world's answers a write through another name of a read file waits for it."""
    calls = (call("read_file", "r", path="a.txt"), call("write_file", "w", path="link.txt",
                                                        content="x"),
             call("read_file", "b", path="b.txt"))
    on_paper = plan_segments(calls, TOOLS_BY_NAME)
    assert shape(on_paper) == [(True, ["r", "w", "b"])]  # the strings alone would race
    landed = {"a.txt": "a.txt", "link.txt": "a.txt", "b.txt": "b.txt"}
    assert shape(plan_segments(calls, TOOLS_BY_NAME, landed)) == [(False, ["r"]),
                                                                 (True, ["w", "b"])]
    refused = {"a.txt": "a.txt", "link.txt": None, "b.txt": "b.txt"}  # unknown: overlaps all
    assert shape(plan_segments(calls, TOOLS_BY_NAME, refused)) == [(False, ["r"]), (False, ["w"]),
                                                                  (False, ["b"])]


def test_planner_without_answers_places_only_relative_paths() -> None:
    """On paper an absolute path overlaps everything, so it never shares a writer's segment."""
    calls = (call("read_file", "r", path="a.txt"),
             call("write_file", "w", path="/anywhere/a.txt", content="x"))
    assert shape(plan_segments(calls, TOOLS_BY_NAME)) == [(False, ["r"]), (False, ["w"])]


@pytest.mark.parametrize(("calls", "asked"), [
    ((("read_file", "a.txt"), ("read_file", "b.txt")), None),
    ((("write_file", "a.txt"), ("read_file", "a.txt")), None),
    ((("write_file", "a.txt"), ("terminal", None)), None),
    ((("read_file", "a.txt"), ("write_file", "/w/a.txt"), ("read_file", "a.txt")),
     ("a.txt", "/w/a.txt")),
])
def test_round_asks_the_world_only_when_a_writer_could_race(
        calls: tuple[tuple[str, str | None], ...], asked: tuple[str, ...] | None) -> None:
    """ResolvePaths is awaited for a writer among two distinct paths, and only then."""
    made = tuple(call(n, f"c{i}", **({"path": p, "content": ""} if n == "write_file"
                                     else {"path": p} if p else {"command": "ls"}))
                 for i, (n, p) in enumerate(calls))
    coro = tool_round._resolve_paths(made, TOOLS_BY_NAME)
    try:
        effect = coro.send(None)
    except StopIteration as done:
        assert asked is None and done.value == {}
        return
    assert isinstance(effect, ResolvePaths) and effect.paths == asked
    with pytest.raises(StopIteration) as answered:
        coro.send(("a.txt", "a.txt"))
    assert answered.value.value == {"a.txt": "a.txt", "/w/a.txt": "a.txt"}


# -- the asyncio driver with real tools -----------------------------------------------------
class SegmentLog(AsyncDriver):
    """An AsyncDriver that notes each segment it is asked to run."""

    segments: list[tuple[bool, list[str]]]

    async def _execute_tools(self, effect: ExecuteTools) -> tuple[ToolResult, ...]:
        self.segments.append((effect.parallel, [c.id for c in effect.calls]))
        return await super()._execute_tools(effect)


async def test_real_tools_keep_a_write_by_another_name_out_of_the_read(
        root: Path, tmp_path: Path) -> None:
    """Read a.txt, write it by absolute path and via a symlink: three segments, real files."""
    (root / "a.txt").write_text("old\n")
    (root / "b.txt").write_text("beta\n")
    (root / "link.txt").symlink_to("a.txt")
    script = ScriptedProvider([tool_calls(
        ("read_file", {"path": "a.txt"}),
        ("write_file", {"path": str(root / "a.txt"), "content": "abs\n"}),
        ("write_file", {"path": "link.txt", "content": "via link\n"}),
        ("read_file", {"path": "b.txt"})), text("Done.")])
    store = await AsyncSqliteStore.open(tmp_path / "hermes.db")
    async with httpx.AsyncClient(transport=fake_transport(script)) as client:
        driver = SegmentLog(store=store, provider=HttpProvider("http://fake/v1", client=client),
                            tools=WorkspaceTools(root))
        driver.segments = []
        result = await driver.run(Engine(tools=REFERENCE_TOOLS).run_turn(
            TurnInput(session_id="s-1", text="rewrite a.txt twice")))
        rows = (await store.snapshot()).transcript("s-1")
    await store.close()
    assert result.completed
    assert driver.segments == [(False, ["call_1"]), (False, ["call_2"]),
                               (True, ["call_3", "call_4"])]
    reads = [m.content or "" for m in rows if m.role is Role.TOOL]
    assert "old" in reads[0] and (root / "a.txt").read_text() == "via link\n"
    assert (root / "link.txt").is_symlink()
