"""The kill-rate table of a mutation run, per module, read from mutmut's own records.

Theory of operation
-------------------
``nox -s mutants`` runs mutmut 3 over the engine core. For every source file it mutated,
mutmut keeps a JSON record ``mutants/<path>.meta`` whose ``exit_code_by_key`` maps each
mutant's name (``hermes_ref.loop.x_run_loop__mutmut_7``) to the exit code of the tests
run against it, or null when it was not run. This module turns those codes into verdicts
exactly as mutmut 3 does (``mutmut.stats.status_by_exit_code``), counts them per module
and prints the table; nothing in it is typed in by hand.

A mutant is *detected* when a test failed (``killed``), the tests hung (``timeout``) or
the type checker refused it. The kill rate is detected over judged (every mutant with a
verdict, less the skipped ones). A surviving mutant that ``docs/mutation.md`` declares
equivalent (a change no input can observe) is listed apart: the second rate leaves those
out. A declared mutant that is in fact killed is reported as a stale declaration, so the
list cannot quietly outlive the code it describes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

# The turn's decision modules: every surviving mutant in these is killed or declared.
DECISION_MODULES = ("prologue", "loop", "tool_round", "finalizer", "closure", "preflight",
                    "transcript")
PACKAGE = "hermes_ref"
EQUIVALENTS_HEADING = "## Equivalent mutants"
_MUTANT_NAME = re.compile(r"`(hermes_ref\.[^`\s]+__mutmut_\d+)`")

# mutmut 3's exit code -> verdict table (mutmut/stats.py); any other code is "suspicious".
_VERDICT_BY_CODE: dict[int | None, str] = {
    1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 2: "interrupted",
    None: "not checked", 34: "skipped", 35: "suspicious", 36: "timeout", 37: "type check",
    -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault",
    -9: "segfault",
}
DETECTED = frozenset({"killed", "timeout", "type check"})
UNJUDGED = frozenset({"not checked", "skipped", "interrupted"})
UNDETECTED = frozenset({"survived", "no tests", "suspicious", "segfault"})  # judged, not detected


def verdict(exit_code: int | None) -> str:
    """mutmut's verdict for one mutant's exit code."""
    return _VERDICT_BY_CODE.get(exit_code, "suspicious")


@dataclass
class ModuleFigures:
    """The verdicts of one module's mutants."""

    module: str
    verdicts: dict[str, str] = field(default_factory=dict)  # mutant name -> verdict
    equivalent: set[str] = field(default_factory=set)       # declared and undetected

    def count(self, *names: str) -> int:
        return sum(1 for v in self.verdicts.values() if v in names)

    @property
    def generated(self) -> int:
        return len(self.verdicts)

    @property
    def detected(self) -> int:
        return self.count(*DETECTED)

    @property
    def judged(self) -> int:
        return self.generated - self.count(*UNJUDGED)

    @property
    def other(self) -> int:
        """Verdicts that are none of killed, survived, timeout and no tests."""
        return self.generated - self.count("killed", "survived", "timeout", "no tests")

    def survivors(self) -> list[str]:
        """Undetected mutants (survived, no tests, ...) not declared equivalent, by name."""
        return sorted(n for n, v in self.verdicts.items()
                      if v in UNDETECTED and n not in self.equivalent)

    def rate(self) -> float | None:
        return self.detected / self.judged if self.judged else None

    def rate_non_equivalent(self) -> float | None:
        judged = self.judged - len(self.equivalent)
        return self.detected / judged if judged > 0 else None


def module_of(meta: Path, mutants: Path) -> str:
    """``mutants/hermes_ref/loop.py.meta`` -> ``hermes_ref.loop``."""
    relative = meta.relative_to(mutants).as_posix().removesuffix(".py.meta")
    return relative.replace("/", ".")


