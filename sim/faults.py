"""Fault kinds, fault plans and the named sites where they strike.

Theory of operation
-------------------
A *site* names a boundary of the turn: every durable effect has one ("user",
"tool_calls", "tool_results", "final", ...) and tool execution is "tools". The sites are
the engine's own enum (``hermes_ref.effects.Site``), so a plan cannot name a site that no
effect has. A *crash
point* is a site with a side and an occurrence: ``after:tool_calls`` means "the process
dies right after the assistant tool-call row commits", ``before:final#2`` "right before
the second final-row write". The driver checks the plan before and after every effect.

Provider faults (rate limits, 5xx, timeouts, overflow, empty or dropped-call replies)
are steps of the fake provider's script, not entries here: the provider is the part of
the world that misbehaves, so its script says how.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from hermes_ref.effects import Site
from hermes_ref.errors import BadInput
from hermes_ref.models import Frozen

# Every site a durable effect or tool execution can carry, in turn order.
SITES: tuple[str, ...] = tuple(site.value for site in Site)
# The sites a store write happens at: every site but tool execution (a tool is no write).
WRITE_SITES: tuple[str, ...] = tuple(site for site in SITES if site != Site.TOOLS.value)

_POINT = re.compile(r"^(before|after):([a-z_]+)(?:#(\d+))?$")


class CrashPoint(Frozen):
    when: Literal["before", "after"]
    site: Site
    occurrence: int = 1

    @classmethod
    def parse(cls, text: str) -> CrashPoint:
        match = _POINT.match(text.strip())
        if match is None or match.group(2) not in SITES:
            raise BadInput(
                f"crash point {text!r} is not of the form before|after:<site>[#n] "
                f"with a site among {', '.join(SITES)}"
            )
        when = "before" if match.group(1) == "before" else "after"
        return cls(when=when, site=Site(match.group(2)), occurrence=int(match.group(3) or 1))

    @property
    def name(self) -> str:
        suffix = f"#{self.occurrence}" if self.occurrence != 1 else ""
        return f"{self.when}:{self.site.value}{suffix}"


class FaultPlan(Frozen):
    """What goes wrong in one run, besides the provider's script."""

    crash: CrashPoint | None = None
    crash_at_effect: int | None = None  # die before the world's n-th effect (1-based)
    fail_writes: dict[Site, int] = Field(default_factory=dict)  # site -> failing writes
    write_failure_cause: str = "injected_io_error"

    @field_validator("fail_writes", mode="before")
    @classmethod
    def _known_sites(cls, value: object) -> object:
        if isinstance(value, dict):
            unknown = sorted(str(site) for site in value if str(site) not in WRITE_SITES)
            if unknown:
                raise ValueError(f"fail_writes names site(s) {', '.join(unknown)} where nothing "
                                 f"is written; the write sites are {', '.join(WRITE_SITES)}")
        return value


class Crashed(Exception):
    """The simulated process died at a crash point (harness-level, never seen by the engine)."""

    def __init__(self, point: str) -> None:
        super().__init__(f"process crashed at {point}")
        self.point = point


class FaultState:
    """Counts site occurrences during a run and decides when a planned fault fires."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self._seen: dict[tuple[str, Site], int] = {}
        self._failed: dict[Site, int] = {}
        self.effects = 0
        # with no crash planned, the driver skips the per-effect bookkeeping entirely
        self.crashes_planned = plan.crash is not None or plan.crash_at_effect is not None

    def effect_crash_due(self) -> bool:
        """Count one more effect; True when the plan kills the process before it."""
        self.effects += 1
        return self.plan.crash_at_effect == self.effects

    def crash_due(self, when: str, site: Site) -> bool:
        key = (when, site)
        count = self._seen.get(key, 0) + 1
        self._seen[key] = count
        crash = self.plan.crash
        return crash is not None and crash.when == when and crash.site == site \
            and crash.occurrence == count

    def write_fails(self, site: Site) -> bool:
        budget = self.plan.fail_writes.get(site, 0)
        used = self._failed.get(site, 0)
        if used < budget:
            self._failed[site] = used + 1
            return True
        return False
