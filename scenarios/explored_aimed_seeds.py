"""Stories the explorer found in worlds its aimed parts draw (``sim/explore/corrected.py``,
``sim/explore/lineage.py``): each a shrunk seed (``hermes-ref explore --shrink SEED``) red
before its fix, as each story says. The calls are the explorer's own, so each replays the
run it came from, then the calm phase.
"""

from __future__ import annotations
