"""Stories the explorer found in seeds 10,000-19,999, the first sweep past 9,999, each a
shrunk seed (``hermes-ref explore --shrink SEED``) red before its fix, on the engine or on a
checker, as each story says. The calls are the explorer's own, so each replays the run it
came from, then the calm phase.
"""

from __future__ import annotations
