"""Privacy budgets end to end: DP-SGD at sites, ledgers, exhaustion, stopping, crashes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fedshard.assembly import STORE_KEYS_DIR
from fedshard.config import FederationConfig
from fedshard.errors import ConfigError
from fedshard.privacy.ledger import PrivacyLedger
from fedshard.simulate.run import simulate
from fedshard.site.ledger_anchor import ANCHOR_META, CatalogAnchor
from fedshard.site.model_store import site_kek
from fedshard.site.privacy import LEDGER_FILE, ledger_key
from fedshard.store._commit import Committer
from tests.toy_federations import dp_toy
from tests.toy_parts import PerTensorNoise  # a mechanism of a task's own (fixture per_tensor: conftest)

ROOT = Path(__file__).resolve().parents[2]


def _config(**privacy_overrides: Any) -> FederationConfig:
    return dp_toy("dp-toy", **privacy_overrides)


def _ledger(root: Path, site: str) -> PrivacyLedger:
    """A simulated site's ledger, opened with its key (derived from the site's store key)."""
    key = ledger_key(site_kek(root / STORE_KEYS_DIR / f"{site}.kek", create=False))
    return PrivacyLedger(root / "sites" / site / LEDGER_FILE, None, key=key)


def _sites(summary: dict) -> dict[str, dict]:
    return {s["id"]: s for s in summary["sites"]}


def test_small_budget_site_is_exhausted_partway_while_others_carry_on(tmp_path: Path) -> None:
    summary = simulate(_config(), tmp_path)
    sites = _sites(summary)
    assert summary["rounds"] == 6 and not summary["stopped_reason"]
    small = sites["small"]
    assert small["status"] == "exhausted"
    assert 0 < small["rounds_participated"] < 6
    assert small["epsilon_spent"] <= small["epsilon_budget"] == 3.0
    for name in ("big-a", "big-b"):
        assert sites[name]["status"] == "active" and sites[name]["rounds_participated"] == 6
        assert 0 < sites[name]["epsilon_spent"] <= 8.0
    # the small site released nothing once exhausted: it is absent from later rounds
    last_with_small = max(h["round"] for h in summary["history"] if "small" in h["sites"])
    assert last_with_small == small["rounds_participated"]
    assert all("small" not in h["sites"] for h in summary["history"] if h["round"] > last_with_small)
    # its ledger on disk agrees and never exceeds the budget
    with _ledger(tmp_path, "small") as ledger:
        entries = ledger.entries()
        assert {e.round for e in entries} == set(range(1, last_with_small + 1))
        assert all(e.committed for e in entries)
        assert max(e.epsilon_after for e in entries) <= 3.0
    # the progress record carries ε per site per round
    rounds = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert all("small" in r["privacy"] for r in rounds if r["event"] == "round")


def test_a_private_round_commits_its_site_store_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model a train message caught up to is saved in the store commit that anchors the round's
    reservation: one commit before training, not two (the model, then the anchor); so is a new
    site's genesis model with its new ledger's anchor, in the commit that creates the store."""
    commits: list[tuple[int | None, int | None]] = []  # (applied round, anchored ledger length) after each
    commit = Committer.commit

    def counted(self: Committer) -> None:
        commit(self)
        if "big-a" in str(self.backend.location):
            meta = self.catalog.meta
            anchored = meta.get(ANCHOR_META, {}).get("head", {}).get("length")
            commits.append((meta.get("site", {}).get("applied_round"), anchored))

    monkeypatch.setattr(Committer, "commit", counted)
    config = _config()
    config = config.model_copy(update={"federation": config.federation.model_copy(update={"rounds": 3})})
    summary = simulate(config, tmp_path)
    assert summary["rounds"] == 3 and _sites(summary)["big-a"]["rounds_participated"] == 3
    # the store created with the genesis model and the new ledger's anchor, round 1's reservation (nothing
    # to catch up), then rounds 2 and 3: each caught up and reserved in one commit; last, round 3 applied
    # for its evaluation
    assert [applied for applied, _ in commits] == [0, 0, 1, 2, 3], commits
    lengths = [length or 0 for _, length in commits]
    assert 0 < lengths[0] < lengths[1] < lengths[2] < lengths[3]  # each carries its round's reservation
    kek = site_kek(tmp_path / STORE_KEYS_DIR / "big-a.kek", create=False)
    anchor = CatalogAnchor(tmp_path / "sites" / "big-a" / "shards", kek).read()
    with _ledger(tmp_path, "big-a") as ledger:
        assert anchor is not None and ledger.contains(anchor.head) and anchor.head.length == lengths[-1]


def test_federation_stops_when_too_few_sites_can_afford_a_round(tmp_path: Path) -> None:
    summary = simulate(_config(budget={"epsilon": 2.5, "delta": 1e-3}), tmp_path)
    assert 0 < summary["rounds"] < 6
    assert "can still take part" in summary["stopped_reason"]
    assert "privacy budget exhausted" in summary["stopped_reason"]
    assert all(s["epsilon_spent"] <= s["epsilon_budget"] for s in summary["sites"])