def load(mutants: Path, equivalents: Iterable[str] = ()) -> list[ModuleFigures]:
    """Figures of every mutated module of the package, in module order."""
    declared = set(equivalents)
    figures: list[ModuleFigures] = []
    for meta in sorted((mutants / PACKAGE).rglob("*.py.meta")):
        codes: Mapping[str, int | None] = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
        if not codes:
            continue
        module = ModuleFigures(module_of(meta, mutants))
        module.verdicts = {name: verdict(code) for name, code in codes.items()}
        module.equivalent = {n for n in declared if module.verdicts.get(n) in UNDETECTED}
        figures.append(module)
    return figures


def declared_equivalents(doc: Path) -> list[str]:
    """Mutant names quoted in the doc's equivalent-mutants section (empty if none)."""
    if not doc.exists():
        return []
    names: list[str] = []
    inside = False
    for line in doc.read_text("utf-8").splitlines():
        if line.startswith("## "):
            inside = line.strip() == EQUIVALENTS_HEADING
        elif inside:
            names.extend(_MUTANT_NAME.findall(line))
    return names


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _total(figures: Sequence[ModuleFigures], name: str) -> ModuleFigures:
    total = ModuleFigures(name)
    for module in figures:
        total.verdicts.update(module.verdicts)
        total.equivalent |= module.equivalent
    return total


COLUMNS = ("module", "generated", "killed", "survived", "timeout", "no tests", "other",
           "equivalent", "kill rate", "non-equivalent")


def rows(figures: Sequence[ModuleFigures]) -> list[tuple[str, ...]]:
    """One row per module, then totals for the decision modules and for all of them."""
    decision = [f for f in figures if f.module.split(".")[-1] in DECISION_MODULES]
    table = [*figures, _total(decision, "decision modules"), _total(figures, "all modules")]
    return [(f.module, str(f.generated), str(f.count("killed")), str(f.count("survived")),
             str(f.count("timeout")), str(f.count("no tests")), str(f.other),
             str(len(f.equivalent)), _percent(f.rate()), _percent(f.rate_non_equivalent()))
            for f in table]


def render(figures: Sequence[ModuleFigures], *, markdown: bool = False) -> str:
    """The table as aligned text, or as a Markdown table for docs/mutation.md."""
    body = rows(figures)
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in (COLUMNS, *body)) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
                     for row in (COLUMNS, *body))


def report(mutants: Path, doc: Path, out: TextIO, *, markdown: bool = False,
           survivors: bool = False) -> int:
    """Print the table (and optionally the undeclared survivors); 1 when there is no run."""
    declared = declared_equivalents(doc)
    figures = load(mutants, declared)
    if not figures:
        print(f"no mutation results under {mutants}/ (run 'nox -s mutants' first)", file=out)
        return 1
    print(render(figures, markdown=markdown), file=out)
    verdicts = {n: v for f in figures for n, v in f.verdicts.items()}
    stale = sorted(n for n in declared if verdicts.get(n, "survived") not in UNDETECTED)
    unknown = sorted(n for n in declared if n not in verdicts)
    if stale:
        print("\ndeclared equivalent but detected (update docs/mutation.md):", file=out)
        print("\n".join(f"  {n}: {verdicts[n]}" for n in stale), file=out)
    if unknown:
        print("\ndeclared equivalent but not generated (the code changed: renumber them):", file=out)
        print("\n".join(f"  {n}" for n in unknown), file=out)
    if survivors:
        print("\nundetected and not declared equivalent:", file=out)
        for name in (n for module in figures for n in module.survivors()):
            print(f"  {name}", file=out)
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.mutation_report",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mutants", type=Path, default=Path("mutants"),
                        help="mutmut's working folder (default: mutants)")
    parser.add_argument("--equivalents", type=Path, default=Path("docs/mutation.md"),
                        help="the doc whose equivalent-mutants section is read")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--survivors", action="store_true",
                        help="also list the undetected mutants not declared equivalent")
    args = parser.parse_args(argv)
    return report(args.mutants, args.equivalents, out or sys.stdout, markdown=args.markdown,
                  survivors=args.survivors)


if __name__ == "__main__":
    raise SystemExit(main())
