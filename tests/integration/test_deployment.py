"""A deployed federation: `fedshard keys init`, `aggregator up` and `site up` as separate
processes on loopback (Flower SuperLink + SuperNodes with TLS and SuperNode
authentication, three zones with mutual TLS), record-level DP, encrypted personal
shards, residency routing; a site that is not registered is refused; a site killed
mid-run leaves the others going and rejoins when restarted. Three sites run fedshard's
warm executor, one Flower's stock executor (the fallback path).

The same deployment then grows while it runs: the operator writes keys for a UK zone and
a UK hospital (``keys init --add``), hands the grown config to the running aggregator
(``aggregator reconfigure``) and starts the new site's SuperNode. The aggregator starts
the new zone and registers the site's key; before its next round the coordinator has
every zone re-read its membership (``Reconfigure``, coordinator certificate only); the
new site joins the residency group of the non-EU sites, catches up to its model version
at its first message and trains from then on, pushing its shards to the new zone, which
forwards its partial sums to the reducing zone. Nothing is refused."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedshard.config import load_federation
from fedshard.deploy.keys import generate_supernode_key, provision
from fedshard.deploy.loopback import free_ports, write_loopback_layout
from tests.deploy_helpers import events, fedshard, kill_tree, start, stop, wait_for
from tests.metrics_helpers import scrape, value

ROOT = Path(__file__).resolve().parents[2]
SITES = ["charite-berlin", "ap-hp-paris", "mayo-rochester", "sgh-singapore"]
STOCK = "mayo-rochester"
"""The site that runs Flower's stock executor (``site up --executor flower``)."""
NEW_SITE = "nhs-leeds"
ROUNDS = 200
"""Enough for any machine; the test ends the run two rounds after the new site joined."""
ROUND_TIMEOUT_S = 120
"""A round waits this long for a reply (a round takes ~10 s on a quiet 2-core machine). The stock
executor's site starts a process for each message: beside the rest of the suite on 2 cores, one
such reply once took over 60 s, and the healthy site was counted out of its round."""


def write_layout(root: Path, *, rounds: int, tls: bool = True) -> dict[str, Path]:
    """The shipped configs/aggregator.yaml and configs/sites/*.yaml on free ports, under ``root``."""

    def edit(data: dict[str, Any]) -> None:
        data["federation"].update(rounds=rounds, round_timeout_s=ROUND_TIMEOUT_S, partitions=5)  # room for a 5th site
        data["privacy"]["record_level"]["noise_multiplier"] = 3.0  # ε = 8 lasts the rounds of the test
        data["deployment"].update(wait_s=240)

    return write_loopback_layout(ROOT / "configs", root, edit=edit, tls=tls)


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[dict[str, Path]]:
    paths = write_layout(tmp_path, rounds=ROUNDS)
    provision(load_federation(paths["aggregator"]), tmp_path / "keys")
    yield paths


