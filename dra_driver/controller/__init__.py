"""The controller of the controller path: allocates claims of the controller-managed
class ``share.gpu.fractional.dev`` (see docs/architecture.md).

* :mod:`.informer`: list+watch per kind into in-memory caches (resume, relist on 410);
* :mod:`.queue`: the coalescing work queue keyed by claim UID;
* :mod:`.reconcile`: pure :func:`~.reconcile.decide` and the write builders;
* :mod:`.leader`: Lease-based leader election; :mod:`.events`: rate-limited Events;
* :mod:`.ledger_cache`: the allocator's state kept across claims; :mod:`.inflight`: each
  claim's life from its decision to its write's echo (its allocation held, our answers
  laid over the informer's claims); :mod:`.claim_index`: pods and claims both ways;
* :mod:`.worker` and :mod:`.turns`: claims worked largest first, writes side by side;
  :mod:`.claim_writes`: the claims' writes, each a move of its in-flight record;
* :mod:`.caches`: what both halves read; :mod:`.routing`: the informers' events into
  the caches and the queue; :mod:`.processing`: one claim decided and written;
* :mod:`.main`: :class:`~.main.Controller`, the tasks that run them (built by
  :mod:`dra_driver.app.controller`).
"""

from dra_driver.controller.config import ControllerConfig
from dra_driver.controller.main import Controller

__all__ = ["Controller", "ControllerConfig"]
