"""How the fake MPS daemon reads a FIFO client's request into lines (``mps_fifo._Lines``):
the lines of one read are split at once, and what comes in pieces is put together."""

from __future__ import annotations

import os
import threading

import pytest

from dra_driver.fakes.mps_fifo import BadRequest, _Lines


def _lines_of(*chunks: bytes) -> _Lines:
    """A reader over a pipe whose writer sends ``chunks`` one write each, then closes."""
    read_end, write_end = os.pipe()

    def send() -> None:
        for chunk in chunks:
            os.write(write_end, chunk)
        os.close(write_end)

    threading.Thread(target=send, daemon=True).start()
    return _Lines(read_end)


def test_lines_in_one_read_come_in_order_then_end_of_file() -> None:
    lines = _lines_of(b"fake-mps-fifo 1\n42\n\nargv 1\nlist\n")
    assert lines.take(5) == ["fake-mps-fifo 1", "42", "", "argv 1", "list"]
    assert lines.next_line() is None
    os.close(lines.fd)


def test_lines_split_across_reads_are_put_together() -> None:
    """A line cut by a read, a UTF-8 character cut in two included."""
    text = "namespace\nnom-é\nlast\n".encode()
    cut = text.index("é".encode()) + 1
    lines = _lines_of(text[:3], text[3:cut], text[cut:])
    assert [lines.next_line() for _ in range(4)] == ["namespace", "nom-é", "last", None]
    os.close(lines.fd)


def test_a_request_that_ends_early_or_mid_line_is_bad() -> None:
    early = _lines_of(b"fake-mps-fifo 1\n")
    assert early.take(1) == ["fake-mps-fifo 1"]
    with pytest.raises(BadRequest, match="ended early"):
        early.take(1)
    os.close(early.fd)
    mid = _lines_of(b"whole\nhal", b"f")
    assert mid.take(1) == ["whole"]
    with pytest.raises(BadRequest, match="middle of a line"):
        mid.take(1)
    os.close(mid.fd)


def test_take_waits_for_lines_of_later_reads() -> None:
    lines = _lines_of(b"a\nb", b"\nc\n")
    assert lines.take(3) == ["a", "b", "c"]
    assert lines.take(0) == [] and lines.next_line() is None
    os.close(lines.fd)


def test_a_long_shell_keeps_only_the_lines_not_yet_answered() -> None:
    """A persistent shell (the mps-agent's channel) sends lines for as long as it lives:
    a line read, answered and then a new read leaves no old line behind."""
    read_end, write_end = os.pipe()
    lines = _Lines(read_end)
    for i in range(200):
        os.write(write_end, f"l{i}a\nl{i}b\n".encode())
        assert [lines.next_line(), lines.next_line()] == [f"l{i}a", f"l{i}b"]
        assert len(lines.ready) <= 2
    os.close(write_end)
    assert lines.next_line() is None
    os.close(read_end)
