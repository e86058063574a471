"""Exponential backoff for retried API writes (slice publishing, claim status)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter; pure, so it is tested as a table."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    """Each delay is scaled by a uniform factor in ``[1 - jitter, 1 + jitter]``."""

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` >= 1 failures so far)."""
        base = min(self.max_s, self.initial_s * self.factor ** max(0, attempt - 1))
        return float(base * (1 - self.jitter + 2 * self.jitter * rand()))
