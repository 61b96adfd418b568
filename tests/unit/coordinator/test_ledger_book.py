"""The coordinator's ledger book: every site's ledger head and spend, across runs of a federation."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedshard.coordinator.ledger_book import LedgerBook
from fedshard.errors import ConfigError
from fedshard.protocol.messages import LedgerHeadReport, PrivacyReport


def _report(record: float, length: int = 3, ledger: str = "L1") -> PrivacyReport:
    head = LedgerHeadReport(ledger_id=ledger, length=length, mac="ab" * 16)
    return PrivacyReport(epsilon_budget=3.0, delta=1e-5, epsilon_spent=record, epsilon_record=record, ledger_head=head)


def test_spend_is_kept_across_runs_never_goes_down_and_a_site_that_lost_it_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger-heads.json"
    LedgerBook(path, "fed").record({"a": _report(1.5), "b": _report(0.5)})
    book = LedgerBook(path, "fed")  # a later run reads it again
    assert book.heads()["a"].length == 3
    book.record({"a": _report(0.2, length=1, ledger="L2")})  # a spend never goes down in the book
    book = LedgerBook(path, "fed")
    reason = book.check("a", _report(0.0, length=1, ledger="L3"))
    assert reason is not None and "recorded ε 1.5" in reason and "\n" not in reason
    assert book.check("b", _report(0.5)) is None and book.check("new", _report(0.0)) is None
    assert LedgerBook(path, "other-federation").heads() == {}  # books are kept per federation


def test_a_book_that_does_not_parse_is_one_line_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "ledger-heads.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable ledger book") as info:
        LedgerBook(path, "fed")
    assert "\n" not in str(info.value) and path.read_text() == "{not json"
