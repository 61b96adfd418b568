"""The same federation on Flower's simulation engine (Ray) with 10 sites, and in-process.

Sites train deterministically, but the zone folds pushes in arrival order, and Ray runs
sites concurrently, so float64 rounding may differ in the last bit between engines:
the two runs must agree on everything but those bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedshard.integrity import next_version

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _config(tmp_path: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    jurisdictions = ["EU", "EU", "EU", "US", "US", "SG", "SG", "UK", "UK", "EU"]
    cfg["sites"] = [{"id": f"hospital-{i:02d}", "jurisdiction": j} for i, j in enumerate(jurisdictions)]
    cfg["federation"].update(rounds=2, min_sites=8, name="ten-sites", round_timeout_s=600)
    path = tmp_path / "ten.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _simulate(config: Path, engine: str, out: Path) -> dict:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", COLUMNS="200")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedshard.cli.main",
            "simulate",
            "--config",
            str(config),
            "--engine",
            engine,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_flower_engine_with_ten_sites_matches_inprocess(tmp_path: Path) -> None:
    config = _config(tmp_path)
    flower = _simulate(config, "flower", tmp_path / "flower")
    assert flower["engine"] == "flower"
    assert flower["rounds"] == 2
    assert len(flower["sites"]) == 10
    assert all(len(h["sites"]) == 10 for h in flower["history"])
    # sites ran as ClientApps in Ray workers: their on-prem state is on disk, one folder each
    assert sorted(p.name for p in (tmp_path / "flower" / "sites").iterdir()) == [f"hospital-{i:02d}" for i in range(10)]
    # each residency group's version chain in the summary follows from the roots it applied
    versions = {group: flower["genesis_version"] for group in flower["residency_groups"]}
    for h in flower["history"]:
        for group, root in h["group_roots"].items():
            versions[group] = next_version(versions[group], root)
        assert h["group_versions"] == versions
    if len(versions) == 1:
        assert flower["model_version"] == next(iter(versions.values()))
    inprocess = _simulate(config, "inprocess", tmp_path / "inprocess")
    assert inprocess["genesis_version"] == flower["genesis_version"]
    for a, b in zip(flower["history"], inprocess["history"], strict=True):
        assert a["bytes_up"] == b["bytes_up"]
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.03)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3)
