"""The README's "On separate hosts" blocks, each on its own host: ``make test-hosts``
(FEDSHARD_HOSTS=1) runs it; ``make test`` skips it.

Every party in its own network namespace with its own address and host name (resolved by
name, written into the certificates by ``keys init``), links shaped with ``tbf`` (1 Gbit/s
for the aggregator and the zones, 100 Mbit/s per hospital), the SuperLink bound on
0.0.0.0, each zone (the reducing one too) on its own host. The example federation (DP +
HE + residency) runs to completion; a site that dials the SuperLink by a name its
certificate lacks, and one that cannot reach a zone, are named in one line each; then the
LoRA federation runs on the same hosts by the same blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.hosts_helpers import (
    ROOT,
    SITES,
    ZONE_HOSTS,
    Hosted,
    copy_configs,
    links,
    make_keys,
    readme_steps,
    start_sites,
    start_zones,
)
from tests.netns import Hosts, can_make_hosts

pytestmark = [
    pytest.mark.skipif(os.environ.get("FEDSHARD_HOSTS") != "1", reason="`make test-hosts` runs it"),
    pytest.mark.skipif(can_make_hosts() is not None, reason=str(can_make_hosts())),
]

AGGREGATOR_UP, STATUS = readme_steps()[3], readme_steps()[5]
LORA_SITES = ("charite-berlin", "ap-hp-paris", "mayo-rochester")


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """The aggregator, three zones and four hospitals, each its own host."""
    with Hosts(links()) as made:
        yield made


def _start(hosted: Hosted, zones: dict[str, str], sites: tuple[str, ...]) -> None:
    """The README's steps 1-4 on their hosts: keys, zones, the aggregator, the sites."""
    make_keys(hosted)
    start_zones(hosted, zones)
    hosted.start("aggregator", AGGREGATOR_UP, "aggregator")
    start_sites(hosted, sites)


def _finish(hosted: Hosted) -> dict[str, Any]:
    """Wait for the run to end, then step 5; the run's summary."""
    aggregator = hosted.started["aggregator"]
    hosted.wait_for(lambda: aggregator.poll() is not None, 600, "the run to end")
    assert aggregator.returncode == 0, hosted.tails()
    status = hosted.run(STATUS, "aggregator")
    assert status.returncode == 0, status.stderr
    return hosted.summary()


def _site_variant(hosted: Hosted, site: str, name: str, **deployment: str) -> str:
    """A copy of ``site``'s own config with its own state folder and ``deployment`` changed;
    the ``site up`` command that runs it once (no retries)."""
    folder = hosted.folder / "deploy" / "hosts" / "sites"
    data = yaml.safe_load((folder / f"{site}.yaml").read_text())
    data["site"]["state_dir"] = f"../../../runs/sites/{name}"
    data["deployment"].update(deployment)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return f"fedshard site up --config deploy/hosts/sites/{name}.yaml --retry-s 0"


def test_the_example_federation_runs_with_every_party_on_its_own_host(hosts: Hosts, tmp_path: Path) -> None:
    hosted = Hosted(hosts, copy_configs(tmp_path))
    before = {name: host.link_bytes() for name, host in hosts.hosts.items()}
    try:
        _start(hosted, ZONE_HOSTS, SITES)
        events = hosted.folder / "runs" / "aggregator"
        hosted.wait_for(lambda: any(p.stat().st_size for p in events.glob("run-*/events.jsonl")), 300, "the run")
        # dialling the SuperLink by its address, which its certificate does not hold: one line, at once
        by_address = _site_variant(
            hosted, "charite-berlin", "by-address", superlink=f"{hosts['aggregator'].address}:9092"
        )
        refused = hosted.run(by_address, "charite-berlin", timeout=120)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip().splitlines() == [
            f"error: the SuperNode of charite-berlin cannot join {hosts['aggregator'].address}:9092: the SuperLink's "
            f"certificate does not name {hosts['aggregator'].address} (it names localhost, aggregator, 127.0.0.1); "
            "dial a name it holds in deployment.superlink, or list this one in the aggregator config's "
            "deployment.hosts and issue the federation's keys again (`fedshard keys init`)"
        ], refused.stderr
        summary = _finish(hosted)
        # a firewall between a hospital and its zone: named when the site starts (the zones still run)
        hosts.cut("mayo-rochester", "zone-us-east")
        try:
            cut_off = hosted.run(_site_variant(hosted, "mayo-rochester", "cut-off"), "mayo-rochester", timeout=120)
        finally:
            hosts.mend("mayo-rochester", "zone-us-east")
        warned = [line for line in cut_off.stderr.splitlines() if line.startswith("warning: zone")]
        assert warned == [
            "warning: zone us-east at zone-us-east:9202 is unreachable from this host (timed out): this site's "
            "public, restricted, personal shards go there; open the zone's port to this host, or check its name "
            "and that it is up"
        ], cut_off.stderr
    finally:
        hosted.stop()
    assert summary["rounds"] == 5 and not summary["stopped_reason"], summary["stopped_reason"]
    assert all(len(h["sites"]) >= 3 for h in summary["history"])
    zones = {z["name"]: z for z in summary["zones"]}
    assert zones["eu-central"]["shards_by_class"]["personal from EU"] > 0
    assert not any("from EU" in k for name in ("us-east", "sg-central") for k in zones[name]["shards_by_class"])
    assert all(z["refused"] == 0 for z in zones.values())
    after = {name: host.link_bytes() for name, host in hosts.hosts.items()}
    carried = {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in after}
    assert all(min(carried[site]) > 10_000 for site in SITES), carried  # each hospital's own link, both ways
    assert all(min(carried[host]) > 10_000 for host in ZONE_HOSTS.values()), carried


