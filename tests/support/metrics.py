"""Reading a Prometheus exposition in the tests: scrape ``/metrics`` over real HTTP."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """The samples of one exposition, looked up by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.types: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def series(self, name: str) -> list[dict[str, str]]:
        return [dict(labels) for sample, labels in self.samples if sample == name]


def scrape(port: int) -> Scrape:
    """GET /metrics over real HTTP (blocking: call it from a thread in async tests)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return Scrape(response.read().decode())
