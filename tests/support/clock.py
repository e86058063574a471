"""A clock the test sets: ``Clock()`` is called like ``time.monotonic`` and returns
``now``, which the test moves by hand (``clock.now += 61``), so rate limits, retries
and intervals are tested by events, not by sleeping."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
