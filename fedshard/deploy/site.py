"""``fedshard site up``: a site's SuperNode, started from the site's own config file.

The SuperNode gets the site's node config (``site-config``, ``site-id``,
``jurisdiction``), the federation CA to check the SuperLink, and the site's SuperNode
authentication key; its ClientApp reads everything else (federation config, state
folder, keys) from the site's config file, on the site's host. Flower's own state
(installed app bundles) goes to ``<state_dir>/flwr``; the log to ``<state_dir>/supernode.log``.

With ``deployment.executor: warm`` (the default) the SuperNode runs in Flower's
``--isolation process`` mode with its waits shortened
(:mod:`fedshard.transports.flower.compat.supernode`), beside fedshard's warm executor
(:mod:`fedshard.transports.flower.compat.warm_executor`), which forks each message's
ClientApp process from one that imported torch and fedshard once; the two share a
SuperExec auth secret written for this start alone. When the installed Flower's internals
are not the ones these rely on (:mod:`fedshard.transports.flower.compat.warm_checks`), or
with ``executor: flower``, it is Flower's stock SuperNode.
"""

from __future__ import annotations

import secrets
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedshard.config import FederationConfig, SiteLocalConfig, load_deployed_site
from fedshard.config.layout import SiteBundle
from fedshard.crypto.key_files import KEY_MODE, loose_key, write_files
from fedshard.deploy._flower import flower_env, supernode_command
from fedshard.deploy._processes import Child, spawn
from fedshard.errors import ConfigError

__all__ = ["SiteLaunch", "SiteNode", "plan_site", "unreachable_zones"]

Executor = Literal["warm", "flower"]


@dataclass(frozen=True)
class SiteLaunch:
    """How to start one site's SuperNode (and, when warm, its executor).

    ``command`` is the stock ``flower-supernode`` command line; ``executor`` the one that
    runs (``warm`` or ``flower``) and ``fallback`` why it is not the configured one (None
    when it is).
    """

    config: SiteLocalConfig
    command: list[str]
    env: dict[str, str]
    log: Path
    executor: Executor = "flower"
    fallback: str | None = None
    ca: Path | None = None  # the federation CA the SuperLink's certificate must chain to (None: no TLS)
    federation: FederationConfig | None = None  # the site's copy of the federation config

    @property
    def secret(self) -> Path:
        """The SuperExec auth secret the warm SuperNode and its executor share (rewritten at each start)."""
        return self.config.site.state_dir / "flwr" / "superexec.secret"

    def start(self, max_wait_s: float) -> SiteNode:
        """Start the SuperNode (giving up on a silent SuperLink after ``max_wait_s``) and its executor."""
        name = f"SuperNode {self.config.site.id}"
        flower_args = [*self.command[1:], "--max-wait-time", f"{max_wait_s:.0f}"]
        if self.executor == "flower":
            return SiteNode(spawn(name, [self.command[0], *flower_args], self.log, self.env), None)
        dep = self.config.deployment
        assert dep is not None
        write_files([(self.secret, secrets.token_bytes(32), KEY_MODE)], force=True)  # atomic, mode 600
        warm = [*flower_args, "--isolation", "process", "--superexec-auth-secret-file", str(self.secret)]
        shim = [
            sys.executable,
            "-m",
            "fedshard.transports.flower.compat.supernode",
            "--poll-s",
            f"{dep.poll_s:g}",
            "--",
            *warm,
        ]
        supernode = spawn(name, shim, self.log, self.env)
        executor = spawn(
            f"warm executor {self.config.site.id}",
            [
                sys.executable,
                "-m",
                "fedshard.transports.flower.compat.warm_executor",
                "--runtime-api-address",
                f"127.0.0.1:{dep.port}",
                "--superexec-auth-secret-file",
                str(self.secret),
                "--parent-pid",
                str(supernode.pid),
            ],
            self.log,
            self.env,
        )
        return SiteNode(supernode, executor)


@dataclass
class SiteNode:
    """A running SuperNode and its warm executor (None with Flower's stock executor)."""

    supernode: Child
    executor: Child | None

    def alive(self) -> bool:
        """Whether both still run (a SuperNode without its executor cannot answer a message)."""
        return self.supernode.alive() and (self.executor is None or self.executor.alive())

    def failed(self) -> Child:
        """The one that is gone: the executor when it exited under a running SuperNode, else the SuperNode."""
        if self.executor is not None and not self.executor.alive() and self.supernode.alive():
            return self.executor
        return self.supernode

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the executor (and its children), then the SuperNode."""
        if self.executor is not None:
            self.executor.stop(timeout)
        self.supernode.stop(timeout)


def plan_site(site_config: Path, *, insecure: bool = False, executor: Executor | None = None) -> SiteLaunch:
    """Check the site's config and keys and build its SuperNode command (one-line errors).

    ``executor`` overrides ``deployment.executor``; a warm executor whose Flower internals
    are not there falls back to Flower's (``SiteLaunch.fallback`` says why).
    """
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
    private = [p for p in needed if p.suffix in (".key", ".kek", ".ctx")]  # what keys init writes mode 600
    loose = loose_key(private)
    if loose is not None:  # a bundle copied or mounted with loose permissions
        raise ConfigError(loose)
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
    chosen: Executor = executor or dep.executor
    fallback = None
    if chosen == "warm":
        from fedshard.transports.flower.compat.warm_checks import problem

        fallback = problem()
        chosen = "flower" if fallback else "warm"
    ca = bundle.tls.ca if tls else None
    log = state_dir / "supernode.log"
    return SiteLaunch(local, command, flower_env(state_dir / "flwr"), log, chosen, fallback, ca, config)


def unreachable_zones(config: FederationConfig, site_id: str, *, timeout: float = 3.0) -> list[str]:
    """One line per zone site ``site_id`` would push to that no TCP connection reaches from
    this host now (a firewall, a wrong host name, a zone not up yet), naming what it would
    send there; empty when every one answers. Checked in parallel, ``timeout`` each."""
    from fedshard.assembly.routing import site_zones

    endpoints = {z.name: z.endpoint for z in config.zones}
    wanted = site_zones(config, site_id)

    def why(zone: str) -> str | None:
        host, _, port = endpoints[zone].rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except OSError as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
            classes = ", ".join(wanted[zone])
            return (
                f"zone {zone} at {endpoints[zone]} is unreachable from this host ({reason}): this site's "
                f"{classes} shards go there; open the zone's port to this host, or check its name and that it is up"
            )
        return None

    if not wanted:
        return []
    with ThreadPoolExecutor(len(wanted)) as pool:
        return [line for line in pool.map(why, sorted(wanted)) if line is not None]
