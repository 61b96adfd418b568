"""Unit tests of :mod:`fedshard.privacy.accountant` against Opacus's own accountants."""

from __future__ import annotations

import subprocess
import sys
import warnings
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import PRVAccountant, RDPAccountant  # type: ignore[import-untyped]

from fedshard.errors import PrivacyError
from fedshard.privacy.accountant import AccountantKind, calibrate_noise, epsilon, merge_events, on_grid
from fedshard.privacy.events import DPEvent, Guarantee
from tests.toy_parts import ZeroConcentrated

RDP = AccountantKind.RDP
PRV = AccountantKind.PRV


def _event(sigma: float, q: float, steps: int, guarantee: Guarantee = Guarantee.RECORD) -> DPEvent:
    return DPEvent(guarantee, sigma, q, steps)


def _opacus(accountant: RDPAccountant | PRVAccountant, history: list[tuple[float, float, int]]) -> float:
    accountant.history = history
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta=1e-5))


def test_rdp_known_value_matches_opacus() -> None:
    eps = epsilon([_event(1.1, 0.1, 200)], 1e-5, RDP)

    assert eps == pytest.approx(9.25, abs=0.05)
    assert eps == pytest.approx(_opacus(RDPAccountant(), [(1.1, 0.1, 200)]), rel=1e-12)


def test_prv_known_value_matches_opacus_and_is_tighter_than_rdp() -> None:
    eps = epsilon([_event(1.1, 0.1, 200)], 1e-5)

    assert eps == pytest.approx(_opacus(PRVAccountant(), [(1.1, 0.1, 200)]), rel=1e-9)
    assert 8.0 < eps < epsilon([_event(1.1, 0.1, 200)], 1e-5, RDP)


def test_merging_equal_events_gives_the_same_epsilon_as_opacus_unmerged() -> None:
    split = [_event(1.1, 0.1, 20)] * 10 + [_event(2.0, 0.05, 7), _event(2.0, 0.05, 3)]
    unmerged = [(e.noise_multiplier, e.sample_rate, e.steps) for e in split]

    assert merge_events(split) == ((1.1, 0.1, 200), (2.0, 0.05, 10))
    assert epsilon(split, 1e-5, RDP) == pytest.approx(_opacus(RDPAccountant(), unmerged), rel=1e-9)
    assert epsilon(split, 1e-5, RDP) == epsilon([_event(1.1, 0.1, 200), _event(2.0, 0.05, 10)], 1e-5, RDP)


def test_merge_is_canonical_whatever_the_order() -> None:
    a, b, c = _event(1.0, 0.1, 5), _event(3.0, 0.2, 1), _event(1.0, 0.1, 2)
    assert merge_events([a, b, c]) == merge_events([c, b, a]) == ((1.0, 0.1, 7), (3.0, 0.2, 1))


def test_no_events_spend_nothing() -> None:
    assert epsilon([], 1e-5) == 0.0
    assert epsilon((), 1e-5, RDP) == 0.0


def test_guarantees_do_not_compose() -> None:
    with pytest.raises(PrivacyError, match="record and update"):
        epsilon([_event(1.0, 0.1, 5), _event(1.0, 0.1, 5, Guarantee.UPDATE)], 1e-5, RDP)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 2, float("nan")])
def test_bad_delta_is_refused(delta: float) -> None:
    with pytest.raises(PrivacyError, match="delta"):
        epsilon([_event(1.0, 0.1, 5)], delta, RDP)


def test_large_noise_uses_wider_orders_quietly() -> None:
    # Opacus's default orders stop at 63: its bound is ~0.10 here and it warns.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eps = epsilon([_event(100.0, 0.001, 100)], 1e-5, RDP)
        epsilon([_event(0.8, 1.0, 3)], 1e-5, PRV)  # q = 1: numpy log(0) inside Opacus's PRV

    assert eps < 0.01
    assert eps < _opacus(RDPAccountant(), [(100.0, 0.001, 100)])


@settings(max_examples=40, deadline=None)
@given(
    sigma=st.sampled_from([0.7, 1.0, 1.5, 4.0]),
    q=st.sampled_from([0.01, 0.1, 1.0]),
    steps=st.integers(1, 500),
    more=st.integers(1, 500),
    delta=st.sampled_from([1e-3, 1e-5, 1e-8]),
)
def test_more_steps_spend_more(sigma: float, q: float, steps: int, more: int, delta: float) -> None:
    assert epsilon([_event(sigma, q, steps)], delta, RDP) < epsilon([_event(sigma, q, steps + more)], delta, RDP)


@settings(max_examples=30, deadline=None)
@given(sigma=st.sampled_from([0.7, 1.0, 1.5]), q=st.sampled_from([0.01, 0.1]), steps=st.integers(1, 200))
def test_smaller_delta_costs_more_epsilon(sigma: float, q: float, steps: int) -> None:
    event = _event(sigma, q, steps)
    assert epsilon([event], 1e-4, RDP) < epsilon([event], 1e-7, RDP)


