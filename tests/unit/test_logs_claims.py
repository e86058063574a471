"""Structured log lines: one per claim operation, and ``--log-format json`` output."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.prepare import ClaimOperation
from dra_driver.observability.claim_log import LOGGER, ClaimLog
from dra_driver.observability.logs import JsonFormatter, configure_logging
from tests.support.planned import mig_instance, mig_plan, mps_share

GIB = 1 << 30
REF = ClaimRef("team-a", "train", ClaimUID("0b7e6c2a-1111-2222-3333-444455556666"))
MPS = mps_share(
    share_id="share-1", gpu="GPU-aaaa", memory_bytes=10 * GIB, compute_percent=25,
    cdi=("k8s.gpu.fractional.dev/claim=x",),
)  # fmt: skip
MIG = mig_instance(
    "gpu-1-mig-1g10gb-0", gpu="GPU-bbbb", requests=("mig",),
    mig=mig_plan(19, "1g.10gb", 0, 1, uuid="MIG-cccc"),
)  # fmt: skip


def logged(op: ClaimOperation, caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    """The one record ClaimLog writes for ``op``."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        ClaimLog().claim_done(op)
    (record,) = caplog.records
    assert record.name == LOGGER
    return record


def as_json(record: logging.LogRecord) -> dict[str, Any]:
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc: dict[str, Any] = json.loads(line)
    return doc


def test_a_prepared_claim_is_one_info_line_with_its_devices(
    caplog: pytest.LogCaptureFixture,
) -> None:
    record = logged(ClaimOperation("prepare", REF, 0.0123456, devices=(MPS, MIG)), caplog)
    assert record.levelno == logging.INFO
    doc = as_json(record)
    assert doc["level"] == "INFO"
    assert doc["logger"] == "dra_driver.claims"
    assert doc["message"] == (
        f"prepare {REF} ok in 0.012s: gpu-0 (mps, 10Gi, 25% SMs), gpu-1-mig-1g10gb-0 (mig, 1g.10gb)"
    )
    assert doc["claim"] == "team-a/train:0b7e6c2a-1111-2222-3333-444455556666"
    assert doc["operation"] == "prepare"
    assert doc["outcome"] == "ok"
    assert doc["reason"] == ""
    assert doc["seconds"] == 0.012346
    assert "error" not in doc
    assert doc["devices"] == [
        {
            "device": "gpu-0",
            "gpu_uuid": "GPU-aaaa",
            "mode": "mps",
            "share_id": "share-1",
            "memory_bytes": 10 * GIB,
            "compute_percent": 25,
        },
        {
            "device": "gpu-1-mig-1g10gb-0",
            "gpu_uuid": "GPU-bbbb",
            "mode": "mig",
            "mig_profile": "1g.10gb",
            "mig_uuid": "MIG-cccc",
        },
    ]


def test_a_failed_prepare_is_one_warning_with_reason_and_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = f"claim {REF}: gpu-0 cannot hold this share"
    record = logged(ClaimOperation("prepare", REF, 0.002, error=error, reason="Overcommit"), caplog)
    assert record.levelno == logging.WARNING
    doc = as_json(record)
    assert doc["level"] == "WARNING"
    assert doc["outcome"] == "error"
    assert doc["reason"] == "Overcommit"
    assert doc["error"] == error
    assert doc["devices"] == []
    assert doc["message"] == f"prepare {REF} failed (Overcommit) in 0.002s: {error}"


@pytest.mark.parametrize(
    ("op", "outcome", "message"),
    [
        (
            ClaimOperation("prepare", REF, 0.0004, devices=(MPS,), repeated=True),
            "repeated",
            f"prepare {REF} repeated in 0.000s: gpu-0 (mps, 10Gi, 25% SMs)",
        ),
        (ClaimOperation("unprepare", REF, 0.5), "ok", f"unprepare {REF} ok in 0.500s"),
    ],
    ids=["repeated-prepare", "unprepare"],
)
def test_outcomes(
    op: ClaimOperation, outcome: str, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    record = logged(op, caplog)
    assert record.levelno == logging.INFO
    doc = as_json(record)
    assert (doc["outcome"], doc["message"]) == (outcome, message)


def test_fields_never_override_the_standard_keys(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="t"):
        logging.getLogger("t").info("hi", extra={"fields": {"message": "x", "claim": "c"}})
    doc = as_json(caplog.records[-1])
    assert (doc["message"], doc["claim"]) == ("hi", "c")


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Put the root logger back as it was after a test that configures it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_json_writes_one_object_per_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("INFO", "text")
    configure_logging("INFO", "json")  # replaces our handler, does not add a second
    logging.getLogger("dra_driver.test").debug("below the level")
    ClaimLog().claim_done(ClaimOperation("prepare", REF, 0.01, devices=(MPS,)))
    try:
        raise RuntimeError("kaput")
    except RuntimeError:
        logging.getLogger("dra_driver.test").exception("it broke")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    first, second = (json.loads(line) for line in lines)
    assert first["claim"] == str(REF) and first["devices"][0]["share_id"] == "share-1"
    assert first["time"].endswith("Z") and first["level"] == "INFO"
    assert second["message"] == "it broke" and "RuntimeError: kaput" in second["exception"]


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_text(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("WARNING", "text")
    ClaimLog().claim_done(ClaimOperation("unprepare", REF, 0.01))  # INFO: filtered
    ClaimLog().claim_done(ClaimOperation("unprepare", REF, 0.01, error="e", reason="ApiError"))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        f"WARNING dra_driver.claims: unprepare {REF} failed (ApiError) in 0.010s: e"
    )
