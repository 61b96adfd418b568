"""A ``fedshard tune`` folder: its summary, each candidate's run folder and each site's tuning ledger.

Written by :mod:`fedshard.tuning`, read by ``fedshard runs`` (:mod:`fedshard.report.listing`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CANDIDATES_DIR", "TUNE_FILE", "candidate_dir", "tuning_ledger"]

TUNE_FILE = "tune.json"
"""What ``fedshard tune`` found: the candidates, their noisy scores, the one chosen, every site's spend."""
CANDIDATES_DIR = "candidates"
"""Each candidate's run folder, ``<tune folder>/candidates/<name>``."""
_LEDGERS_DIR = "ledgers"


def candidate_dir(folder: Path, name: str) -> Path:
    """The run folder of candidate ``name`` in the tune folder ``folder``."""
    return folder / CANDIDATES_DIR / name


def tuning_ledger(folder: Path, site_id: str) -> Path:
    """Site ``site_id``'s tuning ledger in the tune folder ``folder``."""
    return folder / _LEDGERS_DIR / f"{site_id}.sqlite"