@pytest.mark.parametrize(
    ("target", "q", "steps"),
    [(1.0, 0.01, 100), (3.0, 0.05, 100), (8.0, 1.0, 10), (0.3, 0.001, 1000)],
)
def test_calibrate_noise_spends_at_most_the_target_and_close_to_it(target: float, q: float, steps: int) -> None:
    sigma = calibrate_noise(target, 1e-5, q, steps, RDP)
    spent = epsilon([_event(sigma, q, steps)], 1e-5, RDP)

    assert spent <= target
    assert spent >= 0.95 * target


def test_calibrate_noise_with_prv() -> None:
    sigma = calibrate_noise(2.0, 1e-5, 0.1, 20)
    spent = epsilon([_event(sigma, 0.1, 20)], 1e-5, PRV)

    assert 0.95 * 2.0 <= spent <= 2.0
    assert on_grid(sigma) == sigma and len(Decimal(repr(sigma)).normalize().as_tuple().digits) <= 4


@given(st.floats(min_value=1e-4, max_value=1e6))
@settings(max_examples=300, deadline=None)
def test_sigma_on_its_grid_is_never_less_and_stays_there(sigma: float) -> None:
    # sites whose accountants differ in the last bits calibrate the same σ: a part in 10^4 apart
    # land on one grid point, never below the σ computed, and a grid point is its own rounding
    rounded = on_grid(sigma)
    assert sigma <= rounded <= sigma * (1 + 1.0001e-3)
    assert on_grid(rounded) == rounded
    assert on_grid(float(f"{sigma:.4g}")) == float(f"{sigma:.4g}")


@pytest.mark.parametrize(
    ("target", "delta", "q", "steps"),
    [
        (0.0, 1e-5, 0.1, 10),
        (float("inf"), 1e-5, 0.1, 10),
        (1.0, 0.0, 0.1, 10),
        (1.0, 1e-5, 0.0, 10),
        (1.0, 1e-5, 0.1, 0),
    ],
)
def test_calibrate_noise_refuses_bad_arguments(target: float, delta: float, q: float, steps: int) -> None:
    with pytest.raises(PrivacyError):
        calibrate_noise(target, delta, q, steps, RDP)


def test_importing_the_accountant_does_not_import_opacus() -> None:
    code = "import sys, fedshard.privacy.accountant, fedshard.privacy.ledger; print('opacus' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_new_accountant_is_one_class_and_one_registration(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import math

    from fedshard.errors import ConfigError
    from fedshard.privacy.accountants import ACCOUNTANTS, register
    from fedshard.privacy.ledger import Budget, PrivacyLedger

    register(ZeroConcentrated())
    try:
        eps = epsilon([_event(4.0, 0.1, 8)], 1e-5, "zcdp")
        rho = 8 / 32
        assert eps == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1e5)))
        sigma = calibrate_noise(3.0, 1e-5, 0.1, 8, "zcdp")  # by bisection
        assert epsilon([_event(sigma, 0.1, 8)], 1e-5, "zcdp") <= 3.0
        assert epsilon([_event(sigma * 0.98, 0.1, 8)], 1e-5, "zcdp") > 3.0  # within 2 % of the least σ
        with PrivacyLedger(tmp_path / "ledger.sqlite", Budget(3.0, 1e-5), accountant=AccountantKind("zcdp")) as ledger:
            assert ledger.accountant == "zcdp"
        with pytest.raises(ConfigError, match="already registered"):
            register(ZeroConcentrated())
    finally:
        ACCOUNTANTS.remove("zcdp")
    with pytest.raises(ConfigError, match=r"accountant 'zcdp': no such accountant \(prv, rdp\)"):
        epsilon([_event(4.0, 0.1, 8)], 1e-5, "zcdp")


def test_one_step_rdp_is_remembered_and_changes_no_epsilon() -> None:
    from opacus.accountants.analysis import rdp as analysis  # type: ignore[import-untyped]

    from fedshard.privacy._opacus_internals import memoise_one_step_rdp

    history = [(1.3, 0.37, 40), (0.9, 0.11, 7)]
    value = epsilon([_event(*h) for h in history], 1e-5, PRV)  # installs the memo
    assert memoise_one_step_rdp() and hasattr(analysis._compute_rdp, "cache_info")
    original = analysis._compute_rdp.__wrapped__
    for order in (1.5, 2.0, 7.3, 64.0):  # the memo returns what Opacus computes
        assert analysis._compute_rdp(0.37, 1.3, order) == original(0.37, 1.3, order)
    assert value == pytest.approx(_opacus(PRVAccountant(), history), rel=1e-12)
    hits = analysis._compute_rdp.cache_info().hits
    epsilon([_event(1.3, 0.37, 41), _event(0.9, 0.11, 7)], 1e-5, PRV)  # one step more: a new composition
    assert analysis._compute_rdp.cache_info().hits > hits  # its grid sized from the remembered curves
