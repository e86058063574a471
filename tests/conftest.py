"""Fixtures shared by the whole suite (helpers live in tests/support)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.support.fakekube import FakeKubeApi


@pytest.fixture
def fake_kube() -> Iterator[FakeKubeApi]:
    """A started fake Kubernetes API server; closed (watches ended) after the test."""
    with FakeKubeApi() as api:
        yield api


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """Tests that run a CLI entry point configure logging (root level and handler);
    put it back, so a later test's ``caplog`` sees what it logs."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
