"""What ``site up`` says before it starts: the zones it cannot reach from its host."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml

from fedshard.config import FederationConfig
from fedshard.deploy.loopback import free_ports
from fedshard.deploy.site import unreachable_zones

AGGREGATOR = Path(__file__).resolve().parents[3] / "configs" / "aggregator.yaml"


def test_a_zone_nobody_answers_at_is_named_with_what_the_site_would_send_it() -> None:
    data = yaml.safe_load(AGGREGATOR.read_text())
    listening = socket.create_server(("127.0.0.1", 0))
    closed = free_ports(1)[0]
    ports = {"eu-central": listening.getsockname()[1], "us-east": closed, "sg-central": closed}
    for zone in data["zones"]:
        zone["endpoint"] = f"127.0.0.1:{ports[zone['name']]}"
    config = FederationConfig.model_validate(data)
    with listening:
        assert unreachable_zones(config, "charite-berlin") == []  # its zone answers; the others are not its own
        lines = unreachable_zones(config, "mayo-rochester", timeout=2.0)
    assert lines == [
        f"zone us-east at 127.0.0.1:{closed} is unreachable from this host (Connection refused): this site's "
        "public, restricted, personal shards go there; open the zone's port to this host, or check its name and "
        "that it is up"
    ]
