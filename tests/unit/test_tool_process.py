"""Tool subprocesses: bounded memory while a huge output streams, the whole tree ended on a
timeout (a ``setsid`` grandchild included), and the call back at its timeout (TOOL-5, TOOL-7)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hermes_ref.models import ToolCall
from hermes_ref.shell.process_output import run_process
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
    # waiting for the group would take its 60 s; the margin is for a loaded machine
    assert 1.0 <= took_s < 5.0, f"the call returned after {took_s:.2f}s for a 1 s timeout"
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
    assert not _alive(orphan) and took_s < 5.0  # not the 60 s of the sleep


def test_a_background_job_holding_the_pipe_does_not_hold_the_call(tmp_path: Path) -> None:
    """A command that exits is done, even if something it started keeps the pipe open."""
    content, took_s = _terminal(WorkspaceTools(tmp_path), "sleep 7.25 & echo started",
                                timeout_s=10.0)
    subprocess.run(["pkill", "-f", "sleep 7.25"], check=False)
    assert content.startswith("started\n") and content.endswith("[exit code 0]")
    assert took_s < 5.0  # not the 7.25 s of the job


def test_own_process_is_never_a_target(tmp_path: Path) -> None:
    """Ending a tree never signals the runner itself (it holds the pipe's read end)."""
    _terminal(WorkspaceTools(tmp_path), "sleep 5", timeout_s=0.3)
    assert _alive(os.getpid())


def test_a_spill_file_that_cannot_be_opened_keeps_head_and_tail_and_the_pump(
        tmp_path: Path) -> None:
    """With no spill file the output is still read to the end, head and tail shown, and the
    result says the whole output could not be saved and why (not that nothing started)."""
    (tmp_path / "plain").write_text("a regular file\n")
    tools = WorkspaceTools(tmp_path, output_chars_max=1_000, spill_dir=tmp_path / "plain" / "spill")
    command = "yes x | head -c 5000; printf 'the end'; sleep 0.3; echo done > after.txt"
    call = ToolCall(id="c1", name="terminal", arguments=json.dumps({"command": command}))
    result = tools.run(call)
    assert not result.is_error and result.disposition == "applied", result.content
    assert (tmp_path / "after.txt").read_text() == "done\n"
    assert "could not be saved" in result.content and "Not a directory" in result.content
    assert result.content.startswith("x\nx\n") and "the end" in result.content
    assert "5007 characters" in result.content and result.content.endswith("[exit code 0]")
    assert len(result.content) <= 1_000 and spilled_path(result.content) is None


class _FullDisk(io.StringIO):
    """A spill file whose disk fills up at the second write."""

    def write(self, text: str) -> int:
        if self.tell():
            raise OSError(28, "No space left on device")
        return super().write(text)


def test_a_spill_file_that_fills_up_is_not_named_and_the_reason_is_kept(
        tmp_path: Path) -> None:
    """A spill write that fails drops the file from the outcome and keeps head and tail."""
    done = run_process("yes x | head -c 5000", shell=True, cwd=tmp_path, timeout_s=5.0,
                       cap_chars=1_000, tail_chars=100,
                       open_spill=lambda: ("spill.txt", _FullDisk()))
    assert done.exit_code == 0 and done.spilled_to is None and done.total_chars == 5_000
    assert done.unsaved is not None and "No space left" in done.unsaved
    assert done.head == "x\n" * 500 and done.tail == "x\n" * 50


def test_a_failure_after_the_start_ends_the_tree_and_leaves_the_effect_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error while the output is read ends the process tree; the result says unknown."""
    def broken_spill(call: ToolCall) -> object:
        raise RuntimeError("the spill broke")

    tools = WorkspaceTools(tmp_path, output_chars_max=1_000)
    monkeypatch.setattr(tools, "_open_spill", broken_spill)
    marker = tmp_path / "shell.pid"
    command = f"echo $$ > {marker}; yes x | head -c 5000; exec sleep 30"
    call = ToolCall(id="c1", name="terminal", arguments=json.dumps({"command": command}))
    began = time.monotonic()
    result = tools.run(call)
    took_s = time.monotonic() - began
    pid = int(marker.read_text())
    deadline = time.monotonic() + 1.0
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    survived = _alive(pid)
    if survived:  # the test leaves nothing behind, whatever it finds
        os.killpg(pid, signal.SIGKILL)
    assert result.is_error and result.disposition == "unknown", result.content
    assert "could not start" not in result.content and "the spill broke" in result.content
    assert not survived and took_s < 5.0, f"the command {pid} kept running after the failure"