@pytest.mark.usefixtures("per_tensor")
@pytest.mark.parametrize("mechanism", ["gaussian", "per-tensor"])
def test_update_level_dp_is_accounted_separately(tmp_path: Path, mechanism: str) -> None:
    """Update-level DP, by the built-in mechanism and by a task's own (registered in one line)."""
    update = {"enabled": True, "mechanism": mechanism, "clip_norm": 1.0, "noise_multiplier": 4.0}
    config = _config(update_level=update)
    summary = simulate(
        config.model_copy(update={"federation": config.federation.model_copy(update={"rounds": 2})}), tmp_path
    )
    for site in summary["sites"]:
        assert site["epsilon_record"] > 0 and site["epsilon_update"] > 0
        assert site["epsilon_spent"] == site["epsilon_record"]
    released = PerTensorNoise.released
    assert len(released) == (6 if mechanism == "per-tensor" else 0)  # 3 sites × 2 rounds, through the task's own
    assert all(0 < norm <= 1.0 + 1e-6 for norm in released)


@pytest.mark.slow
def test_a_site_killed_between_reserve_and_commit_counts_the_round_as_spent(tmp_path: Path) -> None:
    """The site process dies (SIGKILL) while training, after its ledger reserved the round."""
    config = _config()
    config_path = tmp_path / "fed.json"
    config_path.write_text(config.model_dump_json())
    script = textwrap.dedent(
        """
        import json, sys
        from fedshard.config import FederationConfig
        from fedshard.assembly import make_site, running_zones, grpc_connector
        from fedshard.protocol.messages import QueryRequest, TrainInstruction
        from fedshard.coordinator.coordinator import Coordinator
        from fedshard.transports.inprocess import InProcessSiteGateway
        from fedshard.protocol.rounds import RoundSpec

        config = FederationConfig.model_validate_json(open(sys.argv[1]).read())
        crash = sys.argv[3] == "crash"
        if crash:
            options = dict(config.task.options, crash_partition=0)
            config = config.model_copy(update={"task": config.task.model_copy(update={"options": options})})
        with running_zones(config, sys.argv[2] + "/zones") as endpoints:
            sites = {s.id: make_site(config, s.id, sys.argv[2] + "/sites") for s in config.sites[:1]}
            coordinator = Coordinator(config, InProcessSiteGateway(sites), {}, endpoints)
            site = sites[config.sites[0].id]
            plan = coordinator._privacy_plan(site.site_id)
            info = site.query(QueryRequest())
            rnd = int(sys.argv[4])
            grpc_connector("z1", endpoints["z1"]).open_round(
                RoundSpec(rnd, "t", info.plan_json, info.genesis_version, (site.site_id,)))
            report = site.train(TrainInstruction(
                round=rnd, token="t", base_version=info.genesis_version,
                missed=[], zones=endpoints, epochs=1, batch_size=10, learning_rate=0.05, seed=1, privacy=plan))
            print(json.dumps(report.model_dump()))
        """
    )
    run = [sys.executable, "-c", script, str(config_path), str(tmp_path)]
    crashed = subprocess.run([*run, "crash", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    with _ledger(tmp_path, "big-a") as ledger:
        status = ledger.status()
        assert status.pending == (1,)
        spent_after_crash = ledger.spent(ledger.entries()[0].event.guarantee)
        assert spent_after_crash > 0 and status.rounds_participated == 1
    # the restarted site (a new process) takes part in the next round; round 1 stays counted
    restarted = subprocess.run([*run, "ok", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    report = json.loads(restarted.stdout.strip().splitlines()[-1])
    assert report["ok"], report
    assert report["privacy"]["rounds_participated"] == 2
    assert report["privacy"]["epsilon_spent"] > spent_after_crash
    with _ledger(tmp_path, "big-a") as ledger:
        entries = ledger.entries()
        assert [(e.round, e.committed) for e in entries] == [(1, False), (2, True)]


def test_batchnorm_is_replaced_for_dp_sgd_at_every_site(tmp_path: Path) -> None:
    config = _config()
    config = config.model_copy(
        update={
            "task": config.task.model_copy(update={"options": {"examples": 50, "batchnorm": True}}),
            "federation": config.federation.model_copy(update={"rounds": 2}),
        }
    )
    summary = simulate(config, tmp_path)
    assert summary["rounds"] == 2 and len(summary["history"][-1]["sites"]) == 3


def test_batchnorm_is_refused_at_config_load_when_it_may_not_be_replaced(tmp_path: Path) -> None:
    config = _config(record_level={"enabled": True, "noise_multiplier": 1.5, "fix_incompatible_layers": False})
    config = config.model_copy(
        update={"task": config.task.model_copy(update={"options": {"examples": 50, "batchnorm": True}})}
    )
    with pytest.raises(ConfigError, match=r"privacy\.record_level: the model has layers DP-SGD cannot train"):
        simulate(config, tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_a_site_budget_above_the_default_is_not_lowered_by_the_query(tmp_path: Path) -> None:
    data = _config().model_dump()
    data["federation"]["rounds"] = 1
    data["sites"][0]["budget"] = {"epsilon": 10.0, "delta": 1e-3}
    config = FederationConfig.model_validate(data)
    summary = simulate(config, tmp_path)
    assert _sites(summary)["big-a"]["epsilon_budget"] == 10.0
    with _ledger(tmp_path, "big-a") as ledger:
        assert ledger.budget.epsilon == 10.0
