"""The retry delay of every loop that talks to the apiserver: the ResourceSlice publisher (its sync and its
watch) and the controller's informers."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Exponential backoff with a cap and +-`jitter` proportional randomisation, so many nodes that lost
    the apiserver at the same moment do not come back in lockstep."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    rng: Callable[[], float] = random.random
    attempts: int = field(default=0, init=False)

    def next(self) -> float:
        # The exponent is bounded so a node that stays cut off for days cannot overflow the float.
        base = min(self.maximum, self.initial * self.factor ** min(self.attempts, 64))
        self.attempts += 1
        spread = 1.0 - self.jitter + 2.0 * self.jitter * self.rng()
        return min(self.maximum, base * spread)

    def reset(self) -> None:
        self.attempts = 0
