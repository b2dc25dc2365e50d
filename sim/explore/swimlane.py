"""A run as a swimlane picture: one self-contained HTML file, no script, no network.

Time runs down the page, one row per timeline line; each line sits in the lane of what it
is about: a process (the lines its actors added), the provider (model calls), the store
(commits, leases, fenced writes), the tools, or the world (faults, the calm phase). A
fault, a crash and a violation are marked in red across the row, so the eye finds them.
Runs of one repeated line (a drain polling a busy queue) are folded into one row with a
count. Every cell carries the whole line as its tooltip.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from sim.explore.plan import WorldPlan
from sim.explore.run import RunReport

STORE_KINDS = frozenset({"write", "lease", "FENCED", "epoch", "bind", "ack"})
MARKED = frozenset({"FAULT", "CRASH", "VIOLATE", "ENGINE", "EXPECT", "INTERRUPT"})
WORLD_KINDS = frozenset({"calm", "restart", "process", "verdict"})
CELL_TEXT_MAX = 60

Row = tuple[float, str, str, str, int]  # time, kind, text, lane, repeats


_PID = re.compile(r"\bpid=(\d+)")


def lane_of(kind: str, text: str, pid: int | None) -> str:
    """The provider, store and tools lanes by kind; otherwise the process the line names
    (``pid=N``: hand-outs, crashes, stalls), else the one whose actor added it."""
    if kind == "call":
        return "provider"
    if kind == "tool":
        return "tools"
    if kind in STORE_KINDS:
        return "store"
    named = _PID.search(text)
    if named is not None and kind not in WORLD_KINDS:
        return f"pid {named.group(1)}"
    if kind in MARKED or kind in WORLD_KINDS or pid is None:
        return "world"
    return f"pid {pid}"


def rows_of(entries: list[tuple[float, str, str, int | None]]) -> list[Row]:
    """Timeline entries as rows, with runs of one repeated line folded."""
    rows: list[Row] = []
    for at, kind, text, pid in entries:
        if kind == "phase":
            continue  # phases are in the narrated timeline; here they would drown the rest
        lane = lane_of(kind, text, pid)
        if rows and rows[-1][1:4] == (kind, text, lane):
            first = rows[-1]
            rows[-1] = (first[0], kind, text, lane, first[4] + 1)
            continue
        rows.append((at, kind, text, lane, 1))
    return rows


def lanes_of(rows: list[Row]) -> list[str]:
    pids = sorted({r[3] for r in rows if r[3].startswith("pid ")}, key=lambda s: int(s[4:]))
    return ["world", *pids, "provider", "store", "tools"]


def render_html(plan: WorldPlan, report: RunReport,
                entries: list[tuple[float, str, str, int | None]]) -> str:
    rows = rows_of(entries)
    lanes = lanes_of(rows)
    head = "".join(f"<th>{html.escape(lane)}</th>" for lane in lanes)
    body = []
    for at, kind, text, lane, repeats in rows:
        whole = f"{at:.3f}  {kind}  {text}" + (f"  (x{repeats})" if repeats > 1 else "")
        shown = text if len(text) <= CELL_TEXT_MAX else text[:CELL_TEXT_MAX - 1] + "…"
        count = f" <b>x{repeats}</b>" if repeats > 1 else ""
        cells = []
        for column in lanes:
            if column == lane:
                cells.append(f'<td class="on {kind.lower()}" title="{html.escape(whole)}">'
                             f"<i>{html.escape(kind)}</i> {html.escape(shown)}{count}</td>")
            else:
                cells.append("<td></td>")
        marked = ' class="marked"' if kind in MARKED else ""
        body.append(f'<tr{marked}><th class="t">{at:.1f}</th>{"".join(cells)}</tr>')
    verdict = html.escape(report.verdict.value)
    fired = html.escape(", ".join(sorted(k.value for k in report.fired)) or "none")
    found = "".join(f"<li>{html.escape(v)}</li>" for v in report.violations + report.stuck)
    tone = "passed" if report.verdict.value == "passed" else "failed"
    return _PAGE.format(seed=plan.seed, verdict=verdict, tone=tone, fired=fired, found=found,
                        size=html.escape(_size(plan)), head=head, body="\n".join(body),
                        css=_CSS)


def _size(plan: WorldPlan) -> str:
    names = ("processes", "sessions", "turns", "faults", "steps")
    return ", ".join(f"{n} {k}" for k, n in zip(names, plan.size, strict=True))


def write_html(path: Path, plan: WorldPlan, report: RunReport) -> None:
    """Write the picture of ``report``'s run (it must have been run with a trace)."""
    path.write_text(render_html(plan, report, report.entries), encoding="utf-8")


_CSS = """
body { font: 13px/1.35 ui-monospace, Menlo, Consolas, monospace; margin: 1.5em; color: #222; }
h1 { font-size: 18px; } .passed { color: #17702a; } .failed { color: #b00020; }
table { border-collapse: collapse; width: 100%; table-layout: fixed; }
thead th { position: sticky; top: 0; background: #f4f4f4; border-bottom: 2px solid #999;
  padding: 4px; text-align: left; }
th.t { width: 5em; text-align: right; color: #777; font-weight: normal; padding-right: 6px; }
td { border-left: 1px solid #e2e2e2; padding: 1px 4px; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; vertical-align: top; }
td.on { background: #eef4ff; } td.on i { color: #555; font-style: normal; font-weight: bold; }
td.call { background: #fff5e0; } td.write, td.lease, td.epoch, td.ack { background: #eaf7ea; }
td.tool { background: #f3ecfb; } td.fenced { background: #ffe9cc; }
tr.marked td.on { background: #ffd9de; color: #8a0016; }
tr.marked th.t { color: #b00020; font-weight: bold; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>hermes-ref explore: seed {seed}</title><style>{css}</style></head>
<body>
<h1>Seed {seed}: <span class="{tone}">{verdict}</span></h1>
<p>World: {size}. Faults that fired: {fired}.</p>
<ul class="found">{found}</ul>
<table><thead><tr><th class="t">s</th>{head}</tr></thead>
<tbody>
{body}
</tbody></table>
</body></html>
"""
