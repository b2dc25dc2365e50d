"""The ``hermes-ref`` command line.

    hermes-ref scenarios list
    hermes-ref scenarios run [NAME ...] [--store sqlite|memory|both] [--quiet | --verbose]
    hermes-ref invariants [--json] [--store ...]
    hermes-ref invariants verify [--json] [--store ...]
    hermes-ref bench [--json] [--quick]
    hermes-ref sim serve --script FILE [--host 127.0.0.1] [--port 0] [--journal FILE]
    hermes-ref fake-provider serve --script FILE ...   (alias; stops when the script ends)
    hermes-ref audit PATH [--schema auto|ref|hermes] [--json] [--strict]
    hermes-ref explore --seeds N | --replay SEED | --shrink SEED | --plan F | --merge R...

Exit status: 0 when everything held, 1 when a scenario failed, a sabotage went
uncaught, a served script was not consumed exactly or an audit found a violation, 2 for
bad usage or bad input (a broken script file, an unknown scenario, a busy port, a file
that is no transcript database).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from hermes_ref.errors import BadInput

STORE_CHOICES = ("sqlite", "memory", "both")


def _kinds(choice: str) -> tuple[str, ...]:
    return ("memory", "sqlite") if choice == "both" else (choice,)


def _registry() -> dict[str, Any]:
    import scenarios

    return scenarios.load_all()


def _select(names: Sequence[str]) -> list[Any]:
    registry = _registry()
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise BadInput(f"unknown scenario(s): {', '.join(unknown)} "
                       "(see 'hermes-ref scenarios list')")
    return [registry[n] for n in names] if names else list(registry.values())


def cmd_scenarios_list(args: argparse.Namespace, out: TextIO) -> int:
    for spec in _registry().values():
        out.write(f"{spec.name:<44} {spec.stage:<11} {','.join(spec.invariants)}\n")
        out.write(f"    {spec.title}\n")
    return 0


LEGEND = """\
Each timeline line is: virtual seconds since the story began, what happened, its detail.
  turn     a turn starts: session and the user's text     result   what run_turn returned
  phase    the turn moves to its next phase                exit     the turn's exit line (FIN-7)
  write    a commit to the durable store: site, row, role  call     a model call and its reply
  tool     a tool ran: segment mode, call id, outcome      sleep    a wait on the virtual clock
  resolve  where a round's path arguments land              tools    the tools offered from now on
  FAULT    a planned store failure                         CRASH    the process dies here
  restart  a new process starts on the same world          VIOLATE  a checker found a violation
  EXPECT   an expectation of the story failed              verdict  the scenario's verdict
  INTERRUPT a turn is stopped: a lost lease, or the user   redirect a correction arrives, or is taken in
  auth     a route's credentials are renewed (LOOP-5)
