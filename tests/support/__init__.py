"""Shared test helpers: fakes and builders (import from here, never from test modules)."""
