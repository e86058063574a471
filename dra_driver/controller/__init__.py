"""The controller of the controller path: allocates claims of the controller-managed
class ``share.gpu.fractional.dev`` (see ARCHITECTURE.md 2 and 3.6).

* :mod:`.informer`: list+watch per kind into in-memory caches (resume, relist on 410);
* :mod:`.queue`: the coalescing work queue keyed by claim UID;
* :mod:`.reconcile`: pure :func:`~.reconcile.decide` and the write builders;
* :mod:`.leader`: Lease-based leader election; :mod:`.events`: rate-limited Events;
* :mod:`.main`: :class:`~.main.Controller` (built and run by :mod:`dra_driver.app.controller`).
"""

from dra_driver.controller.main import Controller, ControllerConfig

__all__ = ["Controller", "ControllerConfig"]
