"""A tool's subprocess: output read as it streams, bounded in memory, ended whole on timeout.

Theory of operation
-------------------
``run_process`` starts a command in a session of its own (``start_new_session``: a new
process group) with stdout and stderr on one pipe, and reads the pipe incrementally
until EOF, the process's exit, or the timeout:

* **Bounded memory (TOOL-7).** At most ``cap_chars`` characters of output are kept in
  memory (the head). Past the cap, a spill file is opened (``open_spill``), the head is
  written to it and every further chunk goes straight to the file, while only a rolling
  tail of ``tail_chars`` stays in memory. A 50 MB output thus costs the cap, the tail and
  one 64 KiB read buffer, not 50 MB (and not the several copies ``communicate`` makes).
  When the spill file cannot be opened or written (a spill directory under a regular
  file, a full disk), reading goes on all the same: the head and the tail are kept and
  ``unsaved`` says why the whole output is in no file.
* **Started means ended.** Once ``Popen`` has returned, any failure while reading ends
  and reaps the whole tree before ``ProcessLost`` is raised: the command ran, so its
  effects are unknown, and it does not keep running after the call has answered.
  Only a failure to start raises ``OSError`` (or ``ValueError``).
* **Ended whole on timeout.** At the deadline the whole tree is killed: the process
  group, every descendant found through ``/proc`` (a grandchild that called ``setsid``
  has left the group but is still a descendant), and every process still holding the
  output pipe (a grandchild whose parent already died is reparented, but it still holds
  the pipe it inherited). The child is then reaped. Nothing is read after the kill, so
  the call returns at its timeout, not when a stray holder lets the pipe go.
* A command that exits while something it started in the background keeps the pipe
  open is done when it exits: the pipe is drained for a short grace and then closed.

Output is decoded as UTF-8 with replacement, chunk by chunk, so the spill file is the
whole output as text.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

READ_CHUNK_BYTES = 65_536
EXIT_GRACE_S = 0.25  # after the command exits, how long a background holder may keep writing


@dataclass(frozen=True, slots=True)
class ProcessOutcome:
    head: str                   # the whole output when not spilled, else its first part
    tail: str                   # the last ``tail_chars`` when spilled, else ""
    total_chars: int
    spilled_to: str | None      # the spill file's name as ``open_spill`` gave it
    exit_code: int | None       # None: it timed out and was killed
    unsaved: str | None = None  # why the output past the cap is in no file, when it is not


class ProcessLost(Exception):
    """The command started, then reading it failed: its tree was ended, its effects are unknown."""


class _Sink:
    """Head in memory up to the cap; past it, everything to the spill file and a tail.

    When the spill file cannot be opened or written, the head and the tail are kept all
    the same and ``unsaved`` says why the whole output is not in a file.
    """

    def __init__(self, cap_chars: int, tail_chars: int,
                 open_spill: Callable[[], tuple[str, TextIO]]) -> None:
        self.cap, self.tail_max, self.open_spill = cap_chars, tail_chars, open_spill
        self.head: list[str] = []
        self.head_chars = 0
        self.total = 0
        self.tail = ""
        self.file: TextIO | None = None
        self.name: str | None = None
        self.unsaved: str | None = None

    def write(self, text: str) -> None:
        if not text:
            return
        self.total += len(text)
        room = self.cap - self.head_chars
        if room:
            self.head.append(text[:room])
            self.head_chars += min(room, len(text))
        if len(text) <= room:
            return
        self.tail = (self.tail + text)[-self.tail_max:] if self.tail_max else ""
        if self.file is None and self.unsaved is None:
            self._open()
        if self.file is not None:
            self._save(text[room:])

    def _open(self) -> None:
        try:
            self.name, self.file = self.open_spill()
        except OSError as exc:
            self.unsaved = str(exc) or repr(exc)
            return
        self._save("".join(self.head))  # the file holds the whole output, head included

    def _save(self, text: str) -> None:
        assert self.file is not None
        try:
            self.file.write(text)
        except OSError as exc:
            self._lose(exc)

    def _lose(self, exc: OSError) -> None:
        """The file cannot hold the whole output: stop writing it and stop naming it."""
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
        self.file, self.name, self.unsaved = None, None, str(exc) or repr(exc)

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError as exc:  # the last flush failed: the file is not whole
                self._lose(exc)


def run_process(command: str | list[str], *, shell: bool, cwd: Path, timeout_s: float,
                cap_chars: int, tail_chars: int,
                open_spill: Callable[[], tuple[str, TextIO]]) -> ProcessOutcome:
    """Run ``command``; see the module docstring.

    Raises ``OSError`` or ``ValueError`` only if it cannot start, and ``ProcessLost``
    if anything fails once it has started (its tree is ended and reaped first).
    """
    sink = _Sink(cap_chars, tail_chars, open_spill)
    proc = subprocess.Popen(
        command, shell=shell, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        exit_code = _collect(proc, sink, timeout_s)
    except BaseException as exc:
        end_tree(proc)  # nothing the command started outlives the call
        if isinstance(exc, Exception):
            raise ProcessLost(repr(exc)) from exc
        raise
    finally:
        proc.stdout.close()
        sink.close()
    return ProcessOutcome("".join(sink.head), sink.tail, sink.total, sink.name, exit_code,
                          sink.unsaved)


def _collect(proc: subprocess.Popen[bytes], sink: _Sink, timeout_s: float) -> int | None:
    """Read ``proc`` to its end into ``sink``; its exit code, or None when it timed out."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    if _pump(proc, sink, decoder, time.monotonic() + timeout_s):
        end_tree(proc)
        return None
    sink.write(decoder.decode(b"", final=True))
    return proc.wait()


def _pump(proc: subprocess.Popen[bytes], sink: _Sink, decoder: codecs.IncrementalDecoder,
          deadline: float) -> bool:
    """Read the pipe into ``sink`` until EOF or the exit grace; True when the deadline came."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if now >= deadline:
                return True
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at >= EXIT_GRACE_S:
                return False  # the command is done; a background holder keeps its own pipe
            wait_s = min(deadline - now, 0.05 if exited_at is None else EXIT_GRACE_S)
            if not selector.select(wait_s):
                continue
            chunk = os.read(fd, READ_CHUNK_BYTES)
            if not chunk:
                return False  # EOF: every writer is gone
            sink.write(decoder.decode(chunk))


# -- ending a process tree -------------------------------------------------------------
def end_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc``'s group, its descendants and the holders of its pipe; reap ``proc``."""
    pipe = _pipe_id(proc)
    for _ in range(3):  # a process may fork while we look: look again until nobody is left
        doomed = _descendants(proc.pid) | (_pipe_holders(pipe) if pipe else set())
        doomed.discard(os.getpid())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not doomed:
            break
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def _pipe_id(proc: subprocess.Popen[bytes]) -> str | None:
    if proc.stdout is None:
        return None
    try:
        return f"pipe:[{os.fstat(proc.stdout.fileno()).st_ino}]"
    except OSError:
        return None


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process ``/proc`` shows (empty where there is none)."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if len(fields) > 1:
                found[int(entry.name)] = int(fields[1])
    return found


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _pipe_holders(pipe: str) -> set[int]:
    """Every process with a descriptor on ``pipe`` (ours excluded by the caller)."""
    holders: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                fds = os.scandir(f"/proc/{entry.name}/fd")
            except OSError:
                continue
            with fds:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        if os.readlink(fd.path) == pipe:
                            holders.add(int(entry.name))
                            break
    return holders
