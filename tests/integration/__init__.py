"""Integration tests: adapters against real servers (fake API over HTTP, sockets)."""
