"""ε of a composition of DP events, and σ for a target ε, with the registered accountants
(:mod:`fedshard.privacy.accountants`: Opacus' ``prv``, the default, and ``rdp``).

Pure functions over immutable :class:`~fedshard.privacy.events.DPEvent` values; the
state (what a site has spent) lives in :mod:`fedshard.privacy.ledger`. Equal events are
merged (their steps summed) before composing: that never changes ε, makes accountants
faster and gives a stable key, under which the process remembers every ε it composed
(:func:`compositions`, :func:`remember`: a site keeps them between its processes).
"""

from __future__ import annotations

import decimal
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fedshard.errors import ConfigError, PrivacyError
from fedshard.privacy._opacus_internals import memoise_one_step_rdp
from fedshard.privacy.accountants import ACCOUNTANTS, Merged, accountant
from fedshard.privacy.accountants.composition import quiet
from fedshard.privacy.events import DPEvent, Guarantee

__all__ = [
    "AccountantKind",
    "Composition",
    "accounted",
    "calibrate_noise",
    "compositions",
    "epsilon",
    "merge_events",
    "remember",
]

_MAX_NUDGES = 500


class AccountantKind(str):
    """The name of a registered accountant (:data:`~fedshard.privacy.accountants.ACCOUNTANTS`):
    ``AccountantKind("prv")``; a name no accountant is registered under is a ValueError
    (a pydantic validation error in a message or a config)."""

    PRV: ClassVar[AccountantKind]
    """Privacy loss random variables: the tightest bound Opacus offers (default)."""
    RDP: ClassVar[AccountantKind]
    """Rényi DP: a little looser, much faster."""

    def __new__(cls, name: object) -> AccountantKind:
        if isinstance(name, AccountantKind):
            return name
        if not isinstance(name, str) or name not in ACCOUNTANTS:
            known = ", ".join(sorted(ACCOUNTANTS))
            raise ValueError(f"{str(name)[:40]!r} is not an accountant this party knows ({known})")
        return super().__new__(cls, name)

    @property
    def value(self) -> str:
        """The name, as text."""
        return str.__str__(self)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(
            cls, core_schema.str_schema(), serialization=core_schema.to_string_ser_schema()
        )


AccountantKind.PRV = AccountantKind("prv")
AccountantKind.RDP = AccountantKind("rdp")


def _check_delta(delta: float) -> None:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not (0 < delta < 1):
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")


def merge_events(events: Sequence[DPEvent]) -> Merged:
    """Canonical composition of ``events``: equal ``(σ, q)`` merged by summing steps.

    Composing ``n`` times then ``m`` times is composing ``n + m`` times, so merging never
    changes ε; it makes accountants faster and gives a stable cache key.

    Parameters
    ----------
    events:
        Events of one guarantee.

    Returns
    -------
    tuple
        Sorted ``(noise_multiplier, sample_rate, steps)`` triples.

    Raises
    ------
    PrivacyError
        If the events protect different units (their ε do not compose).
    """
    guarantees = {event.guarantee for event in events}
    if len(guarantees) > 1:
        names = " and ".join(sorted(g.value for g in guarantees))
        raise PrivacyError(f"events mix guarantees {names}: compute ε for each guarantee separately")
    steps: dict[tuple[float, float], int] = {}
    for event in events:
        key = (event.noise_multiplier, event.sample_rate)
        steps[key] = steps.get(key, 0) + event.steps
    return tuple((sigma, q, n) for (sigma, q), n in sorted(steps.items()))


def epsilon(events: Sequence[DPEvent], delta: float, kind: AccountantKind = AccountantKind.PRV) -> float:
    """ε of the composition of ``events`` at ``delta``.

    Parameters
    ----------
    events:
        DP events of one guarantee, in any order.
    delta:
        Target δ, in (0, 1).
    kind:
        The Opacus accountant to use.

    Returns
    -------
    float
        ε (an upper bound, as the accountant reports it); ``0.0`` for no events;
        ``inf`` if the accountant finds no finite bound.

    Raises
    ------
    PrivacyError
        If the events mix guarantees, ``delta`` is out of range or the accountant fails.
    """
    _check_delta(delta)
    merged = merge_events(events)
    if not merged:
        return 0.0
    return _compose(merged, float(delta), _known(kind).value)


Composition = tuple[Merged, float, str]
"""What one ε is a function of: the merged events, δ and the accountant's name."""

_MEMO: dict[Composition, float] = {}
"""ε of every composition this process computed or was given (:func:`remember`), oldest first."""
_MEMO_LIMIT = 4096
_MEMO_LOCK = threading.Lock()  # sites of one process may account at once (in-process workers)


_RUNS = threading.local()  # .n: compositions this thread ran an accountant for


def compositions(newest: int) -> dict[Composition, float]:
    """The ``newest`` ε this process knows, by composition, oldest first: what a site keeps
    between processes (:mod:`fedshard.site._epsilon_memo`)."""
    with _MEMO_LOCK:
        return dict(list(_MEMO.items())[-newest:]) if newest > 0 else {}


def accounted() -> int:
    """How many compositions this thread has run an accountant for (not taken from memory):
    a site that sees it unchanged over a message has nothing new to keep."""
    return int(getattr(_RUNS, "n", 0))


def remember(known: Mapping[Composition, float]) -> None:
    """Take ε of compositions computed earlier (by this party, and authenticated by it): the
    accountant is not run again for them. Only for values :func:`epsilon` computed."""
    with _MEMO_LOCK:
        for composition, value in known.items():
            _MEMO.setdefault(composition, value)
        _trim()


