"""Watch events read while the loop is busy reach it in one wake, in order
(dra_driver/controller/informer.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from dra_driver.controller.informer import CLAIMS, Informer


def claim(uid: str, version: int) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "resourceVersion": str(version)}}


def test_events_read_meanwhile_are_applied_in_one_drain_in_order() -> None:
    seen: list[tuple[str, str, str]] = []
    drains: list[int] = []

    async def scenario() -> None:
        informer = Informer(
            None,
            CLAIMS,
            on_change=lambda etype, new, old: seen.append(
                (etype, new["metadata"]["uid"], new["metadata"]["resourceVersion"])
            ),
        )
        drain = informer._drain

        def counted() -> None:
            drains.append(len(informer._arrived))
            drain()

        informer._drain = counted  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        events = [("ADDED", claim("a", 1)), ("MODIFIED", claim("a", 2)), ("ADDED", claim("b", 3))]

        def watch_thread() -> None:
            for etype, obj in events:
                informer._arrive(loop, etype, obj)
            informer._arrive(loop, "BOOKMARK", claim("", 4))  # no change: not applied

        reader = threading.Thread(target=watch_thread)
        reader.start()
        reader.join()  # the loop was busy (blocked here) the whole time
        await asyncio.sleep(0.05)
        assert informer._version == "4"
        assert informer.get("a") == claim("a", 2)
        informer._arrive(loop, "DELETED", claim("b", 5))  # the next event: the next drain
        await asyncio.sleep(0.05)
        assert informer.get("b") is None

    asyncio.run(scenario())
    assert seen == [
        ("ADDED", "a", "1"),
        ("MODIFIED", "a", "2"),
        ("ADDED", "b", "3"),
        ("DELETED", "b", "5"),
    ]
    assert drains == [3, 1]
