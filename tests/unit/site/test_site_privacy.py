"""A site's privacy bookkeeping: effective budget, δ check, calibration, reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedshard.config import BudgetConfig
from fedshard.errors import ConfigError
from fedshard.privacy.accountant import AccountantKind, epsilon
from fedshard.privacy.events import Guarantee
from fedshard.protocol.messages import PrivacyPlan, PrivacyStatus, RecordPlan, UpdatePlan
from fedshard.site.privacy import SitePrivacy
from fedshard.site.terms import PrivacyTerms


def _plan(eps: float = 3.0, delta: float = 1e-5, sigma: float | None = 1.5, update: bool = False) -> PrivacyPlan:
    return PrivacyPlan(
        accountant=AccountantKind.RDP,
        epsilon=eps,
        delta=delta,
        batch_size=10,
        epochs=1,
        record=RecordPlan(noise_multiplier=sigma, max_grad_norm=1.0, planned_rounds=5),
        update=UpdatePlan(clip_norm=1.0, noise_multiplier=2.0) if update else None,
    )


def test_site_cap_is_stricter_and_says_so(tmp_path: Path) -> None:
    site = SitePrivacy("s1", tmp_path, PrivacyTerms(budget=BudgetConfig(epsilon=1.0, delta=1e-6)))
    budget, note = site.effective_budget(_plan(eps=3.0))
    assert (budget.epsilon, budget.delta) == (1.0, 1e-6)
    assert "keeps its cap ε=1" in note
    budget, note = site.effective_budget(_plan(eps=0.5))
    assert budget.epsilon == 0.5 and note == ""


def test_aggregator_can_lower_but_never_raise(tmp_path: Path) -> None:
    site = SitePrivacy("s1", tmp_path)
    ledger, _ = site.open_ledger(_plan(eps=2.0), num_examples=100)
    ledger.close()
    ledger, note = site.open_ledger(_plan(eps=5.0), num_examples=100)
    with ledger:
        assert ledger.budget.epsilon == 2.0
    assert "keeps its earlier, lower budget ε=2" in note
    ledger, _ = site.open_ledger(_plan(eps=1.0), num_examples=100)
    with ledger:
        assert ledger.budget.epsilon == 1.0


def test_delta_above_one_over_records_is_refused(tmp_path: Path) -> None:
    site = SitePrivacy("s1", tmp_path)
    with pytest.raises(ConfigError, match=r"δ=0.05 is larger than 1/\(its 100 records\)"):
        site.open_ledger(_plan(delta=0.05), num_examples=100)
    assert not site.ledger_path.exists()


def test_round_events_cover_both_guarantees(tmp_path: Path) -> None:
    site = SitePrivacy("s1", tmp_path)
    ledger, _ = site.open_ledger(_plan(update=True), num_examples=95)
    with ledger:
        events = site.round_events(_plan(update=True), ledger, num_examples=95)
    assert [e.guarantee for e in events] == [Guarantee.RECORD, Guarantee.UPDATE]
    assert events[0].sample_rate == pytest.approx(0.1) and events[0].steps == 10


def test_calibrated_sigma_spends_the_budget_over_the_planned_rounds_and_is_cached(tmp_path: Path) -> None:
    site = SitePrivacy("s1", tmp_path)
    plan = _plan(eps=2.0, sigma=None)
    ledger, _ = site.open_ledger(plan, num_examples=100)
    with ledger:
        first = site.round_events(plan, ledger, num_examples=100)[0]
        again = site.round_events(plan, ledger, num_examples=100)[0]
    assert first == again
    assert (tmp_path / "privacy-calibration.json").exists()
    total = epsilon([first] * 5, 1e-5, AccountantKind.RDP)
    assert 1.9 <= total <= 2.0


def test_report_marks_exhaustion(tmp_path: Path) -> None:
    site = SitePrivacy("s1", tmp_path)
    plan = _plan(eps=1.0, sigma=0.8)
    ledger, _ = site.open_ledger(plan, num_examples=100)
    with ledger:
        events = site.round_events(plan, ledger, num_examples=100)
        report = site.report(ledger, events)
        assert report.status is PrivacyStatus.EXHAUSTED and not report.can_afford_next
        assert report.epsilon_spent == 0.0 and report.epsilon_budget == 1.0


def test_a_format_1_ledger_is_refused_then_recovered_with_its_spend(tmp_path: Path) -> None:
    import os
    import sqlite3

    from fedshard.errors import StoreError
    from fedshard.privacy.ledger import CARRIED_ROUND, LedgerKey
    from fedshard.site.ledger_anchor import FileAnchor

    path = tmp_path / "ledger.sqlite"
    raw = sqlite3.connect(path)  # what fedshard wrote before ledgers were authenticated
    raw.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL);"
        "CREATE TABLE events (seq INTEGER PRIMARY KEY, round INTEGER, mechanism TEXT, guarantee TEXT,"
        " noise_multiplier REAL, sample_rate REAL, steps INTEGER, delta REAL, epsilon_after REAL, created_at REAL);"
        "CREATE TABLE commits (seq INTEGER PRIMARY KEY, committed_at REAL);"
        "INSERT INTO meta VALUES ('format', 1), ('created_at', 0.0), ('accountant', 'rdp'),"
        " ('budget_epsilon', 3.0), ('budget_delta', 1e-5);"
        "INSERT INTO events VALUES (1, 1, 'poisson_subsampled_gaussian', 'record', 1.5, 0.1, 10, 1e-5, 1.25, 0.0);"
    )
    raw.commit()
    raw.close()
    key = LedgerKey(os.urandom(32))
    site = SitePrivacy("s1", tmp_path, key=key, anchor=FileAnchor(tmp_path / "anchor", key))
    with pytest.raises(StoreError, match=r"format 1.*fedshard budget recover"):
        site.open_ledger(_plan(), num_examples=100)
    assert "carrying" in site.recover()
    ledger, _ = site.open_ledger(_plan(), num_examples=100)
    with ledger:
        assert [e.round for e in ledger.entries()] == [CARRIED_ROUND]
        assert ledger.spent(Guarantee.RECORD) >= 1.25
    assert any(p.name.startswith("ledger.sqlite.replaced-") for p in tmp_path.iterdir())
