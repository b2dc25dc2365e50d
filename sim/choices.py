"""One seeded chooser with named sub-streams and a log of every choice.

Each part of the world draws from its own sub-stream, derived from the run's seed and
the stream name, so adding draws to one part does not shift the choices of another: a
failing seed stays the same run while the simulator grows. Every draw is logged. Today
the engine draws from one stream, "backoff" (the jitter of a retry's wait, ``Jitter``).
"""

from __future__ import annotations

import hashlib
import random


class Chooser:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._streams: dict[str, random.Random] = {}
        self.log: list[tuple[str, object]] = []

    def stream(self, name: str) -> random.Random:
        rng = self._streams.get(name)
        if rng is None:
            digest = hashlib.sha256(f"{self.seed}:{name}".encode()).digest()
            rng = random.Random(int.from_bytes(digest[:8], "big"))
            self._streams[name] = rng
        return rng

    def fraction(self, name: str) -> float:
        """A float in [0, 1) from sub-stream ``name`` (backoff jitter draws from "backoff")."""
        value = self.stream(name).random()
        self.log.append((name, value))
        return value
