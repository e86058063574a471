"""Kubernetes adapters: the only package that imports the official `kubernetes` client."""
