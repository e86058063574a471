"""Metrics endpoint and log formatting shared by the plugin, the mps-agent and the controller."""