@pytest.fixture(scope="module")
def lora_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny LLM base, pretrained once into a folder every host reads (each hospital's copy of it)."""
    from fedshard.task import load_task

    cache = tmp_path_factory.mktemp("llm-base").resolve()
    load_task("clients.tasks.llm:task", _lora_options(cache)).base()  # type: ignore[attr-defined]
    return cache


def _lora_options(cache: Path) -> dict[str, Any]:
    from tests.llm_helpers import SMALL

    return {"size": "tiny", "cache_dir": str(cache), "pretrain_epochs": 1, **SMALL}


def test_the_lora_federation_runs_on_the_same_hosts(hosts: Hosts, tmp_path: Path, lora_base: Path) -> None:
    def lora(data: dict[str, Any]) -> None:
        data["federation"].update(rounds=2, min_sites=len(LORA_SITES), round_timeout_s=300)
        data["task"] = {"target": "clients.tasks.llm:task", "options": _lora_options(lora_base)}
        data["training"] = {"local_epochs": 1, "batch_size": 64, "learning_rate": 0.003}
        data["sharding"] = {"tile": [64, 64]}
        data["store"] = {"base": "int8"}  # each site seals the frozen base in its store and streams it
        data.pop("privacy", None)
        data.pop("residency", None)  # the default policy: adapters are personal, kept in their region
        data["zones"] = [z for z in data["zones"] if z["region"] in ("EU", "US")]
        data["sites"] = [s for s in data["sites"] if s["id"] in LORA_SITES]

    hosted = Hosted(hosts, copy_configs(tmp_path, lora))
    zones = {z: h for z, h in ZONE_HOSTS.items() if z != "sg-central"}
    try:
        _start(hosted, zones, LORA_SITES)
        summary = _finish(hosted)
    finally:
        hosted.stop()
    assert summary["rounds"] == 2 and not summary["stopped_reason"], summary["stopped_reason"]
    assert all(len(h["sites"]) == len(LORA_SITES) for h in summary["history"])
    by_zone = {z["name"]: z["shards_by_class"] for z in summary["zones"]}
    assert set(by_zone["eu-central"]) == {"personal from EU"} and set(by_zone["us-east"]) == {"personal from US"}


def test_the_wan_benchmark_runs_in_smoke_mode_and_prints_its_headline(tmp_path: Path) -> None:
    """``bench/wan.py``'s plumbing at its smallest (its own hosts: one deployment, both systems)."""
    out = tmp_path / "BENCH.md"
    proc = subprocess.run(
        [sys.executable, "bench/wan.py", "--smoke", "--json", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    headline = json.loads(proc.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    demo = {key: value["demo"] for key, value in headline.items() if isinstance(value, dict)}
    assert demo["round_s_100mbit"] > demo["link_floor_s_100mbit"] > 0 and demo["flower_round_s_100mbit"] > 0
    assert demo["vs_link_floor_100mbit"] == pytest.approx(demo["round_s_100mbit"] / demo["link_floor_s_100mbit"])
    assert demo["vs_flower_100mbit"] == pytest.approx(demo["round_s_100mbit"] / demo["flower_round_s_100mbit"])
    section = out.read_text().split("<!-- bench:wan -->", 1)[1].split("<!-- /bench:wan -->", 1)[0]
    assert f"| 100 Mbit/s | demo | fedshard | 1 | {demo['round_s_100mbit']:.2f} |" in section
    assert "**Interpretation.**" in section
