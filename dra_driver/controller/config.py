"""The controller's settings, from the flags of ``dra-driver controller``."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ControllerConfig:
    driver_name: str
    kubeconfig: str | None = None
    host: str | None = None
    """Plain-HTTP API URL without credentials (tests)."""
    lease_name: str = "fractional-gpu-dra-controller"
    lease_namespace: str = "default"
    identity: str = field(default_factory=socket.gethostname)
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    """How long a leader keeps trying to renew before it gives up and exits."""
    renew_interval_s: float = 5.0
    retry_interval_s: float = 2.0
    read_timeout_s: float = 30.0
    """Idle watch streams are reopened (from the last version) after this long."""
    resync_s: float = 60.0
    retry_unfit_s: float = 30.0
    """A claim that fits nowhere is tried again after this long (and on any change)."""
    error_backoff_s: float = 2.0
    allocation_events: bool = False
    """A Normal ``Allocated`` Event per claim allocated (where it went). Off by default:
    it is one more API write per pod than the native path costs (the scheduler writes
    one ``Scheduled`` Event per pod, which the controller path's pods get too).
    Refusals and failures (``CannotAllocate``, ``AllocationRefused``, ...) always get
    their Event."""
    event_interval_s: float = 60.0
    """An equal Event (same claim, reason and message) is written again, as a count on
    the one before, at most this often."""
    batch_window_s: float = 0.2
    """Claims queued within this long of the oldest are worked together, largest
    first; 0: one at a time in arrival order."""
    write_concurrency: int = 16
    """Claims whose writes may be in flight at once (with a batching window; without
    one, a claim's writes end before the next claim is decided). Each has a thread:
    with 32, the threads' contention for the interpreter cost the controller about a
    millisecond more CPU per claim than with 16, for no more claims a second
    (``hack/bench/controller.py``, 50 nodes, 600-claim burst); 16 writes of 20 ms
    each are 400 claims a second."""
    metrics_port: int = 0
    """Serve Prometheus metrics on this port (:func:`dra_driver.app.controller.run_controller`);
    0: not served."""
    metrics_address: str = "0.0.0.0"
    metrics_refresh_s: float = 5.0
    """How often the free-memory and pending-claims gauges are recomputed at most: when
    anything changed and a scrape read them since (:mod:`.metrics`)."""
