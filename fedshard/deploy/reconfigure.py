"""Growing a deployed federation: ``fedshard aggregator reconfigure --config NEW``.

The command checks the new config (the same file ``aggregator up`` takes, with the new
zones and sites) against the running federation's, as the aggregator runs it
(:func:`effective_config`: zone stores in the run folder, absolute paths), and leaves it
in the run folder (:data:`~fedshard.run_folder.changes.PENDING`). The running
``aggregator up`` (:meth:`AggregatorHost.take_change
<fedshard.deploy.aggregator_host.AggregatorHost.take_change>`) checks the keys of the new
parties, makes it the run's ``federation.yaml``, starts the new zones it hosts,
registers the new sites' SuperNode keys, and marks it ready
(:data:`~fedshard.assembly.membership.READY`); the coordinator hands it to every zone
and takes it before its next round (:mod:`fedshard.assembly.membership`).
"""

from __future__ import annotations

from pathlib import Path

from fedshard.config import FederationConfig
from fedshard.config.changes import ConfigChange

__all__ = ["effective_config", "request_deployed_change"]


def effective_config(config: FederationConfig, run_dir: Path, he_keys: Path | None) -> FederationConfig:
    """``config`` as the zones and the ServerApp of the run in ``run_dir`` use it: every zone's
    store under ``run_dir/zones/``, the public CKKS context in ``he_keys`` (when encrypting)."""
    he = config.he
    if config.residency.encrypting and he_keys is not None:
        he = he.model_copy(update={"keys": he_keys.resolve()})
    zones = [z.model_copy(update={"store": (run_dir / "zones" / z.name).resolve()}) for z in config.zones]
    return config.model_copy(update={"he": he, "zones": zones})


def request_deployed_change(config: FederationConfig, run_dir: Path, he_keys: Path | None) -> ConfigChange:
    """Check ``config`` against the deployed run in ``run_dir`` and leave it for its aggregator
    (``he_keys``: where the zones' public CKKS context is, as for :func:`effective_config`).

    Raises
    ------
    ConfigError
        The change is one a running federation may not take, or routes a site's shards
        nowhere or to other aggregates. Nothing is written then.
    """
    from fedshard.run_folder.changes import offer_change

    return offer_change(run_dir, effective_config(config, run_dir, he_keys))
