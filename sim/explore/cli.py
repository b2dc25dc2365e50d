"""``hermes-ref explore``: sweep seeds, replay one, shrink a failure, merge shard reports.

    hermes-ref explore --seeds N [--seed-start S] [--workers W] [--shard K/M]
                       [--faults PLAN] [--check-determinism] [--json]
    hermes-ref explore --replay SEED [--faults PLAN] [--html FILE] [--store memory|sqlite]
    hermes-ref explore --plan FILE [--html FILE]            (a plan written by --shrink)
    hermes-ref explore --shrink SEED [--faults PLAN] [--write-scenario FILE] [--write-plan FILE]
    hermes-ref explore --merge REPORT.json ...              (the shards of one sweep)
    hermes-ref explore --hunt [NAME ...] [--hunt-seeds N] [--seed-start S] [--workers W]
                                                          (find each sabotage blind)

Exit status: 0 passed; 1 a safety violation; 3 a liveness violation (an admission left
unfinished after the calm phase); 4 an engine crash; 5 a seed that did not replay the same
way twice (``--check-determinism``); 6 a declared fault kind that never fired; 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from hermes_ref.errors import BadInput
from sim.explore.plan import FaultMix, WorldPlan, generate, load_plan
from sim.explore.run import EXIT_CODES, RunReport, run_plan

if TYPE_CHECKING:
    from sim.explore.hunt import Hunt


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--seeds", type=int, metavar="N", help="sweep N seeds")
    parser.add_argument("--hunt-seeds", type=int, default=1000, metavar="N",
                        help="with --hunt: seeds to try per sabotage (default 1000)")
    what.add_argument("--replay", type=int, metavar="SEED", help="run one seed, narrated")
    what.add_argument("--plan", metavar="FILE", help="run a plan file, narrated")
    what.add_argument("--shrink", type=int, metavar="SEED", help="shrink a failing seed")
    what.add_argument("--merge", nargs="+", metavar="REPORT", help="merge shard reports")
    what.add_argument("--hunt", nargs="*", metavar="SABOTAGE",
                      help="sweep under each sabotage (all by default) until a seed fails")
    parser.add_argument("--seed-start", type=int, default=0, metavar="S")
    parser.add_argument("--workers", type=int, default=1, metavar="W",
                        help="worker processes (at most the machine's cores)")
    parser.add_argument("--shard", metavar="K/M", help="run the K-th of M slices of the seeds")
    parser.add_argument("--faults", metavar="PLAN",
                        help="fault kinds to draw: all (default; every kind but the opt-in "
                             "verify_gate), none, or a comma list (all,verify_gate adds it)")
    parser.add_argument("--check-determinism", action="store_true",
                        help="run every seed twice and compare the hashed records")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--html", metavar="FILE", help="also write a swimlane picture")
    parser.add_argument("--write-scenario", metavar="FILE", help="the shrunk run as a scenario")
    parser.add_argument("--write-plan", metavar="FILE", help="the shrunk plan as JSON")
    parser.add_argument("--json", action="store_true")


def main(args: argparse.Namespace, out: TextIO) -> int:
    mix = FaultMix.parse(args.faults)
    if args.seeds is not None:
        return _sweep(args, mix, out)
    if args.merge is not None:
        return _merge(args.merge, out)
    if args.hunt is not None:
        return _hunt(args, mix, out)
    if args.shrink is not None:
        return _shrink(args, mix, out)
    plan = generate(args.replay, mix) if args.replay is not None else _read_plan(args.plan)
    return _replay(plan, args, out)


def _sweep(args: argparse.Namespace, mix: FaultMix, out: TextIO) -> int:
    from sim.explore.sweep import Shard, sweep

    if args.seeds < 0:
        raise BadInput("--seeds must be 0 or more")
    report = sweep(args.seed_start, args.seeds, mix=mix, workers=args.workers,
                   shard=Shard.parse(args.shard), check_determinism=args.check_determinism)
    data = report.as_json()
    if args.json:
        out.write(json.dumps(data, indent=2) + "\n")
        return report.exit_code
    out.write(f"{data['seeds']} seeds ({data['first_seed']}..{data['last_seed']}), "
              f"{data['passed']} passed, {len(report.failures)} failed, "
              f"{data['seeds_per_s']} seeds/s on {report.workers} worker(s)\n")
    for failure in report.failures:
        first = (failure["violations"] or failure["stuck"] or failure["error"] or [""])[0]
        out.write(f"  seed {failure['seed']}: {failure['verdict']} {first}\n")
        out.write(f"      replay: hermes-ref explore --replay {failure['seed']}"
                  f"{' --faults ' + args.faults if args.faults else ''}\n")
    for entry in report.nondeterministic:
        out.write(f"  seed {entry['seed']}: not deterministic, {entry['first_difference']}\n")
    fired = ", ".join(f"{k} {n}" for k, n in sorted(report.fired.items())) or "none"
    out.write(f"faults fired: {fired}\n")
    out.write(f"crash points fired: {len(report.crash_points)} distinct\n")
    if report.unfired:
        out.write(f"declared but never fired: {', '.join(report.unfired)}\n")
    return report.exit_code


def _merge(paths: list[str], out: TextIO) -> int:
    from sim.explore.sweep import merge

    reports = []
    for path in paths:
        try:
            reports.append(json.loads(Path(path).read_text(encoding="utf-8")))
        except OSError as error:
            raise BadInput(f"{path}: cannot read it ({error.strerror})") from error
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise BadInput(f"{path}: not a JSON report ({error})") from error
        if not isinstance(reports[-1], dict):
            raise BadInput(f"{path}: not a sweep report (its JSON is not an object)")
    merged = merge(reports)
    out.write(json.dumps(merged, indent=2) + "\n")
    return int(merged["exit_code"])


def _read_plan(path: str) -> WorldPlan:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise BadInput(f"{path}: cannot read it ({error.strerror})") from error
    except UnicodeDecodeError as error:
        raise BadInput(f"{path}: not UTF-8 text") from error
    return load_plan(text, where=path)


def _replay(plan: WorldPlan, args: argparse.Namespace, out: TextIO) -> int:
    report = run_plan(plan, store_kind=args.store, trace=True)
    if args.html:
        from sim.explore.swimlane import write_html

        write_html(Path(args.html), plan, report)
    if args.json:
        out.write(json.dumps(report.as_json(), indent=2) + "\n")
    else:
        out.write(report.timeline)
        _verdict(report, out)
    return EXIT_CODES[report.verdict]


def _verdict(report: RunReport, out: TextIO) -> None:
    out.write(f"seed {report.seed}: {report.verdict.value}; "
              f"faults fired: {', '.join(sorted(k.value for k in report.fired)) or 'none'}\n")
    for line in report.violations:
        out.write(f"  {line}\n")
    for line in report.stuck:
        out.write(f"  not terminal: {line}\n")
    if report.error:
        out.write(f"  {report.error.splitlines()[0]}\n")


def _shrink(args: argparse.Namespace, mix: FaultMix, out: TextIO) -> int:
    from sim.explore.render import render
    from sim.explore.shrink import shrink

    plan = generate(args.shrink, mix)
    try:
        done = shrink(plan)
    except ValueError as error:
        raise BadInput(str(error)) from error
    sizes = ("processes", "sessions", "turns", "faults", "steps")
    was = ", ".join(f"{n} {k}" for k, n in zip(sizes, plan.size, strict=True))
    now = ", ".join(f"{n} {k}" for k, n in zip(sizes, done.plan.size, strict=True))
    out.write(f"seed {plan.seed}: {done.report.verdict.value}, shrunk in {done.runs} runs\n"
              f"  from {was}\n  to   {now}\n")
    for line in done.report.violations[:3]:
        out.write(f"  {line}\n")
    if args.write_plan:
        Path(args.write_plan).write_text(done.plan.model_dump_json(indent=2) + "\n",
                                         encoding="utf-8")
    source = render(done.plan, done.report)
    if args.write_scenario:
        Path(args.write_scenario).write_text(source, encoding="utf-8")
        out.write(f"scenario written to {args.write_scenario}\n")
    else:
        out.write("\n" + source)
    return EXIT_CODES[done.report.verdict]


def _hunt(args: argparse.Namespace, mix: FaultMix, out: TextIO) -> int:
    """Exit 0 when every sabotage hunted was found with causal credit (its first failure,
    or a later one, broke one of its own ids), 1 otherwise."""
    import scenarios  # noqa: F401 - the sabotages' modules register beside the scenarios
    from sim.explore.hunt import hunt_all
    from sim.sabotage import SABOTAGES

    unknown = [n for n in args.hunt if n not in SABOTAGES]
    if unknown:
        raise BadInput(f"unknown sabotage(s): {', '.join(unknown)}")
    if args.hunt_seeds < 1 or args.seed_start < 0 or args.workers < 1:
        raise BadInput("--hunt-seeds and --workers must be 1 or more, --seed-start 0 or more")
    ignored = [flag for flag, value in (("--shard", args.shard), ("--html", args.html),
                                        ("--write-scenario", args.write_scenario),
                                        ("--write-plan", args.write_plan),
                                        ("--check-determinism", args.check_determinism),
                                        ("--store sqlite", args.store == "sqlite")) if value]
    if ignored:
        raise BadInput(f"--hunt does not take {', '.join(ignored)}")
    hunts = hunt_all(args.hunt or None, seeds_max=args.hunt_seeds, mix=mix,
                     seed_start=args.seed_start, workers=args.workers)
    if args.json:
        out.write(json.dumps([h.as_json() for h in hunts], indent=2) + "\n")
    else:
        for h in hunts:
            out.write(f"{h.sabotage:<44} {_hunted(h)}\n")
            if h.causal_violation is not None:
                out.write(f"{'':<44} {h.causal_violation[:200]}\n")
        found = sum(1 for h in hunts if h.causal_at is not None)
        out.write(f"{found} of {len(hunts)} sabotages found with causal credit\n")
    return 0 if all(h.causal_at is not None for h in hunts) else 1


def _hunted(h: Hunt) -> str:
    """One sabotage's line: its first failure and, when that broke other ids, its first
    causal one."""
    if h.found_at is None:
        return f"not found in {h.seeds_tried} seeds"
    first = f"seed {h.found_at} after {h.seeds_to_first} seeds: {', '.join(h.broke)}"
    if h.causal:
        return f"{first} (causal)"
    if h.causal_at is None:
        return f"{first} (other ids; none of its own in {h.seeds_tried} seeds)"
    return f"{first} (other ids); its own at seed {h.causal_at} after {h.seeds_to_causal} seeds"
