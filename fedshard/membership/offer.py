"""A change waiting in a run's folder: ``fedshard reconfigure`` (a simulation) and
``fedshard aggregator reconfigure`` (a deployment) check the new config against the run's
and leave it as :data:`PENDING`; the running federation takes it before its next round
(:class:`fedshard.membership.in_process.RunMembership`, the aggregator host)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from fedshard.assembly.routing import FederationRouting, check_regrouping
from fedshard.config import FederationConfig, load_federation
from fedshard.config.changes import ConfigChange, check_change
from fedshard.errors import ConfigError

__all__ = ["DEPLOYED_MARK", "PENDING", "offer_change", "request_change"]

PENDING = "reconfigure.yaml"
"""The change a run takes before its next round, in its folder."""
DEPLOYED_MARK = "run-config.toml"
"""A file only a deployed run's folder holds (the settings the aggregator submitted)."""


def request_change(run: str | Path, config_file: str | Path) -> ConfigChange:
    """Check ``config_file`` against the run in folder ``run`` and leave it for the run to take.

    Raises
    ------
    ConfigError
        The run folder holds no run, or the new config changes what a running federation
        keeps, or routes a site's shards nowhere or to other aggregates. Nothing is written.
    """
    run = Path(run)
    if not (run / "federation.yaml").is_file() or not (run / "events.jsonl").is_file():
        raise ConfigError(f"{run} holds no run (no federation.yaml or events.jsonl); give a run folder of `simulate`")
    if (run / DEPLOYED_MARK).exists():
        raise ConfigError(
            f"{run} is a deployed run: change it with `fedshard aggregator reconfigure --config NEW` "
            "on its aggregator host"
        )
    return offer_change(run, load_federation(config_file))


def offer_change(run: Path, new: FederationConfig) -> ConfigChange:
    """Check ``new`` against the run in folder ``run`` (its ``federation.yaml``) and leave it
    there as :data:`PENDING`; the change (see :func:`request_change`)."""
    current = load_federation(run / "federation.yaml")
    change = check_change(current, new)
    routing = FederationRouting(current)
    check_regrouping(routing, FederationRouting(new, routing.classes))
    tmp = run / f".{PENDING}.tmp"
    tmp.write_text(yaml.safe_dump(new.model_dump(mode="json"), sort_keys=False))
    os.replace(tmp, run / PENDING)
    return change
