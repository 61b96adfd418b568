"""A deployed federation grows while it runs (real processes: ``aggregator up``, zones,
SuperLink, SuperNodes, mutual TLS, record-level DP, CKKS).

After round 2, the operator writes keys for a UK zone and a UK hospital (``keys init
--add``), hands the grown config to the running aggregator (``aggregator reconfigure``)
and starts the new site's SuperNode. The aggregator starts the new zone and registers
the site's key; before its next round the coordinator has every zone re-read its
membership (``Reconfigure``, coordinator certificate only) and takes the change; the
new site joins the residency group of the non-EU sites, catches up to its model version
at its first message and trains from then on, pushing its shards to the new zone, which
forwards its partial sums to the reducing zone. Nothing is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedshard.config import load_federation
from fedshard.deploy.keys import provision
from fedshard.deploy.loopback import free_ports, write_loopback_layout
from tests.deploy_helpers import events, fedshard, start, stop, wait_for

ROOT = Path(__file__).resolve().parents[2]
SITES = ["charite-berlin", "ap-hp-paris", "mayo-rochester", "sgh-singapore"]
ROUNDS = 200
"""Enough for any machine; the test ends the run a few rounds after the new site joined."""
NEW_SITE = "nhs-leeds"

pytestmark = pytest.mark.slow


def _grown(aggregator: Path) -> Path:
    """The aggregator's config plus a UK zone and a UK site, beside it (same relative paths)."""
    data: dict[str, Any] = yaml.safe_load(aggregator.read_text())
    data["zones"].append({"name": "uk-south", "region": "UK", "endpoint": f"127.0.0.1:{free_ports(1)[0]}"})
    data["sites"].append({"id": NEW_SITE, "jurisdiction": "UK"})
    path = aggregator.with_name("aggregator-grown.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _new_site(layout: dict[str, Path], grown: Path) -> Path:
    """The new hospital's own config: a copy of another site's, its id, jurisdiction, port and bundle."""
    data: dict[str, Any] = yaml.safe_load(layout["charite-berlin"].read_text())
    data["site"].update(id=NEW_SITE, jurisdiction="UK", state_dir=f"../../runs/sites/{NEW_SITE}")
    data["deployment"].update(federation=f"../{grown.name}", keys=f"../../keys/sites/{NEW_SITE}", port=free_ports(1)[0])
    path = layout["charite-berlin"].with_name(f"{NEW_SITE}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_zone_and_a_site_join_a_deployed_federation(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["federation"].update(rounds=ROUNDS, round_timeout_s=90, partitions=5)  # room for a fifth site
        data["privacy"]["record_level"]["noise_multiplier"] = 3.0  # ε = 8 lasts the ~20 rounds of the test
        data["deployment"].update(wait_s=240)

    layout = write_loopback_layout(ROOT / "configs", tmp_path, edit=edit)
    provision(load_federation(layout["aggregator"]), tmp_path / "keys")
    grown = _grown(layout["aggregator"])
    logs = tmp_path / "logs"
    logs.mkdir()
    aggregator = start(["aggregator", "up", "--config", str(layout["aggregator"])], tmp_path, logs / "agg.log")
    procs = [aggregator]
    try:
        procs += [start(["site", "up", "--config", str(layout[s])], tmp_path, logs / f"{s}.log") for s in SITES]
        wait_for(lambda: any(e.get("round") == 2 for e in events(tmp_path)), 600, "round 2", procs)

        # keys for the new parties, from the federation's CA; nothing else is rewritten
        before = {p: p.read_bytes() for p in (tmp_path / "keys").rglob("*") if p.is_file()}
        keys = fedshard("keys", "init", "--config", str(grown), "--add", cwd=tmp_path)
        assert keys.returncode == 0, keys.stdout + keys.stderr
        assert all(p.read_bytes() == data for p, data in before.items())
        assert (tmp_path / "keys" / "sites" / NEW_SITE / "he" / "secret.ctx").read_bytes() == (
            tmp_path / "keys" / "sites" / "charite-berlin" / "he" / "secret.ctx"
        ).read_bytes()

        # a change a running federation may not take: one line, nothing left for the run
        bad = yaml.safe_load(grown.read_text())
        bad["zones"] = [z for z in bad["zones"] if z["name"] != "sg-central"]
        bad_file = grown.with_name("aggregator-bad.yaml")
        bad_file.write_text(yaml.safe_dump(bad, sort_keys=False))
        refused = fedshard("aggregator", "reconfigure", "--config", str(bad_file), cwd=tmp_path, timeout=300)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert [ln for ln in refused.stderr.splitlines() if ln.strip()] == [
            "error: zone sg-central is missing from the new config; a running federation keeps its zones (set "
            "`drain: true` to route nothing more to it: it still serves what it published)"
        ]
        run_dir = next((tmp_path / "runs" / "aggregator").glob("run-*"))
        assert not (run_dir / "reconfigure.yaml").exists()

        # the real change: the grown config, the new site's SuperNode
        asked = fedshard("aggregator", "reconfigure", "--config", str(grown), cwd=tmp_path, timeout=300)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert "zone uk-south added; site(s) nhs-leeds joined" in " ".join(asked.stdout.split())
        new_site = _new_site(layout, grown)
        procs.append(start(["site", "up", "--config", str(new_site)], tmp_path, logs / f"{NEW_SITE}.log"))
        wait_for(lambda: _joined(tmp_path) is not None, 600, f"{NEW_SITE} to join", procs)

        # a second change: the run ends three rounds on (nothing else changes; every zone takes it again)
        last = yaml.safe_load(grown.read_text())
        last["federation"]["rounds"] = rounds = max(e.get("round") or 0 for e in events(tmp_path)) + 5
        grown.write_text(yaml.safe_dump(last, sort_keys=False))
        ending = fedshard("aggregator", "reconfigure", "--config", str(grown), cwd=tmp_path, timeout=300)
        assert ending.returncode == 0, ending.stdout + ending.stderr
        assert f"rounds now {rounds}" in ending.stdout
        aggregator.wait(900)
        out = (logs / "agg.log").read_text()
        assert aggregator.returncode == 0, out[-3000:]
    finally:
        stop(procs)

    changes = [e for e in events(tmp_path) if e["event"] == "reconfigured"]
    assert "zone uk-south added" in changes[0]["change"] and changes[-1]["change"] == f"rounds now {rounds}", changes
    joined_at = _joined(tmp_path)
    assert joined_at is not None and 2 < joined_at < rounds
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == rounds and not summary["stopped_reason"]
    history = summary["history"]
    assert all(not h["refused"] for h in history)
    assert all(NEW_SITE not in h["sites"] for h in history[: joined_at - 1])
    assert all(NEW_SITE in h["sites"] for h in history[joined_at - 1 :]), history
    # the new zone received the UK site's shards, every round from its first, and only UK shards
    zones = {z["name"]: z for z in summary["zones"]}
    assert zones["uk-south"]["pushes"] == rounds - joined_at + 1
    assert zones["uk-south"]["shards_by_class"] and all(
        k.endswith("from UK") for k in zones["uk-south"]["shards_by_class"]
    )
    assert all(z["refused"] == 0 for z in zones.values())
    # every zone took the new membership from the coordinator, and audited it
    for name in ("eu-central", "us-east", "sg-central"):
        audit = (run_dir / "zones" / name / "audit.jsonl").read_text()
        assert '"reconfigured"' in audit and '"by": "coordinator' in audit.replace('"by":"', '"by": "'), name
    # the new site holds its group's model version (read from its sealed store)
    group = next(name for name, members in summary["residency_groups"].items() if NEW_SITE in members)
    assert {"mayo-rochester", "sgh-singapore", NEW_SITE} <= set(summary["residency_groups"][group])
    assert _held_version(tmp_path, NEW_SITE) == history[-1]["group_versions"][group]
    assert (run_dir / f"reconfigure.applied-{changes[0]['round']}.yaml").exists()
    assert yaml.safe_load((run_dir / "federation.yaml").read_text())["sites"][-1]["id"] == NEW_SITE


def _joined(root: Path) -> int | None:
    """The round before which the new site was admitted (None: not yet)."""
    changes = [e for e in events(root) if e["event"] == "reconfigured" and NEW_SITE in e.get("joined", [])]
    return int(changes[0]["round"]) if changes else None


def _held_version(root: Path, site_id: str) -> str:
    from fedshard.site.model_store import SealedModelStore, site_kek

    kek = site_kek(root / "keys" / "sites" / site_id / "store.kek", create=False)
    meta, _ = SealedModelStore(root / "runs" / "sites" / site_id / "shards", kek).load()
    return str(meta["version"])
