"""The composition root: where the components' object graphs are built.

Each long-running component has a module that builds its objects by
constructor injection (every object is handed its collaborators) and runs
them: :mod:`~dra_driver.app.plugin` (the kubelet plugin; against the API server:
:mod:`~dra_driver.app.plugin_daemon`),
:mod:`~dra_driver.app.agent` (the mps-agent) and
:mod:`~dra_driver.app.controller` (the allocation controller). The ``cli``
modules only parse flags and call them.
"""
