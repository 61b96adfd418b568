"""Differential privacy: DP events, accountants, the per-site budget ledger, DP-SGD and update-level DP."""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.privacy.accountant import AccountantKind, calibrate_noise, epsilon
    from fedshard.privacy.events import DPEvent, Guarantee
    from fedshard.privacy.ledger import Budget, PrivacyLedger
    from fedshard.privacy.mechanisms import MECHANISMS, Mechanism, RecordPrivacy

__all__ = [
    "AccountantKind",
    "Budget",
    "DPEvent",
    "Guarantee",
    "MECHANISMS",
    "Mechanism",
    "PrivacyLedger",
    "RecordPrivacy",
    "calibrate_noise",
    "epsilon",
]

__getattr__ = lazy_surface(
    __name__,
    {
        "AccountantKind": "accountant",
        "Budget": "ledger",
        "DPEvent": "events",
        "Guarantee": "events",
        "MECHANISMS": "mechanisms",
        "Mechanism": "mechanisms",
        "PrivacyLedger": "ledger",
        "RecordPrivacy": "mechanisms",
        "calibrate_noise": "accountant",
        "epsilon": "accountant",
    },
)
