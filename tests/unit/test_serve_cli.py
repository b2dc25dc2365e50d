"""'hermes-ref sim serve' as a command: bad input, signals, the summary and its exit code."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sim.serve import script as script_file

USER = {"role": "user", "content": "hi"}


def command(*args: str, ignore_sigint: bool = False) -> subprocess.Popen[str]:
    def background() -> None:  # what a shell does to a job started with '&'
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen([sys.executable, "-m", "sim.cli", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=background if ignore_sigint else None)


def url_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert " at http" in line, line
    return line.rsplit(" at ", 1)[1].strip()


@pytest.fixture
def two_steps(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"text": "one"}, {"text": "two"}]))
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_it_with_the_summary(two_steps: Path, tmp_path: Path, sig: int) -> None:
    """SIGINT (even in a background job) and SIGTERM stop it with the summary and exit 1."""
    journal = tmp_path / "journal.jsonl"
    proc = command("sim", "serve", "--script", str(two_steps), "--journal", str(journal),
                   ignore_sigint=False)
    url = url_of(proc)
    httpx.post(f"{url}/chat/completions", json={"model": "m", "messages": [USER]})
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "consumed: main[0]" in out and "unused: main[1]" in out
    assert "NOT consumed exactly" in out and "Traceback" not in err
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [r["step"] for r in records] == ["main[0]"]
    assert records[0]["body"]["messages"] == [USER] and records[0]["status"] == 200


def test_sigint_works_in_a_background_job(two_steps: Path) -> None:
    """A job whose SIGINT the shell set to 'ignore' still stops on SIGINT."""
    proc = command("sim", "serve", "--script", str(two_steps), ignore_sigint=True)
    url_of(proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    assert "sim serve done" in out


def test_exit_when_consumed_lingers_then_exits_zero(two_steps: Path) -> None:
    """With --exit-when-consumed it stops after the last step and a quiet spell, exit 0."""
    proc = command("sim", "serve", "--script", str(two_steps), "--exit-when-consumed",
                   "--linger", "0.3")
    url = url_of(proc)
    for _ in range(2):
        assert httpx.post(f"{url}/chat/completions",
                          json={"model": "m", "messages": [USER]}).status_code == 200
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "script consumed exactly" in out


def run_bad(*args: str) -> tuple[int, str]:
    proc = command(*args)
    _, err = proc.communicate(timeout=20)
    return proc.returncode, err


def test_bad_input_is_one_line_and_exit_2(two_steps: Path, tmp_path: Path) -> None:
    """A busy port, a bad port, a bad host, a bad journal path or script: one line, exit 2."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        existing = tmp_path / "existing.jsonl"
        existing.write_text("keep me\n")
        bad_script = tmp_path / "bad.json"
        bad_script.write_text('[{"text": 5}]')
        cases = {
            "the port is busy": ["--port", port],
            "out of range": ["--port", "70000"],
            "not a port number": ["--port", "eighty"],
            "not a non-negative integer": ["--seed", "-3"],
            "not a known host": ["--host", "no-such-host.invalid"],
            "not an address of this machine": ["--host", "192.0.2.1"],
            "does not exist": ["--journal", str(tmp_path / "missing" / "j.jsonl")],
            "already exists": ["--journal", str(existing)],
        }
        for says, extra in cases.items():
            code, err = run_bad("sim", "serve", "--script", str(two_steps), *extra)
            assert (code, err.count("\n")) == (2, 1), err
            assert says in err and "Traceback" not in err
        code, err = run_bad("sim", "serve", "--script", str(bad_script))
        assert code == 2 and "must be strings" in err
    assert existing.read_text() == "keep me\n"
    assert not (tmp_path / "missing").exists()


def test_every_fixture_script_validates() -> None:
    """The example scripts in fixtures/scripts are valid served scripts."""
    folder = Path(__file__).resolve().parents[2] / "fixtures" / "scripts"
    for path in sorted(folder.glob("*.json")):
        assert script_file.load(path).main.steps, path


@pytest.mark.parametrize(("raw", "says"), [
    ({"steps": [{"error": "nope"}]}, "unknown error 'nope'"),
    ({"steps": [{"text": "x", "repeat": 0}]}, "'repeat' must be an integer of at least 1"),
    ({"steps": [{"text": "x", "stall_s": -1}]}, "non-negative number"),
    ({"steps": [{"error": "http"}]}, "needs a 'status'"),
    ({"routes": [{"match": {"tools": "yes"}}]}, "match.tools must be true or false"),
    ({"steps": [], "surprise": 1}, "unknown key(s) ['surprise']"),
    ({"steps": [{"text": "x", "fault": "shared_id"}]}, "unknown fault 'shared_id'"),
])
def test_script_errors_name_the_step_and_key(raw: object, says: str) -> None:
    """Each script error names what is wrong, and where."""
    with pytest.raises(Exception) as caught:
        script_file.parse(raw, "s.json")
    assert says in str(caught.value) and "s.json" in str(caught.value)


def test_the_old_alias_still_stops_when_the_script_ends(two_steps: Path) -> None:
    """'fake-provider serve' keeps its default: it exits once the script is used up."""
    proc = command("fake-provider", "serve", "--script", str(two_steps))
    url = url_of(proc)
    for _ in range(2):
        httpx.post(f"{url}/chat/completions", json={"model": "m", "messages": [USER]})
    proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert os.path.exists(two_steps)
