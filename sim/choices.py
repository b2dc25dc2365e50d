"""One seeded chooser with named sub-streams and a log of every choice.

Each part of the world (ids, provider, faults, ...) draws from its own sub-stream,
derived from the run's seed and the stream name. Adding draws to one part therefore
does not shift the choices of another, which keeps failing seeds stable while the
simulator grows. Every draw is logged so a run can be inspected and replayed.
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

    def hex(self, name: str, n_chars: int) -> str:
        value = self.stream(name).getrandbits(4 * n_chars)
        text = f"{value:0{n_chars}x}"
        self.log.append((name, text))
        return text

    def chance(self, name: str, probability: float) -> bool:
        hit = self.stream(name).random() < probability
        self.log.append((name, hit))
        return hit

    def pick(self, name: str, options: list[str]) -> str:
        choice = self.stream(name).choice(options)
        self.log.append((name, choice))
        return choice
