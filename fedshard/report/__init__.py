"""``fedshard report``: a run's plots and tables as one HTML page (see README, "See a run")."""

from fedshard.report._build import build_report

__all__ = ["build_report"]
