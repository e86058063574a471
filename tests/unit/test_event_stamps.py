"""Event timestamps: ``metav1.Time`` text (seconds, UTC, ``Z``), the same from any thread."""

from __future__ import annotations

import datetime
import re
import threading
import time

from dra_driver.k8s.events import now_rfc3339

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_a_given_time_is_written_as_the_api_writes_it() -> None:
    moment = datetime.datetime(2026, 12, 5, 13, 4, 5, 999_999, tzinfo=datetime.UTC)
    assert now_rfc3339(moment) == "2026-12-05T13:04:05Z"


def test_now_from_many_threads_is_always_a_current_second() -> None:
    seen: list[tuple[float, str, float]] = []

    def stamp() -> None:
        for _ in range(200):
            before = time.time()
            text = now_rfc3339()
            seen.append((before, text, time.time()))

    threads = [threading.Thread(target=stamp) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for before, text, after in seen:
        assert STAMP.match(text), text
        second = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
        assert int(before) <= second.timestamp() <= int(after), (before, text, after)
