"""``hermes-ref sim serve`` (alias ``fake-provider serve``): serve a script until told to stop.

Theory of operation
-------------------
The command validates the script and the journal path, binds (loopback by default), and
prints one line naming the URL. It then serves until SIGINT or SIGTERM, or, with
``--exit-when-consumed``, until no step is left and no request has come for
``--linger`` seconds (so an agent's last retries still meet a server, not "connection
refused"). Handlers for both signals are installed explicitly: a shell that starts a job
in the background sets SIGINT to "ignore", which Python would otherwise keep.

On stopping it prints the summary: the requests served, the steps consumed, the steps
never used, the requests that came past the end, and the harness errors. The exit code
says whether the script was consumed exactly: 0 yes, 1 no, 2 for bad input (a script
that does not validate, a journal path that cannot be used, a port or host that cannot be
bound), each a one-line error with nothing written.

The alias ``fake-provider serve`` keeps its old default: it stops when the script is used
up unless ``--keep`` is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from hermes_ref.errors import BadInput
from sim.serve import script as script_file
from sim.serve.cursor import Report
from sim.serve.journal import Journal, open_journal
from sim.serve.server import Simulator, start


def add_arguments(parser: argparse.ArgumentParser, *, alias: bool = False) -> None:
    parser.add_argument("--script", required=True, help="the script file (docs/test-your-own-agent.md)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", default="0", help="port (default 0: any free port)")
    parser.add_argument("--journal", help="write a JSONL record of every request to this new file")
    parser.add_argument("--seed", help="the seed of ids (overrides the script's 'seed')")
    if alias:
        parser.add_argument("--keep", action="store_true", help="keep serving after the script ends")
    else:
        parser.add_argument("--exit-when-consumed", action="store_true",
                            help="stop once every step is used and no request came for --linger s")
    stops = "without --keep" if alias else "with --exit-when-consumed"
    parser.add_argument("--linger", type=float, default=1.0, metavar="S",
                        help=f"{stops}: quiet seconds before stopping (default 1)")


def _port(text: str) -> int:
    """A port from the command line; ``BadInput`` (one line, exit 2) when it is not a number."""
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"--port {text!r} is not a port number (0 to 65535)") from None


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise BadInput(f"--seed {text!r} is not a non-negative integer")
    return value


def main(args: argparse.Namespace, out: TextIO) -> int:
    """Run the command; ``BadInput`` propagates to the caller's one-line error."""
    port = _port(args.port)
    script = script_file.load(args.script)
    if getattr(args, "seed", None) is not None:
        script = dataclasses.replace(script, seed=_seed(args.seed))
    journal = Journal(open_journal(args.journal)) if args.journal else Journal(None)
    simulator = Simulator(script, journal)
    stop = threading.Event()
    restore = _on_signals(stop)  # before the URL is printed: a signal may follow it at once
    try:
        server = start(simulator, args.host, port)
    except BaseException:
        restore()
        _discard_journal(journal, args.journal)
        raise
    steps = sum(len(r.steps) for r in script.routes)
    out.write(f"sim serve: serving {steps} scripted step(s) at {server.url}\n")
    out.flush()
    exit_when_consumed = getattr(args, "exit_when_consumed", False) or (
        hasattr(args, "keep") and not args.keep)
    try:
        while not stop.wait(0.05):
            if exit_when_consumed and simulator.cursor.remaining == 0 and (
                    simulator.idle_s() >= args.linger):
                break
    finally:
        restore()
        server.stop()
        journal.close()
    report = simulator.cursor.report()
    out.write(summary(report, simulator.harness_errors))
    for error in simulator.harness_errors:
        sys.stderr.write(f"hermes-ref: sim serve: {error}\n")
    return 0 if report.exact and not simulator.harness_errors else 1


def _discard_journal(journal: Journal, path: str | None) -> None:
    """Remove the journal this run created (and left empty) when the bind failed."""
    import os

    journal.close()
    if path and os.path.exists(path) and os.path.getsize(path) == 0:
        os.remove(path)


def _on_signals(stop: threading.Event) -> Callable[[], None]:
    """Set ``stop`` on SIGINT and SIGTERM; returns a function that restores the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # only the main thread may install handlers (tests run here)
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def summary(report: Report, harness_errors: list[str]) -> str:
    """The closing lines: requests, consumed and unused steps, overflow, verdict."""
    past = ", ".join(f"{route}: {n}" for route, n in report.overflow.items()) or "none"
    verdict = "script consumed exactly" if report.exact and not harness_errors else (
        "script NOT consumed exactly")
    return (f"sim serve: {report.requests} request(s) answered\n"
            f"  consumed: {', '.join(report.consumed) or 'none'}\n"
            f"  unused: {', '.join(report.unused) or 'none'}\n"
            f"  past the end: {past}\n"
            f"  harness errors: {len(harness_errors)}\n"
            f"sim serve done: {verdict}\n")