def _trim() -> None:
    while len(_MEMO) > _MEMO_LIMIT:
        del _MEMO[next(iter(_MEMO))]


def _compose(merged: Merged, delta: float, kind: str) -> float:
    composition = (merged, delta, kind)
    with _MEMO_LOCK:
        known = _MEMO.get(composition)
    if known is None:
        known = _run(merged, delta, kind)  # seconds for PRV: not under the lock
        _RUNS.n = accounted() + 1
        with _MEMO_LOCK:
            _MEMO[composition] = known
            _trim()
    return known


def _run(merged: Merged, delta: float, kind: str) -> float:
    memoise_one_step_rdp()
    try:
        with quiet():
            value = accountant(kind).epsilon(merged, delta)
    except (ArithmeticError, ValueError, RuntimeError, MemoryError) as exc:
        raise PrivacyError(f"the {kind} accountant failed on {list(merged)} at δ={delta}: {exc}") from exc
    # A NaN bound is no bound: report inf so the ledger refuses rather than guesses.
    return value if not math.isnan(value) else math.inf


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    kind: AccountantKind = AccountantKind.PRV,
) -> float:
    """Noise multiplier σ such that ``steps`` steps at ``sample_rate`` spend at most ``target_epsilon``.

    Opacus's bisection finds σ within 0.01 of the target (or 1 % of it, whichever is
    tighter); σ is then rounded up to :data:`SIGMA_DIGITS` significant digits and raised in
    1 % steps (rounded up again) until :func:`epsilon` confirms the spend is within the
    target, so the ledger is never charged more than was planned. The rounding makes sites on
    different machines, whose accountants may differ in a float's last bits, calibrate the
    same σ: sites that share their noise must name the same σ (their manifests' noise terms).

    Parameters
    ----------
    target_epsilon:
        ε to spend, finite and > 0.
    delta:
        Target δ, in (0, 1).
    sample_rate:
        q, in (0, 1].
    steps:
        Number of steps, >= 1.
    kind:
        The Opacus accountant to calibrate against.

    Returns
    -------
    float
        σ with ``epsilon([DPEvent(..., σ, sample_rate, steps)], delta, kind) <= target_epsilon``.

    Raises
    ------
    PrivacyError
        If an argument is out of range or no σ reaches the target.
    """
    if isinstance(target_epsilon, bool) or not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise PrivacyError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    _check_delta(delta)
    kind = _known(kind)
    # The guarantee does not change the maths; the probe event only checks q and steps.
    probe = DPEvent(Guarantee.RECORD, 1.0, sample_rate, steps)
    opacus_name = accountant(kind.value).opacus_name
    memoise_one_step_rdp()
    try:
        if opacus_name is not None:
            from opacus.accountants.utils import get_noise_multiplier  # type: ignore[import-untyped]

            with quiet():
                sigma = float(
                    get_noise_multiplier(
                        target_epsilon=target_epsilon,
                        target_delta=delta,
                        sample_rate=probe.sample_rate,
                        steps=probe.steps,
                        accountant=opacus_name,
                        epsilon_tolerance=min(0.01, target_epsilon / 100),
                    )
                )
        else:
            sigma = _bisect(target_epsilon, delta, probe, kind)
    except ValueError as exc:
        raise PrivacyError(
            f"no noise multiplier reaches ε={target_epsilon} at δ={delta} with q={sample_rate}, "
            f"{steps} steps ({exc}): raise the budget or take fewer steps"
        ) from exc
    sigma = on_grid(sigma)
    for _ in range(_MAX_NUDGES):
        event = DPEvent(Guarantee.RECORD, sigma, probe.sample_rate, probe.steps)
        if epsilon([event], delta, kind) <= target_epsilon:
            return sigma
        sigma = on_grid(sigma * 1.01)
    raise PrivacyError(f"could not confirm σ for ε={target_epsilon} at δ={delta}: raise the budget or take fewer steps")


SIGMA_DIGITS = 4
"""Significant digits of a calibrated σ (rounded up: more noise, never less)."""


def on_grid(sigma: float) -> float:
    """``sigma`` rounded up to :data:`SIGMA_DIGITS` significant digits (6.25031… → 6.251): the
    same value on every machine for any σ its accountant computes within a part in 10⁴."""
    if not (math.isfinite(sigma) and sigma > 0):
        return sigma
    exact = decimal.Decimal(repr(sigma))  # the shortest decimal that is this float
    step = decimal.Decimal(1).scaleb(exact.adjusted() - SIGMA_DIGITS + 1)
    return float(exact.quantize(step, rounding=decimal.ROUND_CEILING))


def _bisect(target_epsilon: float, delta: float, probe: DPEvent, kind: AccountantKind) -> float:
    """σ within 1 % of the least that spends at most ``target_epsilon``, by bisection on
    :func:`epsilon` (for an accountant Opacus does not calibrate for)."""

    def spent(sigma: float) -> float:
        return epsilon([DPEvent(Guarantee.RECORD, sigma, probe.sample_rate, probe.steps)], delta, kind)

    low, high = 0.1, 1.0
    while spent(high) > target_epsilon:
        low, high = high, high * 2
        if high > 1e6:
            raise ValueError("ε stays above the target whatever the noise")
    while high - low > 0.01 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if spent(middle) > target_epsilon else (low, middle)
    return high


def _known(kind: AccountantKind | str) -> AccountantKind:
    """``kind`` as a registered accountant's name.

    Raises
    ------
    ConfigError
        No accountant is registered under it (one line naming those that are).
    """
    try:
        return AccountantKind(kind)
    except ValueError:
        accountant(str(kind))  # raises the one line
        raise ConfigError(f"{kind!r} is not an accountant") from None
