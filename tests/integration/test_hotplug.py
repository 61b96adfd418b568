"""A running federation grows: a zone and a site are added between rounds (real processes).

``fedshard simulate`` runs ``configs/grow.yaml`` in its own process; ``fedshard
reconfigure`` (another process) hands it ``configs/grow-more.yaml``: a UK zone and a
second UK site. Before the change the UK site's
shards go to the reducing zone in the EU (no UK zone to push to); after it they go to the
new UK zone, which forwards its partial sums of global shards to the reducing zone; the
new site joins the residency group of the non-EU sites, catches up to its model version
at its first message and trains from then on. Nothing is refused, before or after.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_helpers import FEDSHARD, env
from tests.zone_helpers import site_model

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

BASE: dict[str, Any] = yaml.safe_load((ROOT / "configs" / "grow.yaml").read_text())
BASE["federation"]["rounds"] = 2000  # ended 15 rounds after the change is taken, below
GROWN: dict[str, Any] = yaml.safe_load((ROOT / "configs" / "grow-more.yaml").read_text())


def _events(run: Path) -> list[dict[str, Any]]:
    path = run / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _rounds_done(run: Path) -> int:
    return sum(1 for e in _events(run) if e["event"] == "round")


def _reconfigure(run: Path, config: dict[str, Any], path: Path) -> subprocess.CompletedProcess[str]:
    """``fedshard reconfigure run --config path`` with ``config`` written to ``path`` (its own process)."""
    path.write_text(yaml.safe_dump(config))
    cmd = [*FEDSHARD, "reconfigure", str(run), "--config", str(path)]
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, check=False)


def test_a_zone_and_a_site_join_a_running_federation(tmp_path: Path) -> None:
    base, run = tmp_path / "base.yaml", tmp_path / "run"
    base.write_text(yaml.safe_dump(BASE))
    sim = subprocess.Popen(
        [*FEDSHARD, "simulate", "--config", str(base), "--out", str(run)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while _rounds_done(run) < 2:
            assert sim.poll() is None, sim.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the simulation did not finish 2 rounds in 180 s"
            time.sleep(0.2)
        # a change the run may not take is refused by the command, in one line, and left nowhere
        bad = json.loads(json.dumps(BASE))
        bad["zones"] = bad["zones"][:2]
        refused = _reconfigure(run, bad, tmp_path / "bad.yaml")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert [ln for ln in refused.stderr.splitlines() if ln.strip()] == [
            "error: zone sg-central is missing from the new config; a running federation keeps its zones (set "
            "`drain: true` to route nothing more to it: it still serves what it published)"
        ]
        assert not (run / "reconfigure.yaml").exists()
        # the real change: a UK zone and a second UK site (the run keeps its 2000 rounds) ...
        grown = json.loads(json.dumps(GROWN))
        grown["federation"]["rounds"] = BASE["federation"]["rounds"]
        asked = _reconfigure(run, grown, tmp_path / "grown.yaml")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert "zone uk-south added; site(s) uk-2 joined" in asked.stdout
        deadline = time.monotonic() + 180
        while not any(e["event"] == "reconfigured" for e in _events(run)):
            assert sim.poll() is None and time.monotonic() < deadline, "the change was not taken"
            time.sleep(0.2)
        # ... and once it is taken, a second change ends the run 15 rounds on (rounds here take a fraction
        # of a second: the command must land before the run gets there)
        grown["federation"]["rounds"] = _rounds_done(run) + 15
        ending = _reconfigure(run, grown, tmp_path / "ending.yaml")
        assert ending.returncode == 0, ending.stdout + ending.stderr
        _, err = sim.communicate(timeout=600)
        assert sim.returncode == 0, err[-3000:]
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
    events = _events(run)
    change, last = [e for e in events if e["event"] == "reconfigured"]
    assert last["change"] == f"rounds now {grown['federation']['rounds']}" and not last["joined"]
    taken = change["round"]
    assert change["joined"] == ["uk-2"] and "zone uk-south added" in change["change"]
    summary = json.loads((run / "summary.json").read_text())
    # the run ends at the asked round, or at once if it had gone past it before the command landed
    ended = max(grown["federation"]["rounds"], last["round"] - 1)
    assert summary["rounds"] == ended > taken and not summary["stopped_reason"]
    history = summary["history"]
    assert all(not h["refused"] for h in history)  # nothing refused, before or after
    # no reply left out: a push to the new zone is a push to a zone of the federation
    assert all(not e.get("excluded") for e in events if e["event"] == "round"), [e.get("excluded") for e in events]
    assert all("uk-2" not in h["sites"] for h in history[: taken - 1])
    assert all("uk-2" in h["sites"] and "uk-1" in h["sites"] for h in history[taken - 1 :])
    zones = {z["name"]: z for z in summary["zones"]}
    # after the change the UK sites push to the UK zone, every round, and only UK shards arrive there
    rounds_after = summary["rounds"] - taken + 1
    assert zones["uk-south"]["pushes"] == 2 * rounds_after
    assert set(zones["uk-south"]["shards_by_class"]) == {"personal from UK", "public from UK"}
    assert all(not z["refused"] for z in zones.values())
    # before it, uk-1 pushed to the reducing zone (the only zone its shards could go to)
    assert zones["eu-central"]["pushes"] == 2 * summary["rounds"] + (taken - 1)
    # the new site holds the model of its residency group, as the other non-EU sites do
    group = next(name for name, members in summary["residency_groups"].items() if "uk-2" in members)
    assert set(summary["residency_groups"][group]) == {"us-1", "sg-1", "uk-1", "uk-2"}
    expected = history[-1]["group_versions"][group]
    assert (
        site_model(run / "sites", "uk-2")[0]["version"] == expected == site_model(run / "sites", "us-1")[0]["version"]
    )
    assert (run / f"reconfigure.applied-{taken}.yaml").exists()
    assert yaml.safe_load((run / "federation.yaml").read_text())["sites"][-1]["id"] == "uk-2"
