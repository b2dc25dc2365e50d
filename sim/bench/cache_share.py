"""The prompt-cache share: how much of each prompt a provider's prefix cache serves, over N turns.

Theory of operation
-------------------
No timing here: the figure is a count. One session runs N text turns, five virtual
minutes apart, each with a different memory prefetch injected into the user message's API
copy (the turns of ``scenarios.wire_cache``, cycled), and the process restarts halfway.
The fake provider's ``PromptCache`` reports, per call, the tokens of the longest run of
leading messages the request shares with an earlier one (``usage.prompt_tokens_details.
cached_tokens``); the row's share is the cached tokens over the prompt tokens of turns
2..N, as the world's call records have them (turn 1 finds the cache cold).

The same session runs clean and under each sabotage of ``VARIANTS``, the ways a hurried
edit breaks the stable prefix: the prompt rebuilt with the clock every turn (CTX-3), the
prompt rebuilt by a restarted process (CTX-3), an earlier turn's row replayed without its
sidecar (WIRE-1). Each variant's share is also given as a ratio to the clean share of the
same run, and the tokens it pays in full (1 - share) as a ratio to the clean run's: what the
break costs, whatever the session's length.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, TextIO

from sim.bench.ratios import one
from sim.harness import Story
from sim.provider import FunctionProvider, text
from sim.sabotage import SABOTAGES

VARIANTS = ("prompt_rebuilt_each_turn", "restart_replays_a_rebuilt_prompt",
            "sidecar_dropped_on_replay")
TURNS_FULL, TURNS_SMALL = 20, 6
TURN_GAP_S = 300.0


def session_share(turns: int, sabotage: str | None = None) -> tuple[int, int]:
    """Cached and prompt tokens of turns 2..``turns`` of one session, clean or sabotaged."""

    def answer(request: Any) -> Any:
        return text(f"Answer {len(request.messages)}.")

    with tempfile.TemporaryDirectory(prefix="hermes-cache-share-") as tmp:
        story = Story(store_kind="memory", workdir=Path(tmp), trace=False)
        story.use_provider(FunctionProvider(answer))
        if sabotage is None:
            _run(story, turns)
        else:
            with SABOTAGES[sabotage].applied():
                _run(story, turns)
        calls = story.world.calls
        first = next((i for i, c in enumerate(calls) if c.turn_id != calls[0].turn_id), len(calls))
        replies = [c.reply for c in calls[first:] if c.reply is not None]
        return (sum(r.usage.cached_tokens for r in replies),
                sum(r.usage.prompt_tokens for r in replies))


def _run(story: Story, turns: int) -> None:
    from scenarios.wire_cache import MEMORY, QUESTIONS  # the story's own turns (cf. sim.cli)

    for index in range(turns):
        if index:
            story.advance(TURN_GAP_S)
        if index == turns // 2:
            story.restart()
        n = index % len(QUESTIONS)
        story.turn(f"{QUESTIONS[n]} ({index + 1})", injected=f"{MEMORY[n]} (turn {index + 1})")


def rows(sizes: Any, report: dict[str, Any], progress: TextIO | None = None) -> dict[str, Any]:
    """Every row of this module, for ``sim.bench.runner.measure`` (one line there)."""
    turns = TURNS_FULL if sizes.name in ("full", "quick") else TURNS_SMALL
    if progress is not None:
        progress.write(f"bench: prompt-cache share over {turns} turns, clean and sabotaged\n")
    cached, prompt = session_share(turns)
    clean = cached / prompt if prompt else 0.0
    out: dict[str, Any] = {"cache_share_turns": one(turns),
                           "cache_share_clean": one(clean),
                           "cache_share_prompt_tokens": one(prompt)}
    for name in VARIANTS:
        got, total = session_share(turns, name)
        share = got / total if total else 0.0
        out[f"cache_share_{name}"] = one(share)
        out[f"cache_share_{name}_over_clean"] = one(share / clean if clean else 0.0)
        out[f"cache_share_{name}_uncached_over_clean"] = one(
            (1 - share) / (1 - clean) if clean < 1 else 0.0)
    return out


LABELS = (
    ("cache_share_turns", "turns in the session (turn 1 is cold and not counted)"),
    ("cache_share_prompt_tokens", "prompt tokens of turns 2..N, clean"),
    ("cache_share_clean", "cached / prompt tokens, the engine as it is"),
    *((f"cache_share_{name}", f"the same under {name}") for name in VARIANTS),
    *((f"cache_share_{name}_over_clean", "its share / the clean share") for name in VARIANTS),
    *((f"cache_share_{name}_uncached_over_clean", "prompt tokens paid in full, / clean")
      for name in VARIANTS),
)


def lines(report: dict[str, Any]) -> list[str]:
    """The rows as table lines, for ``sim.bench.render`` (one line there)."""
    out = ["prompt-cache share (sim.bench.cache_share):"]
    for name, how in LABELS:
        stat = report.get(name)
        if stat is not None:
            out.append(f"  {name:<64} {stat['median']:>8,.2f}  {how}")
    return out
