"""The DP mechanisms a site runs, one per module, behind :class:`Mechanism`, named in a
registry (as the accountants are).

A mechanism gives one of the two guarantees the ledger accounts (:class:`Guarantee`):
``record`` mechanisms act inside the task's training (DP-SGD), ``update`` mechanisms on
the site's released update (clip and noise). A federation names one per guarantee in
``privacy.record_level.mechanism`` and ``privacy.update_level.mechanism``; the site's own
config decides, and a plan naming another mechanism than the site's is refused.

A new mechanism is one module here defining a class with the :class:`Mechanism` methods,
plus its line in :data:`MECHANISMS` (or :func:`register` from a task). Its cost is stated
as :class:`~fedshard.privacy.events.DPEvent` (Poisson-subsampled Gaussian steps), the only
events the accountants compose; what noise a site adds when several sites share it is
:func:`~fedshard.privacy.mechanisms._shares.noise_share`'s maths, here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fedshard.errors import ConfigError
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.mechanisms._shares import RoundShape, Sharing, noise_share, shared_terms
from fedshard.privacy.mechanisms.dpsgd import DpSgd, RecordPrivacy
from fedshard.privacy.mechanisms.gaussian_update import GaussianUpdate
from fedshard.registry import Registry

if TYPE_CHECKING:
    import numpy as np

    from fedshard.config.privacy import PrivacyConfig

__all__ = [
    "MECHANISMS",
    "Mechanism",
    "MechanismRound",
    "RecordPrivacy",
    "RoundShape",
    "Sharing",
    "check_configured",
    "find",
    "known",
    "mechanism",
    "noise_share",
    "register",
    "shared_terms",
]


@runtime_checkable
class MechanismRound(Protocol):
    """One round of a mechanism at a site, after its cost was reserved in the ledger."""

    @property
    def training(self) -> RecordPrivacy | None:
        """What the task trains through (:meth:`RecordPrivacy.make_private`); None: training is untouched."""
        ...

    def verify(self) -> None:
        """After training: raise :class:`~fedshard.errors.PrivacyError` if the round spent
        other than it reserved (nothing is then released)."""
        ...

    def release(self, update: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The update as the site may release it (may be written over ``update``)."""
        ...


@runtime_checkable
class Mechanism(Protocol):
    """A DP mechanism: what a round of it costs, and running one round."""

    name: str
    """What configs and privacy plans name it by."""

    guarantee: Guarantee
    """The unit it protects, and so its slot: ``record`` (``privacy.record_level``) or
    ``update`` (``privacy.update_level``)."""

    def event(self, shape: RoundShape, noise_multiplier: float) -> DPEvent:
        """What one round at ``noise_multiplier`` costs (what the ledger reserves); raises
        :class:`~fedshard.errors.PrivacyError` if the round cannot run as shaped."""
        ...

    def start(self, planned: DPEvent, clip: float, sharing: Sharing) -> MechanismRound:
        """One round that spends ``planned`` with clipping bound ``clip``; with
        ``sharing.distributed_over`` the site adds only its share of the noise. Raises
        :class:`~fedshard.errors.PrivacyError` if it cannot run that way."""
        ...


MECHANISMS: Registry[Mechanism] = Registry(
    "DP mechanism", "privacy.*_level.mechanism", (DpSgd(), DpSgd(normalized=True), GaussianUpdate())
)
"""Every DP mechanism by name: the built-in ones (a new one: its line here)."""

_KEYS = {Guarantee.RECORD: "privacy.record_level.mechanism", Guarantee.UPDATE: "privacy.update_level.mechanism"}


def register(new: Mechanism) -> None:
    """Add ``new`` to :data:`MECHANISMS` (before any config or plan names it);
    :class:`ConfigError` if another mechanism has its name."""
    MECHANISMS.register(new)


def known(guarantee: Guarantee) -> str:
    """The registered mechanisms giving ``guarantee``, by name, comma-separated (for one-line refusals)."""
    return ", ".join(sorted(n for n, m in MECHANISMS.items() if m.guarantee is guarantee))


def find(name: str, guarantee: Guarantee) -> Mechanism | None:
    """The mechanism named ``name`` if it is registered and gives ``guarantee``; else None."""
    found = MECHANISMS.get(name)
    return found if found is not None and found.guarantee is guarantee else None


def mechanism(name: str, guarantee: Guarantee) -> Mechanism:
    """The mechanism named ``name``, which must give ``guarantee``; :class:`ConfigError` in one
    line naming those that exist."""
    found = find(name, guarantee)
    if found is not None:
        return found
    other = MECHANISMS.get(name)
    what = "no such DP mechanism" if other is None else f"a {other.guarantee.value}-level DP mechanism"
    raise ConfigError(f"{_KEYS[guarantee]} {name!r}: {what}; {guarantee.value}-level ones: {known(guarantee)}")


def check_configured(privacy: PrivacyConfig) -> None:
    """Refuse (:class:`ConfigError`, one line) a mechanism that ``privacy`` turns on and no one
    registered, or registered for the other guarantee."""
    if privacy.record_level.enabled:
        mechanism(privacy.record_level.mechanism, Guarantee.RECORD)
    if privacy.update_level.enabled:
        mechanism(privacy.update_level.mechanism, Guarantee.UPDATE)
