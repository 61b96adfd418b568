"""What the coordinator remembers of each site's privacy reports between rounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedshard.protocol.messages import LedgerHeadReport, PrivacyReport

__all__ = ["PrivacyReports"]


class PrivacyReports:
    """Each site's last privacy report and the last ledger head it reported.

    A report without a ledger head keeps the earlier head: the coordinator sends it back,
    and a site whose ledger no longer contains it refuses to release.
    """

    def __init__(self) -> None:
        self._reports: dict[str, PrivacyReport] = {}  # site id -> last report
        self._heads: dict[str, LedgerHeadReport] = {}  # site id -> last ledger head it reported

    def preload(self, heads: Mapping[str, LedgerHeadReport]) -> None:
        """Heads known before any report of this run (from earlier runs: the ledger book)."""
        self._heads.update(heads)

    def reports(self) -> dict[str, PrivacyReport]:
        """Each site's last report, by site id."""
        return dict(self._reports)

    def reset(self, reports: Mapping[str, PrivacyReport]) -> None:
        """Start from the sites' query answers (heads already known are kept)."""
        self._reports = dict(reports)
        for site_id, report in reports.items():
            self._keep_head(site_id, report)

    def record(self, site_id: str, report: PrivacyReport) -> None:
        """The site's newest report."""
        self._reports[site_id] = report
        self._keep_head(site_id, report)

    def can_afford(self, site_id: str) -> bool:
        """Whether the site can afford the next round (True before its first report)."""
        report = self._reports.get(site_id)
        return report is None or report.can_afford_next

    def ledger_head(self, site_id: str) -> LedgerHeadReport | None:
        """The last ledger head the site reported."""
        return self._heads.get(site_id)

    def projection_hint(self, site_id: str) -> int | None:
        """The site's last projection of its rounds left, one round on (None before its first report)."""
        report = self._reports.get(site_id)
        left = None if report is None else report.projected_rounds_left
        return None if left is None else max(left - 1, 0)

    def as_json(self) -> dict[str, Any]:
        """Every site's last report, by site id, as JSON values."""
        return {site: report.model_dump(mode="json") for site, report in sorted(self._reports.items())}

    def _keep_head(self, site_id: str, report: PrivacyReport) -> None:
        if report.ledger_head is not None:
            self._heads[site_id] = report.ledger_head
