"""A run's Prometheus metrics, read from its event log at every scrape (see README,
"Metrics"): the round it is at, how long rounds and their phases take, accuracy, the
sites taking part and connected, what sites were refused, each site's ε as reported.

It follows the log (:mod:`fedshard.coordinator.events`) rather than the coordinator,
so the same collector serves ``fedshard simulate`` and ``fedshard aggregator up``,
whose coordinator runs in a Flower ServerApp process of its own.

ε spent is what each site's ledger reported to the coordinator (a site that lies
misleads its own series only: its ledger is what stops it).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import ValidationError

from fedshard.coordinator.events import EventKind, EventLog, round_from_event
from fedshard.errors import RefusalCode
from fedshard.protocol.messages import PrivacyStatus, SiteInfo
from fedshard.protocol.timings import Phase

__all__ = ["RUN_METRICS", "RunCollector"]

RUN_METRICS: dict[str, str] = {
    "fedshard_round": "The last round finished",
    "fedshard_rounds_total": "Rounds finished (outcome=completed) or aborted at every zone (outcome=aborted)",
    "fedshard_round_duration_seconds": "Seconds from opening a round to its evaluation",
    "fedshard_round_phase_seconds": "Seconds the coordinator waited for one phase of a round (open, train, close, "
    "evaluate)",
    "fedshard_round_accuracy": "Accuracy of the last round's model, weighted by the sites' fixed weights",
    "fedshard_round_loss": "Loss of the last round's model, weighted by the sites' fixed weights",
    "fedshard_round_sites": "Sites counted in the last round's aggregates",
    "fedshard_uploaded_bytes_total": "Bytes the zones acknowledged from sites",
    "fedshard_site_refusals_total": "Selected sites that did not contribute to a round, by refusal code",
    "fedshard_site_replies_excluded_total": "Site replies the coordinator left out of a round's metrics (they "
    "disagreed with what it knows, or were out of bounds), by code",
    "fedshard_nodes_refused_total": "Nodes refused for the run (no valid proof of their site id, or an id "
    "another node holds), by code",
    "fedshard_sites": "Sites taking part in the federation",
    "fedshard_sites_connected": "Sites connected to the control plane now",
    "fedshard_site_epsilon_spent": "ε a site's ledger reported spent",
    "fedshard_site_epsilon_budget": "ε budget of a site's ledger",
    "fedshard_site_privacy_exhausted": "1 when a site stopped releasing (budget exhausted or ledger refused)",
    "fedshard_run_finished": "1 once the run ended (its stop event)",
}
"""Every series a run exports, with its help text (the README's table lists the same)."""

_PHASES = (Phase.OPEN, Phase.TRAIN, Phase.CLOSE, Phase.EVALUATE)
_ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class RunCollector(Collector):
    """Exports the run logged in ``events`` (read on from where the last scrape stopped).

    ``connected`` says how many sites are connected now (a deployment asks its SuperLink);
    None: the sites taking part.
    """

    def __init__(self, events: str | Path, connected: Callable[[], int | None] | None = None) -> None:
        self._path = Path(events)
        self._log: EventLog | None = None  # opened once the run wrote its log (nothing is created here)
        self._connected = connected
        self._lock = threading.Lock()
        self._offset = 0
        self._round = 0
        self._outcomes = {"completed": 0, "aborted": 0}
        self._accuracy = self._loss = math.nan
        self._round_sites = 0
        self._bytes = 0
        self._refusals: dict[str, int] = {}
        self._excluded: dict[str, int] = {}
        self._nodes_refused: dict[str, int] = {}
        self._sites: set[str] = set()
        self._privacy: dict[str, dict[str, Any]] = {}
        self._finished = False
        self._durations = _histogram("fedshard_round_duration_seconds")
        self._phases = _histogram("fedshard_round_phase_seconds", "phase")

    def _read(self) -> None:
        if self._log is None:
            if not self._path.is_file():
                return
            self._log = EventLog(self._path)
        events, self._offset = self._log.read(self._offset)
        for event in events:
            kind = event.get("event")
            if kind == EventKind.START:
                sites = _sites(event.get("sites"))
                self._sites = {s.site_id for s in sites}
                self._privacy.update({s.site_id: s.privacy.model_dump(mode="json") for s in sites if s.privacy})
                self._finished = False
            elif kind == EventKind.RECONFIGURED:
                self._sites |= {s.site_id for s in _sites(event.get("sites"))}
            elif kind == EventKind.ROUND:
                self._on_round(event)
            elif kind == EventKind.ABORTED:
                self._outcomes["aborted"] += 1
            elif kind == EventKind.STOP:
                self._finished = True
            elif kind == EventKind.NODE_REFUSED:
                code = str(event.get("code") or "other")[:32]
                self._nodes_refused[code] = self._nodes_refused.get(code, 0) + 1

    def _on_round(self, event: dict[str, Any]) -> None:
        try:
            result = round_from_event(event)
        except ValidationError:  # not what fedshard writes: left out (fedshard report lists it)
            return
        self._round = result.round
        self._outcomes["completed"] += 1
        self._accuracy, self._loss = result.accuracy, result.loss
        self._round_sites = len(result.sites)
        self._bytes += result.bytes_up
        for site in result.refused:
            code = _code(result.refusal_codes.get(site))
            self._refusals[code] = self._refusals.get(code, 0) + 1
        for codes in result.excluded_codes.values():
            for code in codes:
                self._excluded[code.value] = self._excluded.get(code.value, 0) + 1
        self._privacy.update(result.privacy)
        timings = result.timings
        if "round" in timings:
            self._durations.observe(float(timings["round"]))
        for phase in _PHASES:
            seconds = timings.get("coordinator", {}).get(phase)
            if seconds is not None:
                self._phases.labels(phase=phase.value).observe(float(seconds))

    def collect(self) -> Iterator[Metric]:
        """The families of :data:`RUN_METRICS`."""
        with self._lock:
            self._read()
            yield _gauge("fedshard_round", self._round)
            outcomes = CounterMetricFamily("fedshard_rounds", RUN_METRICS["fedshard_rounds_total"], labels=["outcome"])
            for outcome, n in self._outcomes.items():
                outcomes.add_metric([outcome], n)
            yield outcomes
            yield from self._durations.collect()
            yield from self._phases.collect()
            yield _gauge("fedshard_round_accuracy", self._accuracy)
            yield _gauge("fedshard_round_loss", self._loss)
            yield _gauge("fedshard_round_sites", self._round_sites)
            yield CounterMetricFamily(
                "fedshard_uploaded_bytes", RUN_METRICS["fedshard_uploaded_bytes_total"], self._bytes
            )
            refusals = CounterMetricFamily(
                "fedshard_site_refusals", RUN_METRICS["fedshard_site_refusals_total"], labels=["code"]
            )
            for code, n in sorted(self._refusals.items()):
                refusals.add_metric([code], n)
            yield refusals
            yield _by_code("fedshard_site_replies_excluded", self._excluded)
            yield _by_code("fedshard_nodes_refused", self._nodes_refused)
            yield _gauge("fedshard_sites", len(self._sites))
            connected = self._connected() if self._connected is not None else len(self._sites)
            yield _gauge("fedshard_sites_connected", math.nan if connected is None else connected)
            yield from self._privacy_families()
            yield _gauge("fedshard_run_finished", int(self._finished))

    def _privacy_families(self) -> Iterator[Metric]:
        spent = GaugeMetricFamily(
            "fedshard_site_epsilon_spent", RUN_METRICS["fedshard_site_epsilon_spent"], labels=["site"]
        )
        budget = GaugeMetricFamily(
            "fedshard_site_epsilon_budget", RUN_METRICS["fedshard_site_epsilon_budget"], labels=["site"]
        )
        stopped = GaugeMetricFamily(
            "fedshard_site_privacy_exhausted", RUN_METRICS["fedshard_site_privacy_exhausted"], labels=["site"]
        )
        for site, report in sorted(self._privacy.items()):
            spent.add_metric([site], float(report.get("epsilon_spent", math.nan)))
            budget.add_metric([site], float(report.get("epsilon_budget", math.nan)))
            stopped.add_metric([site], int(report.get("status", PrivacyStatus.ACTIVE) != PrivacyStatus.ACTIVE))
        yield from (spent, budget, stopped)


def _sites(entries: object) -> list[SiteInfo]:
    """The well-formed site entries of a start or reconfigured event (the others are left out)."""
    out = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            out.append(SiteInfo.model_validate(entry))
        except ValidationError:
            continue
    return out


def _code(code: RefusalCode | None) -> str:
    return code.value if code is not None else "other"


def _by_code(family: str, counts: dict[str, int]) -> CounterMetricFamily:
    """Counter ``family`` (``_total`` in :data:`RUN_METRICS`) with one series per code."""
    metric = CounterMetricFamily(family, RUN_METRICS[f"{family}_total"], labels=["code"])
    for code, n in sorted(counts.items()):
        metric.add_metric([code], n)
    return metric


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, RUN_METRICS[name], value=value)


def _histogram(name: str, *labels: str) -> Histogram:
    """The run's own histogram ``name`` (in no registry: :class:`RunCollector` exports it)."""
    return Histogram(name, RUN_METRICS[name], labels, registry=None, buckets=_ROUND_BUCKETS)
