"""A watch stream's lines out of pieces of any size (dra_driver/k8s/transport.py)."""

from __future__ import annotations

import pytest

from dra_driver.k8s.transport import LineSplitter

STREAM = b'{"a":1}\n{"b":"' + b"x" * 5000 + b'"}\n\n{"c":3}'


@pytest.mark.parametrize("size", [1, 2, 7, 4096, len(STREAM)])
def test_lines_whatever_the_pieces(size: int) -> None:
    splitter = LineSplitter()
    lines: list[bytes] = []
    for i in range(0, len(STREAM), size):
        lines += splitter.feed(STREAM[i : i + size])
    assert lines == [b'{"a":1}', b'{"b":"' + b"x" * 5000 + b'"}', b""]
    assert splitter.rest() == b'{"c":3}'
    assert splitter.rest() == b""
