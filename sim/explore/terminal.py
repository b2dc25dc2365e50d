"""The terminal: turns a user runs on a process directly, beside the door's queue.

A session the door does not serve (``t-1``, nobody bound to it) is driven from a terminal:
its turns go straight to a process (``Story.start_turn``), one after another 0.2-10 s
apart, from whichever process the user's terminal is attached to, so two of them often
ask for the session's lease at once and the lease decides who runs (LEASE-1, LEASE-3,
LEASE-5). Some read the session's build log, which a slow disk takes 5-60 s to serve, and
in two of these worlds in five the lease wait is short (3-120 s): a turn that finds the
session busy that long is refused and hands its message back. Most turns bring recalled notes, a
memory prefetch injected into the API copy of the user row only (WIRE-1), which later
turns replay. One user in two pastes a card number into a turn (not the last), and an
operator redacts it from the stored row before the last turn begins (WIRE-2), asking again
while a turn holds the lease: the row is then sent as its new text.

Each part is drawn from its own sub-stream (``terminal``) and is plain plan data: ``Direct``
and ``Redact`` steps, the session, the lease wait and the build log's read time.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from hermes_ref.lease import holder_identity
from hermes_ref.models import Frozen, Role
from sim.world import RewriteRun

if TYPE_CHECKING:
    from sim.harness import Story
    from sim.processes import ProcessHandle

TERMINAL = "t-1"
SECRET = "My card is 4417 2210 9932 0071."
MEMORIES = (
    "memory: the user keeps the quarterly figures in notes-1.txt and prefers short answers",
    "memory: last week the user asked for every change to be written to its own file",
    "memory: the build log is long; the user wants only its last line",
    "memory: the user signs notes as Ana and works from the Lisbon office",
)


class Direct(Frozen):
    """A turn the user runs from a terminal on ``process``, not through the door."""

    op: Literal["direct"] = "direct"
    at_s: float = Field(ge=0)
    process: int = Field(ge=0)
    session: str
    text: str
    memory: str | None = None  # recalled notes injected into the API copy only (WIRE-1)


class Redact(Frozen):
    """An operator cuts ``secret`` out of the session's latest user row holding it."""

    op: Literal["redact"] = "redact"
    at_s: float = Field(ge=0)
    session: str
    secret: str


def build_log(session: str) -> str:
    return f"{session}-build.log"


def draw_terminal(rng: random.Random, processes: int, files: list[str]
                  ) -> tuple[list[Direct | Redact], tuple[str, ...], float | None, float | None]:
    """The terminal's turns and redaction, its sessions, the lease wait and the log's read
    time; nothing in a world without a terminal (a bit more than half of them)."""
    if rng.random() >= 0.45:
        return [], (), None, None
    session, count = TERMINAL, rng.randint(3, 6)
    pasted = rng.randint(1, count - 1) if rng.random() < 0.5 else None  # a later turn follows
    at = round(rng.uniform(0.0, 120.0), 1)
    steps: list[Direct | Redact] = []
    for n in range(1, count + 1):
        text = f"Say hello {n}. {SECRET}" if n == pasted else turn_text(rng, session, n, files)
        memory = rng.choice(MEMORIES) if rng.random() < 0.7 else None
        steps.append(Direct(at_s=at, process=rng.randrange(processes), session=session,
                            text=text, memory=memory))
        at = round(at + rng.uniform(0.2, 10.0), 1)
    if pasted is not None:  # redacted before the last turn begins, which then replays the row
        first, last = steps[pasted - 1].at_s, steps[-1].at_s
        steps.append(Redact(at_s=round(rng.uniform(first + 0.5, max(first + 0.5, last)), 1),
                            session=session, secret=SECRET))
    wait = rng.choice((3.0, 10.0, 30.0, 120.0)) if rng.random() < 0.4 else None
    return steps, (session,), wait, rng.choice((5.0, 20.0, 60.0))


def turn_text(rng: random.Random, session: str, n: int, files: list[str]) -> str:
    """What the terminal's user asks in turn ``n``: the build log, a notes file, a note to
    write, or a hello."""
    pick = rng.random()
    if pick < 0.4:
        return f"Read {build_log(session)}."
    if pick < 0.55 and files:
        return f"Read {rng.choice(files)}."
    if pick < 0.75:
        return f"Write note {n} to {session}-out-{n}.txt."
    return f"Say hello {n}."


