"""Fixtures shared by the whole suite (helpers live in tests/support)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fakekube import FakeKubeApi


@pytest.fixture
def fake_kube() -> Iterator[FakeKubeApi]:
    """A started fake Kubernetes API server; closed (watches ended) after the test."""
    with FakeKubeApi() as api:
        yield api