@pytest.mark.slow
def test_deployed_federation_survives_a_crash_refuses_an_unknown_site_and_grows(
    tmp_path: Path, layout: dict[str, Path]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    up = ["aggregator", "up", "--config", str(layout["aggregator"]), "--metrics-port", "0"]  # any free ports
    aggregator = start(up, tmp_path, logs / "agg.log")
    procs = [aggregator]
    sites: dict[str, subprocess.Popen[bytes]] = {}
    grown = _grown(layout["aggregator"])
    try:
        for site in SITES:
            stock = ["--executor", "flower"] if site == STOCK else []
            sites[site] = start(["site", "up", "--config", str(layout[site]), *stock], tmp_path, logs / f"{site}.log")
        procs += list(sites.values())

        # An impostor: a valid site config and certificate, but a SuperNode key nobody registered.
        rogue = tmp_path / "rogue-keys" / "mayo-rochester"
        bundle = tmp_path / "keys" / "sites" / "mayo-rochester"
        shutil.copytree(bundle, rogue)  # modes kept: a bundle whose keys others may read is refused first
        (rogue / "supernode.key").unlink()
        generate_supernode_key(rogue / "supernode.key", tmp_path / "rogue.pub")
        rogue_cfg = yaml.safe_load(layout["mayo-rochester"].read_text())
        rogue_cfg["deployment"].update(keys=str(rogue), port=free_ports(1)[0])
        rogue_cfg["site"]["state_dir"] = str(tmp_path / "rogue-state")
        rogue_file = layout["mayo-rochester"].with_name("rogue.yaml")  # beside the others: same relative paths
        rogue_file.write_text(yaml.safe_dump(rogue_cfg))
        wait_for(lambda: len(events(tmp_path)) >= 1, 300, "the run to start", procs)
        refused = fedshard("site", "up", "--config", str(rogue_file), "--retry-s", "0", cwd=tmp_path)
        assert refused.returncode == 2
        assert "could not join" in refused.stderr and "registered" in refused.stderr
        # A site holding another federation's bundle: a permanent TLS failure, named at once (no retries)
        other = tmp_path / "other-keys"
        provision(load_federation(layout["aggregator"]), other)
        foreign = yaml.safe_load(layout["charite-berlin"].read_text())
        foreign["deployment"].update(keys=str(other / "sites" / "charite-berlin"), port=free_ports(1)[0])
        foreign["site"]["state_dir"] = str(tmp_path / "foreign-state")
        foreign_file = layout["charite-berlin"].with_name("foreign.yaml")
        foreign_file.write_text(yaml.safe_dump(foreign))
        crossed = fedshard("site", "up", "--config", str(foreign_file), cwd=tmp_path, timeout=60)  # --retry-s 300
        said = " ".join(crossed.stderr.split())
        assert crossed.returncode == 2 and "is not this federation's SuperLink" in said, said
        assert "was not issued by the federation CA" in said

        # Crash one site once round 1 is in; restart it once round 2 has gone on without it. (Restarted
        # sooner, it may reconnect before the SuperLink gives up on it, and answer round 2 after all.)
        wait_for(lambda: any(e["event"] == "round" for e in events(tmp_path)), 400, "round 1", procs)
        kill_tree(sites["sgh-singapore"])
        sites["sgh-singapore"].wait(10)
        _check_site_status(tmp_path, layout)
        wait_for(
            lambda: any(e["event"] == "round" and e["round"] == 2 for e in events(tmp_path)), 400, "round 2", procs
        )
        _scrape_while_running(tmp_path / "runs" / "aggregator")
        sites["sgh-singapore"] = start(
            ["site", "up", "--config", str(layout["sgh-singapore"])], tmp_path, logs / "sgh-singapore.log"
        )
        procs.append(sites["sgh-singapore"])

        # The federation grows while it runs: keys for a UK zone and a UK hospital from the
        # federation's CA (nothing else rewritten), a change it may not take refused in one line,
        # then the grown config and the new site's SuperNode.
        run_dir = next((tmp_path / "runs" / "aggregator").glob("run-*"))
        _grow(tmp_path, layout, grown, run_dir, procs)

        # a last change: the run ends two rounds on (nothing else changes; every zone takes it again)
        last = yaml.safe_load(grown.read_text())
        last["federation"]["rounds"] = rounds = max(e.get("round") or 0 for e in events(tmp_path)) + 2
        # written whole, then renamed: the grown site reads this file at every round
        grown.with_suffix(".tmp").write_text(yaml.safe_dump(last, sort_keys=False))
        grown.with_suffix(".tmp").replace(grown)
        ending = fedshard("aggregator", "reconfigure", "--config", str(grown), cwd=tmp_path, timeout=300)
        assert ending.returncode == 0, ending.stdout + ending.stderr
        assert f"rounds now {rounds}" in ending.stdout

        aggregator.wait(900)
        out = (logs / "agg.log").read_text()
        assert aggregator.returncode == 0, out[-3000:]
    finally:
        stop(procs)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["engine"] == "deployment" and summary["rounds"] == rounds and not summary["stopped_reason"]
    history = summary["history"]
    # the crashed site missed a round (the SuperLink may say why), the others went on, and it rejoined;
    # nothing else failed or was refused
    missed = [h["round"] for h in history if "sgh-singapore" not in h["sites"]]
    assert missed and all(len(h["sites"]) >= 3 for h in history)
    # (killed once round 1 was in, it may have trained in round 2 and been refused at its evaluation)
    crashed = {2, *missed}
    assert all(set(h["refused"]) <= ({"sgh-singapore"} if h["round"] in crashed else set()) for h in history), [
        (h["round"], h["refused"]) for h in history
    ]
    assert "sgh-singapore" in history[-1]["sites"], history
    # learning happened (the majority class is 63 % of the data), within every site's budget; the best
    # round, not the last: with σ = 3 on ~90 records a site, one round's noise can cost 20 points
    # (measured: 0.93 after round 2, 0.63 after round 3, 0.81 after round 5)
    assert max(h["accuracy"] for h in history) >= 0.75
    for site in summary["sites"]:
        assert 0 < site["epsilon_spent"] <= site["epsilon_budget"] <= 8.0
    # residency: EU personal shards only in the EU zone; personal shards travelled encrypted
    zones = {z["name"]: z for z in summary["zones"]}
    assert zones["eu-central"]["shards_by_class"]["personal from EU"] > 0
    assert not any(
        "from EU" in key for name in ("us-east", "sg-central", "uk-south") for key in zones[name]["shards_by_class"]
    )
    assert all(z["refused"] == 0 for z in zones.values())
    # the site's ledger survived the crash: it records every round it took part in, and at most one
    # more (spend before release: killed after its spend and before its reply, it paid for a round
    # it never released)
    released = [h["round"] for h in history if "sgh-singapore" in h["sites"]]
    site_summary = {s["id"]: s for s in summary["sites"]}["sgh-singapore"]
    assert len(released) <= site_summary["rounds_participated"] <= len(released) + 1
    # three sites ran warm (one forked ClientApp per message), one Flower's stock executor
    for site in SITES:
        log = (tmp_path / "runs" / "sites" / site / "supernode.log").read_text()
        assert ("fedshard warm executor: " in log) == (site != STOCK), site
        said = " ".join((logs / f"{site}.log").read_text().split())  # rich wraps long lines
        assert ("flower executor; log" if site == STOCK else "warm executor; log") in said, said
    _check_growth(tmp_path, run_dir, summary, rounds)
    _check_report(run_dir, tmp_path)
    # the status command reads the same state once
    status = fedshard("aggregator", "status", "--config", str(grown), cwd=tmp_path)
    assert status.returncode == 0 and "finished" in status.stdout and f"round {rounds}/{rounds}" in status.stdout
    # `budget show --config` finds the deployed run (under deployment.state_dir) without --run
    shown = fedshard("budget", "show", "--config", str(grown), "--json", cwd=tmp_path)
    assert shown.returncode == 0 and {s["id"] for s in json.loads(shown.stdout)} == {*SITES, NEW_SITE}, shown.stderr
    said = " ".join(status.stdout.split())
    assert "change ready" not in said and "change taken before round" in said and f"rounds now {rounds}" in said


def _check_site_status(root: Path, layout: dict[str, Path]) -> None:
    """`site status` on a site's host: a running site (its ledger read as it runs), one whose
    `site up` was killed (said, with the command that restarts it). (A second `site up` of a
    running site is refused: tests/unit/deploy/test_host_lock.py.)"""
    running = fedshard("site", "status", "--config", str(layout["charite-berlin"]), "--json", cwd=root)
    assert running.returncode == 0, running.stderr
    doc = json.loads(running.stdout)
    assert doc["running"] and not doc["died"] and doc["up"]["phase"] == "running" and doc["up"]["supernode_pid"]
    assert doc["ledger"]["rounds_participated"] >= 1 and 0 < doc["ledger"]["epsilon_spent"] <= 8.0
    killed = fedshard("site", "status", "--config", str(layout["sgh-singapore"]), cwd=root)
    said = " ".join(killed.stdout.split())
    assert killed.returncode == 0 and "died while running" in said and "site up --config" in said, said


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


def _grow(
    root: Path, layout: dict[str, Path], grown: Path, run_dir: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Add the UK zone and site to the running federation (``keys init --add``, ``aggregator
    reconfigure``, the new site's ``site up``); return once the site was admitted."""
    before = {p: p.read_bytes() for p in (root / "keys").rglob("*") if p.is_file()}
    keys = fedshard("keys", "init", "--config", str(grown), "--add", cwd=root)
    assert keys.returncode == 0, keys.stdout + keys.stderr
    assert all(p.read_bytes() == data for p, data in before.items())
    assert (root / "keys" / "sites" / NEW_SITE / "he" / "secret.ctx").read_bytes() == (
        root / "keys" / "sites" / "charite-berlin" / "he" / "secret.ctx"
    ).read_bytes()

    # a change a running federation may not take: one line, nothing left for the run
    bad = yaml.safe_load(grown.read_text())
    bad["zones"] = [z for z in bad["zones"] if z["name"] != "sg-central"]
    bad_file = grown.with_name("aggregator-bad.yaml")
    bad_file.write_text(yaml.safe_dump(bad, sort_keys=False))
    refused = fedshard("aggregator", "reconfigure", "--config", str(bad_file), cwd=root, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert [ln for ln in refused.stderr.splitlines() if ln.strip()] == [
        "error: zone sg-central is missing from the new config; a running federation keeps its zones (set "
        "`drain: true` to route nothing more to it: it still serves what it published)"
    ]
    assert not (run_dir / "reconfigure.yaml").exists()

    asked = fedshard("aggregator", "reconfigure", "--config", str(grown), cwd=root, timeout=300)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "zone uk-south added; site(s) nhs-leeds joined" in " ".join(asked.stdout.split())
    new_site = _new_site(layout, grown)
    procs.append(start(["site", "up", "--config", str(new_site)], root, root / "logs" / f"{NEW_SITE}.log"))
    wait_for(lambda: _joined(root) is not None, 600, f"{NEW_SITE} to join", procs)


def _check_growth(root: Path, run_dir: Path, summary: dict[str, Any], rounds: int) -> None:
    """After the run: the new zone and site took part from the round the site was admitted before."""
    changes = [e for e in events(root) if e["event"] == "reconfigured"]
    assert "zone uk-south added" in changes[0]["change"] and changes[-1]["change"] == f"rounds now {rounds}", changes
    joined_at = _joined(root)
    assert joined_at is not None and 2 < joined_at < rounds
    history = summary["history"]
    assert all(NEW_SITE not in h["sites"] for h in history[: joined_at - 1])
    assert all(NEW_SITE in h["sites"] for h in history[joined_at - 1 :]), history
    # the new zone received the UK site's shards, every round from its first, and only UK shards
    zones = {z["name"]: z for z in summary["zones"]}
    assert zones["uk-south"]["pushes"] == rounds - joined_at + 1
    assert zones["uk-south"]["shards_by_class"] and all(
        k.endswith("from UK") for k in zones["uk-south"]["shards_by_class"]
    )
    # every zone took the new membership from the coordinator, and audited it
    for name in ("eu-central", "us-east", "sg-central"):
        audit = (run_dir / "zones" / name / "audit.jsonl").read_text()
        assert '"reconfigured"' in audit and '"by": "coordinator' in audit.replace('"by":"', '"by": "'), name
    # the new site joined the non-EU sites' residency group and holds its model version (from its sealed store)
    group = next(name for name, members in summary["residency_groups"].items() if NEW_SITE in members)
    assert {"mayo-rochester", "sgh-singapore", NEW_SITE} <= set(summary["residency_groups"][group])
    assert _held_version(root, NEW_SITE) == history[-1]["group_versions"][group]
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


def _check_report(run_dir: Path, cwd: Path) -> None:
    """The report of the deployed run: the same residency, from the zones' own counts."""
    report = fedshard("report", str(run_dir), cwd=cwd)
    assert report.returncode == 0, report.stderr
    page = (run_dir / "report" / "report.html").read_text()
    assert "personal from EU: raw shards received in EU only" in page and "sgh-singapore" in page
    # the UK zone and site joined mid-run: the change and the late joiner are on the page
    assert "zone uk-south added" in page and f"<td>{NEW_SITE}</td>" in page and "before round" in page
    # the run's metrics outlive it (the aggregator served them on --metrics-port)
    assert "fedshard_round " in (run_dir / "metrics.prom").read_text()


def _scrape_while_running(state_dir: Path) -> None:
    """The run's metrics (where status.json says) and a zone's (where its log says), once round 2 opened."""
    status = json.loads((state_dir / "status.json").read_text())
    run = scrape(status["metrics"])
    assert value(run, "fedshard_round") >= 1 and value(run, "fedshard_run_finished") == 0
    assert value(run, "fedshard_sites") == len(SITES) and value(run, "fedshard_sites_connected") >= 3
    assert value(run, "fedshard_round_phase_seconds_count", phase="train") >= 1
    for site in SITES:
        assert 0 < value(run, "fedshard_site_epsilon_spent", site=site) <= 8.0
    log = (state_dir / "logs" / "zone-eu-central.log").read_text()
    (url,) = re.findall(r"zone metrics: (http://\S+)", log)
    zone = scrape(url)
    assert value(zone, "fedshard_zone_round", zone="eu-central") >= 2
    assert value(zone, "fedshard_zone_pushes_total", zone="eu-central") >= 2  # two EU sites, round 1
    assert value(zone, "fedshard_zone_shards_total", zone="eu-central", shard_class="personal", origin="EU") > 0
    assert value(zone, "fedshard_zone_info", zone="eu-central", reducing="true") == 1


def test_keys_init_writes_each_file_once_with_restrictive_modes(tmp_path: Path) -> None:
    paths = write_layout(tmp_path, rounds=1)
    config = load_federation(paths["aggregator"])
    report = provision(config, tmp_path / "keys")
    secret = [p for p in report.files if p.suffix in (".key", ".kek") or p.name == "secret.ctx"]
    assert secret and all(oct(p.stat().st_mode & 0o777) == "0o600" for p in secret)
    agg = tmp_path / "keys" / "aggregator"
    assert not list(agg.rglob("secret.ctx")) and not list(agg.rglob("signing.key"))
    assert (agg / "he" / "public.ctx").exists()
    for site in SITES:
        bundle = tmp_path / "keys" / "sites" / site
        names = {p.name for p in bundle.rglob("*") if p.is_file()}
        assert names == {
            "ca.pem",
            f"{site}.pem",
            f"{site}.key",
            "supernode.key",
            "signing.key",
            "signing.key.pub",
            "secret.ctx",
            "store.kek",
        }
        assert (agg / "supernodes" / f"{site}.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    before = {p: p.read_bytes() for p in report.files}
    proc = fedshard("keys", "init", "--config", str(paths["aggregator"]), "--out", str(tmp_path / "keys"), cwd=tmp_path)
    assert proc.returncode == 2 and "already exists: pass --force" in proc.stderr
    assert all(p.read_bytes() == data for p, data in before.items())


def test_keys_init_add_writes_keys_for_the_new_parties_only(tmp_path: Path) -> None:
    paths = write_layout(tmp_path, rounds=1)
    provision(load_federation(paths["aggregator"]), tmp_path / "keys")
    keys = tmp_path / "keys"
    before = {p: p.read_bytes() for p in keys.rglob("*") if p.is_file()}
    grown = yaml.safe_load(paths["aggregator"].read_text())
    grown["zones"].append({"name": "uk-south", "region": "UK", "endpoint": "127.0.0.1:9204"})
    grown["sites"].append({"id": "nhs-leeds", "jurisdiction": "UK"})
    grown_file = paths["aggregator"].with_name("grown.yaml")
    grown_file.write_text(yaml.safe_dump(grown))
    report = provision(load_federation(grown_file), keys, add=True)
    assert all(p.read_bytes() == data for p, data in before.items())  # nothing rewritten
    written = {str(p.relative_to(keys)) for p in report.files}
    assert written == {p for p in (str(q.relative_to(keys)) for q in keys.rglob("*") if q.is_file())} - {
        str(p.relative_to(keys)) for p in before
    }
    assert {
        "aggregator/zones/uk-south.pem",
        "aggregator/site-keys/nhs-leeds.pub",
        "aggregator/supernodes/nhs-leeds.pub",
    } <= written
    assert all(w.startswith(("aggregator/", "sites/nhs-leeds/")) for w in written), written
    secret = keys / "sites" / "nhs-leeds" / "he" / "secret.ctx"
    assert secret.read_bytes() == (keys / "sites" / "charite-berlin" / "he" / "secret.ctx").read_bytes()
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    # the new certificates are the federation CA's
    from cryptography import x509

    ca = x509.load_pem_x509_certificate((keys / "ca" / "ca.pem").read_bytes())
    zone = x509.load_pem_x509_certificate((keys / "aggregator" / "zones" / "uk-south.pem").read_bytes())
    zone.verify_directly_issued_by(ca)
    assert provision(load_federation(grown_file), keys, add=True).files == []  # again: nothing to add


def test_unsafe_deployments_are_refused_with_one_line(tmp_path: Path) -> None:
    paths = write_layout(tmp_path, rounds=1, tls=False)
    proc = fedshard("aggregator", "up", "--config", str(paths["aggregator"]), cwd=tmp_path)
    assert proc.returncode == 2 and "pass --insecure" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = fedshard("site", "up", "--config", str(paths["mayo-rochester"]), cwd=tmp_path)
    assert proc.returncode == 2 and "pass --insecure" in proc.stderr

    tls = write_layout(tmp_path / "tls", rounds=1)
    provision(load_federation(tls["aggregator"]), tmp_path / "tls" / "keys")
    leaked = tmp_path / "tls" / "keys" / "aggregator" / "he" / "secret.ctx"
    leaked.write_bytes((tmp_path / "tls" / "keys" / "sites" / "ap-hp-paris" / "he" / "secret.ctx").read_bytes())
    proc = fedshard("aggregator", "up", "--config", str(tls["aggregator"]), cwd=tmp_path)
    assert proc.returncode == 2 and "must not hold the HE secret context" in proc.stderr
    assert not (tmp_path / "tls" / "runs").exists()  # refused before anything started or was written
