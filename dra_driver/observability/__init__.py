"""Metrics endpoint and log formatting shared by the plugin, the mps-agent and the controller.

The mps-agent's own metrics live beside it (:mod:`dra_driver.mpsagent.metrics`), so that
this package never imports the processes that use it.
"""
