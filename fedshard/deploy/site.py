"""``fedshard site up``: a site's SuperNode, started from the site's own config file.

The SuperNode gets the site's node config (``site-config``, ``site-id``,
``jurisdiction``), the federation CA to check the SuperLink, and the site's SuperNode
authentication key; its ClientApp reads everything else (federation config, state
folder, keys) from the site's config file, on the site's host. Flower's own state
(installed app bundles) goes to ``<state_dir>/flwr``; the log to ``<state_dir>/supernode.log``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedshard.config import SiteLocalConfig, load_deployed_site
from fedshard.config.layout import SiteBundle
from fedshard.deploy.flower import flower_env, supernode_command
from fedshard.errors import ConfigError

__all__ = ["SiteLaunch", "plan_site"]


@dataclass(frozen=True)
class SiteLaunch:
    """How to start one site's SuperNode."""

    config: SiteLocalConfig
    command: list[str]
    env: dict[str, str]
    log: Path


def plan_site(site_config: Path, *, insecure: bool = False) -> SiteLaunch:
    """Check the site's config and keys and build its SuperNode command (one-line errors)."""
    local, config, _ = load_deployed_site(site_config)
    dep = local.deployment
    assert dep is not None  # load_deployed_site checked it
    if not dep.tls and not insecure:
        raise ConfigError(
            f"{site_config}: deployment.tls is false: pass --insecure to run without TLS (test networks only)"
        )
    tls = dep.tls and not insecure
    bundle = SiteBundle(dep.keys)
    needed = [bundle.signing_key]
    if config.store.encrypt:
        needed.append(bundle.store_kek)
    if tls:
        needed += [bundle.tls.ca, bundle.tls.cert, bundle.tls.key, bundle.supernode_key]
    if config.residency.encrypting:
        from fedshard.crypto.he import SECRET_CONTEXT_FILE

        needed.append(bundle.he / SECRET_CONTEXT_FILE)
    missing = [p for p in needed if not p.exists()]
    if missing:
        raise ConfigError(
            f"{missing[0]} is missing: deployment.keys must be this site's bundle from `fedshard keys init` "
            f"(keys/sites/{local.site.id})"
        )
    state_dir = local.site.state_dir
    command = supernode_command(
        superlink=dep.superlink,
        port=dep.port,
        node_config={
            "site-config": str(Path(site_config).resolve()),
            "site-id": local.site.id,
            "jurisdiction": local.site.jurisdiction,
        },
        root_certificates=bundle.tls.ca if tls else None,
        auth_key=bundle.supernode_key if tls else None,
    )
    return SiteLaunch(local, command, flower_env(state_dir / "flwr"), state_dir / "supernode.log")
