"""The example deployment (``configs/aggregator.yaml``, ``configs/sites/*.yaml``) copied
under another folder on free loopback ports: for tests and benchmarks that run a whole
deployment on one machine beside anything else that runs there."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fedshard.config import FederationConfig, parse_model

__all__ = ["free_ports", "write_loopback_layout"]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_loopback_layout(
    source: Path,
    root: Path,
    *,
    edit: Callable[[dict[str, Any]], None] | None = None,
    tls: bool = True,
) -> dict[str, Path]:
    """Copy ``source/aggregator.yaml`` and ``source/sites/*.yaml`` to ``root/configs`` with
    free ports (SuperLink, zones, SuperNodes); ``edit`` may change the aggregator's config
    (as plain data) first. Paths keep their meaning relative to ``root`` (``root/keys``,
    ``root/runs``). Returns the written files: ``"aggregator"`` and one per site id."""
    data: dict[str, Any] = yaml.safe_load((source / "aggregator.yaml").read_text())
    if edit is not None:
        edit(data)
    site_files = {s["id"]: source / "sites" / f"{s['id']}.yaml" for s in data["sites"]}
    superlink, *ports = free_ports(1 + len(data["zones"]) + len(site_files))
    for zone, port in zip(data["zones"], ports, strict=False):
        zone["endpoint"] = f"127.0.0.1:{port}"
    data["deployment"].update(superlink=f"127.0.0.1:{superlink}", tls=tls)
    private = parse_model(FederationConfig, data, "aggregator.yaml").privacy.enabled
    (root / "configs" / "sites").mkdir(parents=True)
    paths = {"aggregator": root / "configs" / "aggregator.yaml"}
    paths["aggregator"].write_text(yaml.safe_dump(data, sort_keys=False))
    for (site, file), port in zip(site_files.items(), ports[len(data["zones"]) :], strict=True):
        site_data = yaml.safe_load(file.read_text())
        site_data["deployment"].update(superlink=f"127.0.0.1:{superlink}", port=port, tls=tls)
        if not private:
            site_data["site"].pop("cap", None)  # no DP mechanism: no cap either
        paths[site] = root / "configs" / "sites" / f"{site}.yaml"
        paths[site].write_text(yaml.safe_dump(site_data, sort_keys=False))
    return paths
