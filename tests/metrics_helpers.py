"""Scraping Prometheus metrics in tests, as an operator's Prometheus would."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""Every sample scraped, (name, labels) → value; ``("# HELP", {("family", name)})`` → 1 per family."""


def scrape(url: str) -> Samples:
    """Every sample at ``url``, and every family it documents (even one with no series yet)."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for line in text.splitlines():
        if line.startswith("# HELP "):
            samples[("# HELP", frozenset({("family", line.split()[2])}))] = 1
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def families(samples: Samples) -> set[str]:
    """The families scraped, as the README names them (a counter with its ``_total``)."""
    return {dict(labels)["family"] for name, labels in samples if name == "# HELP"}
