"""Unit tests of :class:`fedshard.privacy.ledger.PrivacyLedger`.

Most use the RDP accountant (milliseconds per composition); a few use the default
PRV accountant with short histories.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedshard.errors import BudgetExhaustedError, ConfigError, PrivacyError, StoreError
from fedshard.privacy.accountant import AccountantKind, epsilon
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import MAX_PROJECTED_ROUNDS, UNKEYED, Budget, PrivacyLedger

RDP = AccountantKind.RDP
RECORD = Guarantee.RECORD
UPDATE = Guarantee.UPDATE
BUDGET = Budget(epsilon=4.0, delta=1e-5)
SGD = DPEvent(RECORD, 1.2, 0.02, 50)  # ~1.03 ε (RDP) for the first round, ~2.2 after ten
NOISY_UPDATE = DPEvent(UPDATE, 2.0, 1.0, 1)


class FakeClock:
    def __init__(self) -> None:
        self._ticks = itertools.count(1000)

    def __call__(self) -> float:
        return float(next(self._ticks))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "site" / "privacy.sqlite"


@pytest.fixture
def ledger(path: Path) -> Iterator[PrivacyLedger]:
    with PrivacyLedger(path, BUDGET, accountant=RDP, clock=FakeClock()) as opened:
        yield opened


def _open(path: Path, budget: Budget = BUDGET) -> PrivacyLedger:
    return PrivacyLedger(path, budget, accountant=RDP)


# -- budget ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eps", "delta"), [(0.0, 1e-5), (-1.0, 1e-5), (float("inf"), 1e-5), (float("nan"), 1e-5), (1.0, 0.0), (1.0, 1.0)]
)
def test_budget_refuses_bad_values_in_one_line(eps: float, delta: float) -> None:
    with pytest.raises(ConfigError) as info:
        Budget(eps, delta)
    assert "\n" not in str(info.value)


# -- reserve, commit, status -----------------------------------------------------------


def test_new_ledger_has_spent_nothing(ledger: PrivacyLedger, path: Path) -> None:
    status = ledger.status()

    assert path.is_file()
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left
    assert ledger.budget == BUDGET
    assert status.spent == {RECORD: 0.0, UPDATE: 0.0}
    assert status.remaining == {RECORD: 4.0, UPDATE: 4.0}
    assert (status.rounds_participated, status.pending, status.projected_rounds_left) == (0, (), None)
    assert status.can_afford_next
    assert ledger.entries() == []


def test_reserve_then_commit(ledger: PrivacyLedger) -> None:
    reservation = ledger.reserve(0, [SGD, NOISY_UPDATE])

    expected_record = epsilon([SGD], BUDGET.delta, RDP)
    assert reservation.round == 0
    assert len(reservation.seqs) == 2
    assert reservation.epsilon_after == {
        RECORD: expected_record,
        UPDATE: epsilon([NOISY_UPDATE], BUDGET.delta, RDP),
    }
    assert ledger.status().pending == (0,)
    assert [entry.committed for entry in ledger.entries()] == [False, False]

    ledger.commit(reservation)
    ledger.commit(reservation)  # idempotent

    entries = ledger.entries()
    assert [entry.committed for entry in entries] == [True, True]
    assert [entry.event for entry in entries] == [SGD, NOISY_UPDATE]
    assert entries[0].created_at == entries[1].created_at >= 1000.0  # the injected clock, one tick
    assert entries[0].epsilon_after == expected_record
    assert entries[0].delta == BUDGET.delta
    status = ledger.status()
    assert status.pending == ()
    assert status.rounds_participated == 1
    assert status.spent[RECORD] == expected_record
    assert status.remaining[RECORD] == pytest.approx(4.0 - expected_record)


def test_what_a_reservation_anchors_includes_its_spend_and_a_commit_anchors_nothing(path: Path) -> None:
    """``on_grow`` sees the reservation's events (the site anchors them before it releases); a commit
    row changes no spend, so it is not anchored, and it is kept like any row."""
    grown: list[tuple[int, list[float]]] = []
    hook = lambda head, snap: grown.append((head.length, [e.epsilon_after for e in snap.entries]))  # noqa: E731
    with PrivacyLedger(path, BUDGET, accountant=RDP, on_grow=hook) as ledger:
        reservation = ledger.reserve(0, [SGD])
        assert grown[-1][1] == [reservation.epsilon_after[RECORD]]
        seen = len(grown)
        ledger.commit(reservation)
        assert len(grown) == seen
    with _open(path) as reopened:
        assert [entry.committed for entry in reopened.entries()] == [True]


def test_spent_composes_all_rounds(ledger: PrivacyLedger) -> None:
    ledger.commit(ledger.reserve(0, [SGD]))
    ledger.reserve(1, [SGD])

    assert ledger.spent(RECORD) == epsilon([SGD, SGD], BUDGET.delta, RDP)
    assert ledger.spent(RECORD) > epsilon([SGD], BUDGET.delta, RDP)
    assert ledger.spent(UPDATE) == 0.0
    assert ledger.cost([SGD]) == {RECORD: epsilon([SGD] * 3, BUDGET.delta, RDP)}
    assert ledger.cost([NOISY_UPDATE]) == {UPDATE: epsilon([NOISY_UPDATE], BUDGET.delta, RDP)}


def test_overrunning_the_budget_is_refused_and_nothing_is_written(ledger: PrivacyLedger, path: Path) -> None:
    ledger.commit(ledger.reserve(0, [SGD]))
    before = ledger.entries()
    greedy = DPEvent(RECORD, 0.8, 0.2, 100)

    with pytest.raises(BudgetExhaustedError) as info:
        ledger.reserve(1, [NOISY_UPDATE, greedy])

    message = str(info.value)
    assert "\n" not in message
    assert "record" in message
    assert "nothing was released" in message
    assert isinstance(info.value, PermissionError)
    assert ledger.entries() == before
    assert ledger.status().rounds_participated == 1
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT count(*) FROM events").fetchone() == (1,)
    ledger.reserve(1, [NOISY_UPDATE])  # the round itself was not burnt


def test_a_round_is_reserved_once(ledger: PrivacyLedger) -> None:
    ledger.reserve(3, [SGD])
    with pytest.raises(PrivacyError, match="round 3 already has a reservation"):
        ledger.reserve(3, [NOISY_UPDATE])
    assert len(ledger.entries()) == 1


@pytest.mark.parametrize("bad_round", [-1, 1.0, True, "2"])
def test_bad_round_is_refused(ledger: PrivacyLedger, bad_round: object) -> None:
    with pytest.raises(PrivacyError, match="round"):
        ledger.reserve(bad_round, [SGD])  # type: ignore[arg-type]


def test_empty_reservation_is_refused(ledger: PrivacyLedger) -> None:
    with pytest.raises(PrivacyError, match="at least one"):
        ledger.reserve(0, [])
    assert ledger.entries() == []


def test_commit_of_an_unknown_reservation_is_refused(ledger: PrivacyLedger) -> None:
    reservation = ledger.reserve(0, [SGD])
    with pytest.raises(PrivacyError, match="no reservation"):
        ledger.commit(type(reservation)(round=1, seqs=reservation.seqs, epsilon_after={}))
    with pytest.raises(PrivacyError, match="no reservation"):
        ledger.commit(type(reservation)(round=0, seqs=(99,), epsilon_after={}))
    assert ledger.status().pending == (0,)


def test_uncommitted_reservation_counts_after_reopen(path: Path) -> None:
    with _open(path) as first:
        first.commit(first.reserve(0, [SGD]))
        first.reserve(1, [SGD])  # released? nobody knows: the process "died" before commit
        spent = first.spent(RECORD)

    with _open(path) as second:
        assert second.spent(RECORD) == spent == epsilon([SGD, SGD], BUDGET.delta, RDP)
        assert second.status().pending == (1,)
        assert second.status().rounds_participated == 2


def test_status_to_dict_is_json(ledger: PrivacyLedger) -> None:
    ledger.reserve(0, [SGD])
    data = ledger.status([SGD]).to_dict()

    assert json.loads(json.dumps(data)) == data
    assert data["budget"] == {"epsilon": 4.0, "delta": 1e-5}
    assert data["accountant"] == "rdp"
    assert set(data["spent"]) == {"record", "update"}
    assert data["pending"] == [0]


# -- projection ----------------------------------------------------------------------


@pytest.mark.parametrize("next_round", [[SGD], [SGD, NOISY_UPDATE], [DPEvent(UPDATE, 1.2, 1.0, 1)]])
def test_projected_rounds_left_matches_reserving_until_refused(path: Path, next_round: list[DPEvent]) -> None:
    with _open(path) as ledger:
        ledger.reserve(0, [DPEvent(RECORD, 1.3, 0.05, 20)])
        projected = ledger.status(next_round).projected_rounds_left
        assert projected is not None and projected >= 1

        reserved = 0
        for round_ in itertools.count(1):
            try:
                ledger.reserve(round_, next_round)
            except BudgetExhaustedError:
                break
            reserved += 1
        assert reserved == projected
        assert ledger.status(next_round).projected_rounds_left == 0
        assert not ledger.status(next_round).can_afford_next


@pytest.mark.parametrize("hint", [None, 0, 1, 3, 6, 7, 40, 5_000, MAX_PROJECTED_ROUNDS])
def test_a_projection_hint_changes_the_work_never_the_answer(
    path: Path, hint: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedshard.privacy.ledger import spend

    next_round = [SGD, NOISY_UPDATE]
    with _open(path) as ledger:
        ledger.reserve(0, [DPEvent(RECORD, 1.3, 0.05, 20)])
        expected = ledger.status(next_round).projected_rounds_left
        calls: list[int] = []
        real_cost = spend.cost
        monkeypatch.setattr(spend, "cost", lambda *a: calls.append(1) or real_cost(*a))
        assert ledger.status(next_round, hint).projected_rounds_left == expected
        assert expected is not None and expected > 1
        calls.clear()
        assert ledger.status(next_round, expected).projected_rounds_left == expected
        assert len(calls) == 2  # the right guess: one composition that fits, one that does not


@pytest.mark.parametrize(
    ("budget", "next_round", "spent"),
    [
        (4.0, [SGD], ()),
        (50.0, [DPEvent(RECORD, 1.0, 0.25, 4)], ()),
        (8.0, [SGD, NOISY_UPDATE], (DPEvent(RECORD, 1.3, 0.05, 20),)),
        (1.0, [DPEvent(UPDATE, 50.0, 1.0, 1)], ()),  # ε nearly linear in k: the model is poor, bisection steps in
        (0.5, [DPEvent(UPDATE, 1.0, 1.0, 1)], ()),  # not even one round
    ],
)
def test_a_projection_is_the_last_round_that_fits_and_takes_few_compositions(
    budget: float, next_round: list[DPEvent], spent: tuple[DPEvent, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedshard.privacy.ledger import spend
    from fedshard.privacy.ledger.records import LedgerEntry

    rdp = AccountantKind.RDP
    entries = tuple(LedgerEntry(1, 0, e, epsilon([e], 1e-5, rdp), 1e-5, True, 0.0) for e in spent)
    snapshot = spend.Snapshot(Budget(budget, 1e-5), entries)

    def fits(k: int) -> bool:
        scaled = [DPEvent(e.guarantee, e.noise_multiplier, e.sample_rate, e.steps * k) for e in next_round]
        return all(v <= budget for v in spend.cost(snapshot, scaled, rdp).values())

    calls: list[int] = []
    real_cost = spend.cost
    monkeypatch.setattr(spend, "cost", lambda *a: calls.append(1) or real_cost(*a))
    k = spend.project(snapshot, next_round, rdp)
    assert len(calls) <= max(6, k.bit_length())  # doubling from 1, then bisecting, took about 2·log2(k)
    monkeypatch.setattr(spend, "cost", real_cost)
    assert (k == 0 or fits(k)) and not fits(k + 1)


def test_projection_is_capped(ledger: PrivacyLedger) -> None:
    assert ledger.status([DPEvent(UPDATE, 500.0, 0.001, 1)]).projected_rounds_left == MAX_PROJECTED_ROUNDS


# -- budget changes --------------------------------------------------------------------


def test_budget_can_be_lowered_never_raised(path: Path) -> None:
    with _open(path) as ledger:
        assert ledger.lower_budget(Budget(3.0, 1e-5)) == Budget(3.0, 1e-5)
        assert ledger.lower_budget(Budget(9.0, 1e-3)) == Budget(3.0, 1e-5)  # kept its own
        assert ledger.lower_budget(Budget(5.0, 1e-6)) == Budget(3.0, 1e-6)  # δ and ε each kept at the min
        assert ledger.budget == Budget(3.0, 1e-6)

    with _open(path, Budget(100.0, 0.1)) as reopened:  # a higher budget at open is ignored
        assert reopened.budget == Budget(3.0, 1e-6)
    with _open(path, Budget(2.0, 0.1)) as reopened:  # a lower one at open lowers it
        assert reopened.budget == Budget(2.0, 1e-6)
    with _open(path) as reopened:
        assert reopened.budget == Budget(2.0, 1e-6)


def test_lowering_below_the_spend_blocks_every_further_round(ledger: PrivacyLedger) -> None:
    ledger.reserve(0, [SGD])
    spent = ledger.spent(RECORD)
    ledger.lower_budget(Budget(spent / 2, BUDGET.delta))

    with pytest.raises(BudgetExhaustedError):
        ledger.reserve(1, [DPEvent(RECORD, 50.0, 0.001, 1)])
    status = ledger.status([DPEvent(RECORD, 50.0, 0.001, 1)])
    assert status.remaining[RECORD] == 0.0
    assert status.projected_rounds_left == 0


def test_lowering_delta_raises_the_reported_spend(ledger: PrivacyLedger) -> None:
    ledger.reserve(0, [SGD])
    before = ledger.spent(RECORD)
    ledger.lower_budget(Budget(BUDGET.epsilon, 1e-9))
    assert ledger.spent(RECORD) > before


def test_the_file_itself_refuses_raising_the_budget_or_rewriting_history(ledger: PrivacyLedger, path: Path) -> None:
    ledger.commit(ledger.reserve(0, [SGD]))
    raw = sqlite3.connect(path)
    try:
        for statement in (
            "UPDATE budgets SET epsilon = 1000.0",
            "DELETE FROM budgets",
            "INSERT INTO budgets (pos, epsilon, delta, set_at, mac) VALUES (99, 1000.0, 0.5, 0, x'00')",
            "UPDATE meta SET value = 3 WHERE key = 'format'",
            "DELETE FROM meta WHERE key = 'accountant'",
            "UPDATE events SET steps = 1",
            "DELETE FROM events",
            "DELETE FROM commits",
        ):
            with pytest.raises(sqlite3.DatabaseError):
                raw.execute(statement)
    finally:
        raw.close()
    assert ledger.budget == BUDGET
    assert len(ledger.entries()) == 1


def test_an_open_ledger_checks_its_chain_again_only_when_the_file_changed(
    ledger: PrivacyLedger, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedshard.privacy.ledger import _rows

    loads: list[int] = []
    load = _rows.load
    monkeypatch.setattr(_rows, "load", lambda *a: loads.append(1) or load(*a))
    ledger.commit(ledger.reserve(0, [SGD]))
    assert len(ledger.entries()) == 1  # checked again after the write
    loads.clear()
    for _ in range(3):  # reads of an unchanged file: the chain checked last time stands
        assert ledger.budget == BUDGET and len(ledger.entries()) == 1 and ledger.contains(ledger.head())
    assert not loads
    ledger.reserve(1, [SGD])  # this connection's own write: checked once after it
    assert len(ledger.entries()) == 2 and len(ledger.entries()) == 2
    assert len(loads) == 1
    raw = sqlite3.connect(path)  # another connection appends a row it cannot MAC
    try:
        raw.execute(
            "INSERT INTO events (seq, round, mechanism, guarantee, noise_multiplier, sample_rate, steps, delta,"
            " epsilon_after, created_at, pos, mac) VALUES (9, 9, 'gaussian', 'record', 1.0, 1.0, 1, 1e-5, 0.1, 0, 99,"
            " x'00')"
        )
        raw.commit()
    finally:
        raw.close()
    with pytest.raises(StoreError, match=r"rows were removed or inserted|does not match its MAC"):
        ledger.entries()


# -- files that are not a healthy ledger -----------------------------------------------


def _filled(path: Path) -> bytes:
    with _open(path) as ledger:
        for round_ in range(40):
            ledger.commit(ledger.reserve(round_, [DPEvent(RECORD, 5.0 + round_, 0.001, 1)]))
    return path.read_bytes()


def _assert_refused_untouched(path: Path, content: bytes) -> None:
    with pytest.raises(StoreError) as info:
        _open(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert path.read_bytes() == content


def test_garbage_file_is_refused_and_left_untouched(path: Path) -> None:
    path.parent.mkdir(parents=True)
    content = bytes(range(256)) * 64
    path.write_bytes(content)
    _assert_refused_untouched(path, content)
    with pytest.raises(StoreError, match="do not delete it"):
        _open(path)


def test_empty_file_is_refused_not_reinitialised(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    _assert_refused_untouched(path, b"")


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_ledger_is_refused_and_left_untouched(path: Path, keep: float) -> None:
    content = _filled(path)
    assert len(content) > 4 * 4096
    truncated = content[: int(len(content) * keep)]
    path.write_bytes(truncated)
    _assert_refused_untouched(path, truncated)


def test_overwritten_pages_are_refused(path: Path) -> None:
    content = bytearray(_filled(path))
    content[4096 * 2 : 4096 * 3] = b"\xa5" * 4096
    path.write_bytes(bytes(content))
    _assert_refused_untouched(path, bytes(content))


def test_other_sqlite_database_is_refused(path: Path) -> None:
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE patients (id INTEGER)")
    raw.close()
    content = path.read_bytes()
    _assert_refused_untouched(path, content)


def test_newer_format_is_refused(path: Path) -> None:
    _open(path).close()
    raw = sqlite3.connect(path)
    raw.execute("DROP TRIGGER meta_no_update")  # as a future fedshard's migration would
    raw.execute("UPDATE meta SET value = 3 WHERE key = 'format'")
    raw.commit()
    raw.close()
    content = path.read_bytes()

    _assert_refused_untouched(path, content)
    with pytest.raises(StoreError, match="upgrade fedshard"):
        _open(path)


def test_unknown_mechanism_in_a_row_is_refused(path: Path) -> None:
    with _open(path) as ledger:
        ledger.reserve(0, [SGD])
        head = ledger.head()
    # as a future fedshard would write it: a well-formed, chained row of a mechanism this one does not know
    values = (head.length + 1, 2, 1, "laplace", "record", 1.0, 1.0, 1, 1e-5, 1.0, 0.0)
    mac = UNKEYED.mac(bytes.fromhex(head.mac), "event", values)
    raw = sqlite3.connect(path)
    raw.execute(
        "INSERT INTO events (pos, seq, round, mechanism, guarantee, noise_multiplier, sample_rate, steps, delta,"
        " epsilon_after, created_at, mac) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (*values, mac),
    )
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="laplace"):  # refused when opened: every row is read and checked
        _open(path)


def test_closed_ledger_says_so(path: Path) -> None:
    ledger = _open(path)
    ledger.close()
    ledger.close()
    with pytest.raises(StoreError, match="closed"):
        ledger.status()


# -- the default accountant ------------------------------------------------------------


def test_prv_ledger_reserves_and_projects(path: Path) -> None:
    event = DPEvent(RECORD, 1.0, 0.1, 10)
    with PrivacyLedger(path, Budget(5.0, 1e-5)) as ledger:  # ~2.9 ε per round of `event`
        assert ledger.accountant == AccountantKind.PRV
        reservation = ledger.reserve(0, [event])
        ledger.commit(reservation)

        assert reservation.epsilon_after[RECORD] == epsilon([event], 1e-5)
        projected = ledger.status([event]).projected_rounds_left
        assert projected is not None and projected >= 1
        ledger.reserve(1, [DPEvent(RECORD, 1.0, 0.1, 10 * projected)])  # exactly what fits
        with pytest.raises(BudgetExhaustedError):
            ledger.reserve(2, [event])


def test_reopening_with_another_accountant_never_reports_less(path: Path) -> None:
    with _open(path) as rdp:
        rdp.reserve(0, [SGD])
        rdp_spent = rdp.spent(RECORD)
    with PrivacyLedger(path, BUDGET) as prv:  # PRV is tighter, but the ledger recorded the RDP value
        assert prv.spent(RECORD) == rdp_spent
