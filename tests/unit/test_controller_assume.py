"""The assume cache: our writes laid over the informer's claims until it catches up."""

from __future__ import annotations

from typing import Any

from dra_driver.controller.assume import AssumeCache
from dra_driver.controller.informer import CLAIMS, Informer
from tests.support.transport import UNUSED_HOST, transport_to

JsonObj = dict[str, Any]


def claim(version: int, uid: str = "u1") -> JsonObj:
    return {"metadata": {"uid": uid, "name": uid, "resourceVersion": str(version)}}


def cache_over(*seen: JsonObj) -> tuple[AssumeCache, Informer]:
    informer = Informer(transport_to(UNUSED_HOST), CLAIMS)
    for obj in seen:
        informer.objects.put(obj["metadata"]["uid"], obj)
    return AssumeCache(informer), informer


def test_our_write_is_read_until_the_informer_shows_it() -> None:
    cache, informer = cache_over(claim(3))
    cache.assume(claim(5))
    assert cache.current("u1") == claim(5)
    informer.objects.put("u1", claim(4))
    assert cache.current("u1") == claim(5)
    informer.objects.put("u1", claim(6))
    assert cache.current("u1") == claim(6)


def test_versions_up_to_our_last_write_are_no_news_and_a_newer_one_is() -> None:
    cache, _ = cache_over(claim(3))
    cache.assume(claim(5))
    assert cache.seen(claim(4))  # what our write was based on
    assert cache.assumed  # still ours: the informer is behind
    assert cache.seen(claim(5))  # the echo of our write
    assert not cache.assumed
    cache.assume(claim(7))
    assert not cache.seen(claim(8))  # someone else wrote after us
    assert not cache.assumed


def test_a_claim_we_never_wrote_is_news() -> None:
    cache, _ = cache_over(claim(3))
    assert not cache.seen(claim(4))
    assert not cache.seen(claim(1, uid="other"))


def test_all_lays_ours_over_the_informers() -> None:
    cache, _ = cache_over(claim(3), claim(2, uid="u2"))
    cache.assume(claim(9, uid="u3"))
    cache.assume(claim(1))  # older than the informer's: not assumed
    assert sorted(c["metadata"]["resourceVersion"] for c in cache.all()) == ["2", "3", "9"]
