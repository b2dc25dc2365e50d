"""Tool subprocesses: bounded memory while a huge output streams, the whole tree ended on a
timeout (a ``setsid`` grandchild included), and the call back at its timeout (TOOL-5, TOOL-7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hermes_ref.models import ToolCall
from hermes_ref.shell.workspace_tools import WorkspaceTools
from hermes_ref.tool_spill import spilled_path

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

OUTPUT_BYTES = 50_000_000


def _terminal(tools: WorkspaceTools, command: str, **extra: object) -> tuple[str, float]:
    call = ToolCall(id="c1", name="terminal", arguments=json.dumps({"command": command, **extra}))
    began = time.monotonic()
    result = tools.run(call)
    return result.content, time.monotonic() - began


def _alive(pid: int) -> bool:
    """Is ``pid`` a live process (a zombie waiting for its reaper is dead)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")


PEAK_PROBE = textwrap.dedent("""
    import json, resource, subprocess, sys
    from pathlib import Path
    from hermes_ref.models import ToolCall
    from hermes_ref.shell.workspace_tools import WorkspaceTools
    root, how, size = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    command = f"head -c {size} /dev/zero | tr '\\\\0' x"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if how == "communicate":  # what the terminal did before: read it all, then cap it
        proc = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        out, _ = proc.communicate(timeout=60)
        text = out.decode("utf-8", errors="replace")[:50_000]
    else:
        call = ToolCall(id="c1", name="terminal", arguments=json.dumps({"command": command}))
        text = WorkspaceTools(root).run(call).content
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_kb": before, "after_kb": after, "chars": len(text)}))
""")


def peak_rss_kb(root: Path, how: str, size: int = OUTPUT_BYTES) -> dict[str, int]:
    """Peak RSS of a fresh interpreter before and after one terminal call printing ``size``
    bytes, read with the streaming tool (``how="stream"``) or the old ``communicate``."""
    done = subprocess.run([sys.executable, "-c", PEAK_PROBE, str(root), how, str(size)],
                          capture_output=True, text=True, check=True, timeout=120)
    figures: dict[str, int] = json.loads(done.stdout)
    return figures


def test_a_50_mb_output_streams_to_the_spill_file_in_bounded_memory(tmp_path: Path) -> None:
    """Reading 50 MB of output raises the peak RSS by a few MB, not by the output's size."""
    streamed = peak_rss_kb(tmp_path, "stream")
    growth_mb = (streamed["after_kb"] - streamed["before_kb"]) / 1024
    assert growth_mb < 20, f"peak RSS grew by {growth_mb:.1f} MB while 50 MB streamed"
    spilled = sorted((tmp_path / ".hermes" / "spill").iterdir())
    assert len(spilled) == 1 and spilled[0].stat().st_size == OUTPUT_BYTES


def test_the_spill_file_holds_the_whole_output_and_the_summary_names_it(tmp_path: Path) -> None:
    """Head and tail are shown, the whole text is in the file the summary names."""
    tools = WorkspaceTools(tmp_path, output_chars_max=5_000)
    content, _ = _terminal(tools, "seq 1 20000")
    path = spilled_path(content)
    assert path is not None and len(content) <= 5_000 + len("\n[exit code 0]")
    assert (tmp_path / path).read_text() == "".join(f"{i}\n" for i in range(1, 20_001))
    assert "\n1\n2\n3\n" in content and "19999\n20000" in content
    assert content.endswith("[exit code 0]")


def test_a_setsid_grandchild_is_ended_and_the_call_returns_at_its_timeout(tmp_path: Path) -> None:
    """The timeout kills the group, a grandchild that left it with setsid, and reaps the child."""
    marker = tmp_path / "grandchild.pid"
    command = f"setsid sh -c 'echo $$ > {marker}; exec sleep 60' & sleep 60"
    content, took_s = _terminal(WorkspaceTools(tmp_path), command, timeout_s=1.0)
    assert "timed out after 1s" in content
    assert 1.0 <= took_s < 1.5, f"the call returned after {took_s:.2f}s for a 1 s timeout"
    grandchild = int(marker.read_text())
    deadline = time.monotonic() + 2.0
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(grandchild), f"the setsid grandchild {grandchild} survived the timeout"


def test_a_grandchild_whose_parent_died_is_found_by_the_pipe_it_holds(tmp_path: Path) -> None:
    """A reparented grandchild still holding the output pipe is ended too."""
    marker = tmp_path / "orphan.pid"
    command = f"(setsid sh -c 'echo $$ > {marker}; exec sleep 60' &) ; sleep 60"
    _, took_s = _terminal(WorkspaceTools(tmp_path), command, timeout_s=1.0)
    orphan = int(marker.read_text())
    deadline = time.monotonic() + 2.0
    while _alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(orphan) and took_s < 1.5


def test_a_background_job_holding_the_pipe_does_not_hold_the_call(tmp_path: Path) -> None:
    """A command that exits is done, even if something it started keeps the pipe open."""
    content, took_s = _terminal(WorkspaceTools(tmp_path), "sleep 7.25 & echo started",
                                timeout_s=10.0)
    subprocess.run(["pkill", "-f", "sleep 7.25"], check=False)
    assert content.startswith("started\n") and content.endswith("[exit code 0]")
    assert took_s < 1.5


def test_own_process_is_never_a_target(tmp_path: Path) -> None:
    """Ending a tree never signals the runner itself (it holds the pipe's read end)."""
    _terminal(WorkspaceTools(tmp_path), "sleep 5", timeout_s=0.3)
    assert _alive(os.getpid())
