"""Unit tests: pure logic and in-process fakes."""
