"""What a zone's round lifecycle, its intake of pushes and its reduction share, in one
object the zone owns: its open and closed rounds and the lock over them and their sums,
its staging budget and buffers, its counters and audit log, what it recovered from its
store, and the federation's facts it enforces (residency, HE context, bounds).

:class:`~fedshard.zone._intake.PushIntake` and :class:`~fedshard.zone._reduce.Reduction`
operate on it instead of each holding a dozen references; a change of membership
replaces :attr:`ZoneRounds.residency` once, for all of them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedshard.config import AggregationConfig
from fedshard.crypto.he_schemes import HeScheme
from fedshard.zone._staging import ByteBudget, StagingPool
from fedshard.zone._state import OpenRound
from fedshard.zone._stats import ZoneStats
from fedshard.zone.policy import ZonePolicy
from fedshard.zone.recovery import ZoneRecovery

__all__ = ["ZoneRounds"]


@dataclass
class ZoneRounds:
    """A zone's round state (see the module docstring). ``lock`` guards ``open``,
    ``closed`` and every open round's sums; ``record`` appends a decision to the zone's
    audit log (``record(decision, **fields)``)."""

    name: str
    budget: ByteBudget
    staging: StagingPool
    stats: ZoneStats
    record: Callable[..., None]
    bounds: AggregationConfig
    residency: ZonePolicy | None = None  # replaced when the federation's membership changes
    he_context: Any = None  # the federation's public HE context (None: encrypted shards refused)
    he_scheme: HeScheme | None = None  # its scheme, found once (context_scheme)
    open: dict[int, OpenRound] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    recovery: ZoneRecovery = field(default_factory=ZoneRecovery)  # what the zone found in its store when it started
    lock: threading.Lock = field(default_factory=threading.Lock)