def stage_terminal(story: Story, terminals: tuple[str, ...], lease_wait_s: float | None,
                   build_log_s: float | None) -> None:
    """The terminal's limits and files (before the processes start: each takes the limits)."""
    if lease_wait_s is not None:
        story.limits(lease_wait_s_max=lease_wait_s)
    for session in terminals:
        story.files({build_log(session): f"build of {session}: ok"})
        if build_log_s is not None:
            story.world.tools.slow("read_file", build_log_s, path=build_log(session))


def stage_step(story: Story, step: object, handles: list[ProcessHandle]) -> bool:
    """Hand a terminal step out; False when ``step`` is none of them."""
    if isinstance(step, Direct):
        story.start_turn(step.text, session=step.session, process=handles[step.process],
                         after_s=step.at_s, injected=step.memory)
    elif isinstance(step, Redact):
        redact_later(story, step.secret, after_s=step.at_s, session=step.session)
    else:
        return False
    return True


REDACT_RETRY_S, REDACT_TRIES = 5.0, 12  # a busy session: the operator's tool asks again


def redact_later(story: Story, secret: str, *, after_s: float, session: str) -> None:
    """``after_s`` from now an operator cuts ``secret`` from the session's latest user row
    that holds it: under the session's lease, taken as a turn takes it, through the store's
    fenced rewrite. While no row holds it yet, or a turn holds the lease, the operator's
    tool asks again every 5 s, a minute at most."""
    world = story.world
    tries = [REDACT_TRIES]

    def again(why: str) -> None:
        tries[0] -= 1
        world.timeline.add("redact", f"{session}: {why}" + (
            f", asks again in {REDACT_RETRY_S:g} s" if tries[0] else ", nothing redacted"))
        if tries[0]:
            world.scheduler.at(world.clock.now() + REDACT_RETRY_S, fire)

    def fire() -> None:
        live = live_session(story, session)
        rows = [m for m in world.store.snapshot().transcript(live)
                if m.role is Role.USER and secret in (m.content or "")]
        if not rows or rows[-1].row_id is None:
            return again("no stored row holds it yet")
        row, now = rows[-1], world.clock.now()
        holder = holder_identity(world.holder, "redaction", "cli")
        lease = world.store.acquire_lease(session, holder, now, story.engine.limits.lease_ttl_s)
        if lease is None:
            return again("a turn holds the lease")
        content = (row.content or "").replace(secret, "").strip()
        seq = world.effects_performed
        world.store.rewrite_message(lease.session_id, lease.token, row.row_id or 0, content)
        world.store.release_lease(lease)
        world.runs.append(RewriteRun(lease.session_id, content, None, False,
                                     row_id=row.row_id or 0, seq=seq, was=row,
                                     watermark=world.store.watermark()))
        world.timeline.add("rewrite", f"#{row.row_id} -> {content[:40]!r} (lease token "
                                      f"{lease.token})")
    world.scheduler.at(world.clock.now() + after_s, fire)


def live_session(story: Story, session: str) -> str:
    """The session a turn of ``session`` acts on now: the tip of its compression lineage
    (CMP-5). The lease is the tip's, and the rows the next turn sends are the tip's, so the
    operator's tool redacts there; a rotated-away parent takes no more writes."""
    tip = story.world.store.compression_tip(session)
    return tip.id if tip is not None else session


def render_options(terminals: tuple[str, ...], lease_wait_s: float | None,
                   build_log_s: float | None) -> list[str]:
    """``stage_terminal``'s calls as scenario lines."""
    lines = [f"s.limits(lease_wait_s_max={lease_wait_s!r})"] if lease_wait_s is not None else []
    for session in terminals:
        lines.append(f"s.files({{{build_log(session)!r}: {f'build of {session}: ok'!r}}})")
        if build_log_s is not None:
            lines.append(f"s.world.tools.slow('read_file', {build_log_s!r}, "
                         f"path={build_log(session)!r})")
    return lines


def render_step(step: object, names: tuple[str, ...]) -> str | None:
    """A terminal step as a scenario line; None when ``step`` is none of them."""
    if isinstance(step, Direct):
        notes = f", injected={step.memory!r}" if step.memory is not None else ""
        return (f"s.start_turn({step.text!r}, session={step.session!r}, "
                f"process={names[step.process]}, after_s={step.at_s!r}{notes})")
    if isinstance(step, Redact):
        return f"redact_later(s, {step.secret!r}, after_s={step.at_s!r}, session={step.session!r})"
    return None
