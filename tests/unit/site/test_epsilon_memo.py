"""A site keeps the ε it composed between its processes, each entry authenticated with its ledger key:
a fresh process takes them instead of running the accountant, and an edited entry is composed again."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import fedshard.privacy.accountant as accountant
from fedshard.privacy.accountant import AccountantKind, epsilon
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger.chain import LedgerKey
from fedshard.site._epsilon_memo import EPSILON_FILE, EpsilonMemo

RDP = AccountantKind("rdp")
EVENTS = [DPEvent(Guarantee.RECORD, 1.3, 0.05, 40), DPEvent(Guarantee.RECORD, 1.3, 0.05, 20)]


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """The accountant's memory emptied (as in a new process); the compositions it runs, listed."""
    monkeypatch.setattr(accountant, "_MEMO", {})
    ran: list[object] = []
    real = accountant._run

    def counted(*args: object) -> float:
        ran.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(accountant, "_run", counted)
    yield ran


def _new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accountant, "_MEMO", {})


def _one_message(folder: Path, key: LedgerKey) -> float:
    """A message that composes EVENTS: the memo loaded first, saved after."""
    memo = EpsilonMemo(folder, key)
    memo.load()
    value = epsilon(EVENTS, 1e-5, RDP)
    memo.save()
    return value


def test_a_fresh_process_takes_the_kept_epsilon_instead_of_composing(
    tmp_path: Path, fresh_process: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = LedgerKey(os.urandom(32))
    value = _one_message(tmp_path, key)
    assert len(fresh_process) == 1 and (tmp_path / EPSILON_FILE).exists()
    _new_process(monkeypatch)
    EpsilonMemo(tmp_path, key).load()
    assert epsilon(EVENTS, 1e-5, RDP) == value and len(fresh_process) == 1  # taken, not composed
    # a message that composed nothing writes nothing
    before = (tmp_path / EPSILON_FILE).stat().st_mtime_ns
    _one_message(tmp_path, key)
    assert (tmp_path / EPSILON_FILE).stat().st_mtime_ns == before


def test_an_edited_or_foreign_entry_is_composed_again(
    tmp_path: Path, fresh_process: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = LedgerKey(os.urandom(32))
    value = _one_message(tmp_path, key)
    path = tmp_path / EPSILON_FILE
    doc = json.loads(path.read_text())
    doc["entries"][0][1] = repr(value / 10)  # a lower ε, the MAC left as it was
    path.write_text(json.dumps(doc))
    _new_process(monkeypatch)
    EpsilonMemo(tmp_path, key).load()
    assert epsilon(EVENTS, 1e-5, RDP) == value and len(fresh_process) == 2  # composed again, the true value
    # a file written under another site's key counts for nothing
    _new_process(monkeypatch)
    path.write_text(json.dumps({"format": 1, "entries": doc["entries"]}))
    EpsilonMemo(tmp_path, LedgerKey(os.urandom(32))).load()
    epsilon(EVENTS, 1e-5, RDP)
    assert len(fresh_process) == 3
    path.write_text("not json")  # an unreadable file: none taken, the site goes on
    _new_process(monkeypatch)
    EpsilonMemo(tmp_path, key).load()
    assert epsilon(EVENTS, 1e-5, RDP) == value and len(fresh_process) == 4
