"""What a running federation may change between rounds, and the check that says so.

A federation grows while it trains: zones are added (capacity in a region, a region of
its own), drained (``drain: true``: pushed nothing more, still serving what they
published) or brought back, sites join, and the number of rounds changes. Everything
else a round depends on — the task, the model's sharding, the residency policy, the
privacy settings and budgets, the aggregation bounds, a zone's region or endpoint, a
site's jurisdiction or data partition — is fixed for the run: changing it would give
sites different models, zones different rules, or ledgers a different accounting.

:func:`check_change` compares the config a run has with the one it is offered and
returns the change, or refuses it in one line naming the first field that may not
change. The routing consequences (every shard of every site still has a zone; no site
of the run is moved to other aggregates) are checked by the runner with the task's
model (:func:`fedshard.assembly.routing.check_regrouping`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from fedshard.config._models import FederationConfig
from fedshard.errors import ConfigError
from fedshard.integrity.canonical import canonical_json

__all__ = ["ConfigChange", "check_change", "check_fixed", "fixed_digests", "membership_digest"]

_FIXED = ("task", "training", "aggregation", "sharding", "privacy", "residency", "he", "store", "reducing_zone")
"""Top-level sections a running federation keeps as they are."""
_FIXED_FEDERATION = ("name", "seed", "round_timeout_s", "sample_fraction", "partitions")


@dataclass(frozen=True)
class ConfigChange:
    """What a new config changes in a running federation."""

    added_zones: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()  # zones no longer drained
    added_sites: tuple[str, ...] = ()
    rounds: int | None = None  # the new federation.rounds, if it changed
    min_sites: int | None = None  # the new federation.min_sites, if it changed

    @property
    def empty(self) -> bool:
        """Whether nothing changes."""
        return self == ConfigChange()

    def describe(self) -> str:
        """One line for logs and the event journal."""
        parts = [
            *(f"zone {z} added" for z in self.added_zones),
            *(f"zone {z} drained" for z in self.drained),
            *(f"zone {z} takes pushes again" for z in self.resumed),
        ]
        if self.added_sites:
            more = len(self.added_sites) - 5
            shown = ", ".join(self.added_sites[:5]) + (f" and {more} more" if more > 0 else "")
            parts.append(f"site(s) {shown} joined")
        if self.rounds is not None:
            parts.append(f"rounds now {self.rounds}")
        if self.min_sites is not None:
            parts.append(f"min_sites now {self.min_sites}")
        return "; ".join(parts) or "no change"


def check_change(old: FederationConfig, new: FederationConfig) -> ConfigChange:
    """The change from ``old`` to ``new``, which a running federation may take between rounds.

    Raises
    ------
    ConfigError
        ``new`` changes something fixed for the run (the first such field is named),
        or removes a zone or a site (drain a zone instead; a site that leaves simply
        stops answering).
    """
    for section in _FIXED:
        if getattr(old, section) != getattr(new, section):
            raise ConfigError(_fixed(section))
    for name in _FIXED_FEDERATION:
        if getattr(old.federation, name) != getattr(new.federation, name):
            raise ConfigError(_fixed(f"federation.{name}"))
    old_zones = {z.name: z for z in old.zones}
    new_zones = {z.name: z for z in new.zones}
    gone = sorted(set(old_zones) - set(new_zones))
    if gone:
        raise ConfigError(
            f"zone {gone[0]} is missing from the new config; a running federation keeps its zones "
            "(set `drain: true` to route nothing more to it: it still serves what it published)"
        )
    for name, zone in old_zones.items():
        fresh = new_zones[name]
        if zone.model_copy(update={"drain": fresh.drain}) != fresh:
            field = next(f for f in type(zone).model_fields if getattr(zone, f) != getattr(fresh, f))
            raise ConfigError(_fixed(f"zone {name}'s {field}", "add a zone under a new name instead"))
    old_sites = {s.id: s for s in old.sites}
    new_ids = {s.id for s in new.sites}
    left = sorted(set(old_sites) - new_ids)
    if left:
        raise ConfigError(
            f"site {left[0]} is missing from the new config; a running federation keeps its sites listed "
            "(a site that leaves stops answering and is not selected)"
        )
    for site in new.sites:
        before = old_sites.get(site.id)
        if before is not None and before != site:
            raise ConfigError(_fixed(f"site {site.id}'s entry", "add a site under a new id instead"))
    for site in old.sites:
        if old.partition_of(site.id) != new.partition_of(site.id):
            raise ConfigError(
                f"site {site.id} would read data partition {new.partition_of(site.id)} instead of "
                f"{old.partition_of(site.id)}; add new sites at the end of the list"
            )
    if old.num_partitions != new.num_partitions:
        raise ConfigError(
            f"the new sites would cut the task's data into {new.num_partitions} parts instead of "
            f"{old.num_partitions}, changing every site's data; start the run with federation.partitions set to "
            "the number of parts it may grow to"
        )
    fed_old, fed_new = old.federation, new.federation
    return ConfigChange(
        added_zones=tuple(sorted(set(new_zones) - set(old_zones))),
        drained=tuple(sorted(n for n, z in old_zones.items() if not z.drain and new_zones[n].drain)),
        resumed=tuple(sorted(n for n, z in old_zones.items() if z.drain and not new_zones[n].drain)),
        added_sites=tuple(s.id for s in new.sites if s.id not in old_sites),
        rounds=fed_new.rounds if fed_new.rounds != fed_old.rounds else None,
        min_sites=fed_new.min_sites if fed_new.min_sites != fed_old.min_sites else None,
    )


def membership_digest(config: FederationConfig) -> str:
    """Hex SHA-256 of what a zone needs to know of the federation's parties: every zone's
    name, region, endpoint and drain flag, every site's id and jurisdiction, and the
    residency policy (not file paths, which differ between hosts). A coordinator and a
    zone that agree on it agree on who may push, fetch and forward where."""
    parts = {
        "zones": [[z.name, z.region, z.endpoint, z.drain] for z in config.zones],
        "sites": [[s.id, s.jurisdiction] for s in config.sites],
        "residency": config.residency.model_dump(mode="json"),
        "reducing_zone": config.reducing_zone,
    }
    return hashlib.sha256(canonical_json(parts)).hexdigest()


def fixed_digests(config: FederationConfig) -> dict[str, str]:
    """Hex SHA-256 of each part of ``config`` a running federation keeps (see :func:`check_change`):
    every fixed section and ``federation`` field, every zone's entry (but its drain flag) and
    every site's entry, by name (``privacy``, ``federation.seed``, ``zone eu-central``,
    ``site charite-berlin``, …). A run records them when it starts; a resume checks them
    (:func:`check_fixed`), so a run folder's config cannot be changed where
    ``reconfigure`` would refuse the change."""

    def digest(value: object) -> str:
        return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()

    data = config.model_dump(mode="json")
    out = {section: digest(data[section]) for section in _FIXED}
    out.update({f"federation.{name}": digest(data["federation"][name]) for name in _FIXED_FEDERATION})
    out.update({f"zone {z['name']}": digest({**z, "drain": None}) for z in data["zones"]})
    out.update({f"site {s['id']}": digest(s) for s in data["sites"]})
    return out


def check_fixed(recorded: dict[str, str], config: FederationConfig, source: str) -> None:
    """Refuse ``config`` (read from ``source``) unless every part the run recorded
    (:func:`fixed_digests`) is unchanged; zones and sites added since are allowed.

    Raises
    ------
    ConfigError
        One line naming the first part that changed.
    """
    now = fixed_digests(config)
    for part, value in recorded.items():
        if now.get(part) != value:
            what = "is missing" if part not in now else "differs from what the run started with"
            raise ConfigError(
                f"{source}: {part} {what}; a run resumes only with a config `reconfigure` would accept (the "
                "sites of a run take their privacy, residency and zones from it); restore it, or start a new run"
            )


def _fixed(what: str, hint: str = "") -> str:
    return (
        f"{what} cannot change while the federation runs (it would change the model, the rules or the "
        f"accounting of rounds already run){'; ' + hint if hint else ''}; start a new run for that"
    )