--verbose narrates whole texts and prints each final transcript; --quiet prints timelines
only for failures.
"""


def cmd_scenarios_run(args: argparse.Namespace, out: TextIO) -> int:
    from sim.harness import run_scenario

    failed: list[tuple[str, str, list[str]]] = []
    total = 0
    selected = _select(args.names)
    if not args.quiet:
        out.write("(timeline legend: hermes-ref scenarios run --help)\n")
    for spec in selected:
        for kind in _kinds(args.store):
            outcome = run_scenario(spec, kind, verbose=args.verbose)
            total += 1
            _report_outcome(out, spec, kind, outcome, quiet=args.quiet, verbose=args.verbose)
            if not outcome.passed:
                ids = sorted({v.invariant for v in outcome.findings}) or ["(expectation or error)"]
                failed.append((spec.name, kind, ids))
    if failed:
        out.write("failing scenarios:\n")
        for name, kind, ids in failed:
            out.write(f"  {name} [{kind}]: {', '.join(ids)}\n")
    out.write(f"{total - len(failed)} passed, {len(failed)} failed\n")
    return 1 if failed else 0


def _report_outcome(out: TextIO, spec: Any, kind: str, outcome: Any, *, quiet: bool,
                    verbose: bool) -> None:
    verdict = "PASS" if outcome.passed else "FAIL"
    out.write(f"== {verdict} {spec.name} [{kind}] {','.join(spec.invariants)}\n")
    out.write(f"   {spec.title}\n")
    if not quiet or not outcome.passed:
        out.write(outcome.timeline)
    if verbose:
        out.write("   final transcript:\n")
        out.write("".join(f"   {line}\n" for line in outcome.transcript.splitlines()))
    for violation in outcome.violations:
        out.write(f"   violation: {violation}\n")
    if outcome.error:
        out.write(f"   error: {outcome.error}\n")


def cmd_invariants(args: argparse.Namespace, out: TextIO) -> int:
    from sim.coverage import build_matrix, run_baseline, verify_all

    registry = _registry()
    kinds = _kinds(args.store)
    baseline = run_baseline(registry, kinds)
    rows = build_matrix(registry, baseline, verify_all(registry, kinds, baseline))
    if args.json:
        json.dump([r.as_json() for r in rows], out, indent=2)
        out.write("\n")
        return 0
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
        out.write(f"{row.id:<9} {row.status:<8} scenarios={len(row.scenarios):<2} "
                  f"checker={','.join(row.checker) or '-'} "
                  f"caught_by={','.join(row.sabotage_caught) or '-'}\n")
        out.write(f"    {row.text}\n")
    out.write(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "\n")
    return 0


def cmd_invariants_verify(args: argparse.Namespace, out: TextIO) -> int:
    from sim.coverage import verify_all

    verdicts = verify_all(_registry(), _kinds(args.store))
    if args.json:
        json.dump([{"sabotage": v.name, "invariants": list(v.invariants), "caught": v.caught,
                    "scenarios": v.scenarios, "failed": v.failed, "skipped": v.skipped,
                    "catches": [c.as_json() for c in v.catches],
                    "also_violated": sorted(v.collateral), "alone": v.alone,
                    "alone_to_the_end": v.whole,
                    "evidence": v.evidence}
                   for v in verdicts], out, indent=2)
        out.write("\n")
    else:
        for v in verdicts:
            _report_verdict(out, v)
    missed = [v.name for v in verdicts if not v.caught]
    caught = len(verdicts) - len(missed)
    alone, whole = sum(1 for v in verdicts if v.alone), sum(1 for v in verdicts if v.whole)
    (sys.stderr if args.json else out).write(
        f"{alone} of {len(verdicts)} go red alone (only their own ids) in some run, "
        f"{whole} in a story that ran to its end\n")
    # with --json, stdout is one JSON document; the count goes to stderr
    (sys.stderr if args.json else out).write(f"{caught} passed, {len(missed)} failed\n")
    return 1 if missed else 0


def _report_verdict(out: TextIO, v: Any) -> None:
    mark = "caught" if v.caught else "NOT CAUGHT"
    red = len({c.scenario for c in v.catches})
    out.write(f"{mark:<11} {v.name:<34} {','.join(v.invariants):<10} "
              f"{red}/{len(v.scenarios)} scenarios red under its id\n")
    out.write(f"    {v.description}\n")
    first = v.first_catch
    if first is not None:
        out.write(f"    by {first.checker} in {first.scenario}[{first.store}]: {first.violation}\n")
    elif v.evidence:
        out.write(f"    {v.evidence}\n")
    if v.collateral:
        out.write(f"    also violated: {', '.join(sorted(v.collateral))}\n")
    if v.caught and not v.alone:
        out.write("    never alone: every run that catches it breaks other ids too\n")
    if v.skipped:
        out.write(f"    not counted (red without the sabotage): {', '.join(v.skipped)}\n")


def cmd_bench(args: argparse.Namespace, out: TextIO) -> int:
    from sim.bench import main as bench_main

    return bench_main(quick=args.quick, as_json=args.json, out=out)


def cmd_fake_provider_serve(args: argparse.Namespace, out: TextIO) -> int:
    from sim.serve.cli import main as serve_main

    return serve_main(args, out)


def cmd_audit(args: argparse.Namespace, out: TextIO) -> int:
    from sim.audit.cli import main as audit_main

    return audit_main(args, out)


def cmd_explore(args: argparse.Namespace, out: TextIO) -> int:
    from sim.explore.cli import main as explore_main

    return explore_main(args, out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hermes-ref", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    scen = sub.add_parser("scenarios", help="list or run the executable scenarios")
    scen_sub = scen.add_subparsers(dest="action", required=True)
    scen_sub.add_parser("list", help="every scenario with its stage and invariant ids")
    run = scen_sub.add_parser("run", help="run scenarios with a narrated timeline",
                              epilog=LEGEND, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("names", nargs="*", help="scenario names (default: all)")
    run.add_argument("--store", choices=STORE_CHOICES, default="sqlite")
    shown = run.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="timelines only for failures")
    shown.add_argument("--verbose", action="store_true",
                       help="whole texts in the timeline, and each final transcript")

    inv = sub.add_parser("invariants", help="the coverage matrix of the invariant catalog")
    inv.add_argument("action", nargs="?", choices=("verify",),
                     help="verify: run every sabotage and demand that it is caught")
    inv.add_argument("--json", action="store_true")
    inv.add_argument("--store", choices=STORE_CHOICES, default="both")

    bench = sub.add_parser("bench", help="throughput and scaling benchmarks")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")

    from sim.audit.cli import add_arguments as audit_arguments
    from sim.serve.cli import add_arguments as serve_arguments

    fake = sub.add_parser("fake-provider", help="alias of 'sim serve' (stops when the script ends)")
    serve_arguments(fake.add_subparsers(dest="action", required=True).add_parser(
        "serve", help="serve a script on 127.0.0.1"), alias=True)
    simulator = sub.add_parser("sim", help="the served simulator for any OpenAI-compatible agent")
    serve_arguments(simulator.add_subparsers(dest="action", required=True).add_parser(
        "serve", help="serve a fault script as a chat-completions server on 127.0.0.1"))
    audit_arguments(sub.add_parser("audit", help="check a transcript database's durable record"))
    from sim.explore.cli import add_arguments as explore_arguments

    explore_arguments(sub.add_parser(
        "explore", help="seeded swarm runs: sweep, replay, shrink (docs/explore.md)",
        formatter_class=argparse.RawDescriptionHelpFormatter))
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    stream = out or sys.stdout
    handlers = {
        ("scenarios", "list"): cmd_scenarios_list,
        ("scenarios", "run"): cmd_scenarios_run,
        ("invariants", None): cmd_invariants,
        ("invariants", "verify"): cmd_invariants_verify,
        ("bench", None): cmd_bench,
        ("fake-provider", "serve"): cmd_fake_provider_serve,
        ("sim", "serve"): cmd_fake_provider_serve,
        ("audit", None): cmd_audit,
        ("explore", None): cmd_explore,
    }
    key = (args.command, getattr(args, "action", None))
    try:
        return handlers[key](args, stream)
    except BadInput as error:
        sys.stderr.write(f"hermes-ref: {error}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
