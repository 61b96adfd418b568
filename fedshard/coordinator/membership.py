"""Changing a running federation between rounds: zones added or drained, sites joining.

The runtime that hosts the coordinator (the in-process engine, the aggregator) offers a
:class:`Membership`: before each round the coordinator asks it for a pending change.
The runtime has checked the new config against the run's (:mod:`fedshard.config.changes`,
:func:`fedshard.assembly.routing.check_regrouping`) and applied what only it can (started the new
zones, given every zone the new membership, started or admitted the new sites); the
coordinator then takes the config, opens the next rounds at the zones of
:attr:`Reconfiguration.zones` (a drained zone is left out, though sites still reach it,
through :attr:`Reconfiguration.endpoints`, for the aggregates it published), and asks
the sites that connected since who they are (:func:`admit`). A site that starts from the
run's genesis model and applies the same aggregates as a residency group joins that
group; its first message carries every round the group applied, so it catches up to the
group's current model version before it trains (the zones keep every aggregate they
published). Anything else is left out, with a warning naming the site and why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fedshard.config import FederationConfig, load_federation
from fedshard.config.changes import ConfigChange, check_change
from fedshard.coordinator._groups import Group
from fedshard.coordinator.events import EventLog
from fedshard.errors import FedshardError
from fedshard.protocol.channels import ZoneClient
from fedshard.protocol.messages import SiteInfo

__all__ = ["JOIN_QUERIES", "JoinQueries", "Membership", "Reconfiguration", "admit", "read_change"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reconfiguration:
    """A change the runtime applied and the coordinator takes before round :attr:`round`."""

    config: FederationConfig
    zones: Mapping[str, ZoneClient]
    """Zone clients the next rounds open and close at (the drained zones left out)."""
    endpoints: Mapping[str, str]
    """Every zone's endpoint, as sites reach it (drained zones too: they serve their aggregates)."""
    description: str
    """One line for the log and the journal."""


class Membership(Protocol):
    """Where a coordinator learns, between rounds, that the federation changed."""

    def before_round(self, rnd: int) -> Reconfiguration | None:
        """The change to take before round ``rnd`` starts, if one is pending."""
        ...

    def close(self) -> None:
        """Stop what it started (the zones a change added); the run is over."""
        ...


JOIN_QUERIES = 3
"""Join queries a connected node may leave unanswered (each costs up to a round timeout)
before the coordinator stops asking it."""


class JoinQueries:
    """Which connected nodes the coordinator still asks to join: not those that answered and
    may not join (asked once), nor those that left :data:`JOIN_QUERIES` queries unanswered."""

    def __init__(self) -> None:
        self._turned_away: set[str] = set()
        self._unanswered: dict[str, int] = {}

    def to_ask(self, nodes: list[str], members: Mapping[str, object]) -> list[str]:
        """The nodes of ``nodes`` that are not ``members`` and may still be asked."""
        return [n for n in nodes if n not in members and n not in self._turned_away]

    def asked(self, nodes: list[str], *, answered: Mapping[str, object], admitted: Mapping[str, str]) -> None:
        """Note how the nodes asked replied (``answered``) and which were ``admitted``."""
        self._turned_away.update(n for n in answered if n not in admitted)
        for node in set(nodes) - set(answered):
            self._unanswered[node] = self._unanswered.get(node, 0) + 1
            if self._unanswered[node] >= JOIN_QUERIES:
                log.warning("node %s did not answer %d join queries; it is not asked again", node, JOIN_QUERIES)
                self._turned_away.add(node)


def admit(
    infos: Mapping[str, SiteInfo],
    known_sites: set[str],
    plan_digest: str,
    genesis: str,
    groups: Mapping[str, Group],
) -> dict[str, str]:
    """Node → residency group of the joining sites that may join (see the module docstring);
    the others are logged and left out."""
    admitted: dict[str, str] = {}
    for node, info in sorted(infos.items(), key=lambda kv: kv[1].site_id):
        why = ""
        group = next((name for name, g in groups.items() if g.view == dict(info.view)), None)
        if info.site_id not in known_sites:
            why = "it is not in the federation config"
        elif (info.plan_digest, info.genesis_version) != (plan_digest, genesis):
            why = "it starts from a different model (plan or seed differs)"
        elif info.applied_round != 0 or info.version != genesis:
            why = f"it holds model version {info.version[:12]}… of round {info.applied_round}, not the run's genesis"
        elif group is None:
            why = "it would apply aggregates no residency group applies (a new group cannot form mid-run)"
        if why:
            log.warning("site %s cannot join the running federation: %s", info.site_id, why)
            continue
        assert group is not None
        admitted[node] = group
    return admitted


def read_change(
    path: Path,
    rnd: int,
    current: FederationConfig,
    journal: EventLog | None = None,
    check: Callable[[FederationConfig], None] | None = None,
) -> tuple[FederationConfig, ConfigChange] | None:
    """The change the config file ``path`` makes to ``current`` before round ``rnd`` (None when no
    file is there), checked by :func:`~fedshard.config.changes.check_change` and ``check``.

    A change refused here is moved aside to ``reconfigure.refused-<rnd>.yaml`` beside ``path``,
    logged and journalled; None then too.
    """
    if not path.exists():
        return None
    try:
        new = load_federation(path)
        change = check_change(current, new)
        if check is not None:
            check(new)
    except FedshardError as exc:
        log.warning("before round %d: the change in %s is refused: %s", rnd, path, exc)
        os.replace(path, path.with_name(f"reconfigure.refused-{rnd}.yaml"))
        if journal is not None:
            journal.on_reconfigured(rnd, f"refused: {exc}")
        return None
    return new, change
