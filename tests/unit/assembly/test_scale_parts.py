"""The parts that keep per-site cost flat at thousands of sites: indexed config and round
lookups, memoised serve decisions, one zone channel per process, the site cache's byte
budget, the synthetic task."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from clients.tasks.synthetic import SyntheticTask
from fedshard.config import FederationConfig
from fedshard.errors import ResidencyViolationError, ZoneUnavailableError
from fedshard.protocol.rounds import DEFAULT_WEIGHT, RoundSpec
from fedshard.task import Partition


def _config(sites: int, **extra: object) -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "scale", "seed": 1, "rounds": 1, "min_sites": 1},
            "task": {"target": "clients.tasks.synthetic:task"},
            "zones": [{"name": "z1", "region": "EU"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(sites)],
            **extra,
        }
    )


def test_site_lookups_follow_the_sites_of_a_copy() -> None:
    config = _config(5)
    assert config.partition_of("s4") == 4 and config.num_partitions == 5 and config.site("s2").id == "s2"
    fewer = config.model_copy(update={"sites": config.sites[:2]})
    assert fewer.num_partitions == 2
    with pytest.raises(KeyError):
        fewer.site("s4")
    assert config.num_partitions == 5  # the original keeps its own index


def test_repeated_site_ids_and_shared_partitions_are_still_refused() -> None:
    with pytest.raises(ValueError, match="repeated: s1"):
        FederationConfig.model_validate(
            {
                "task": {"target": "clients.tasks.synthetic:task"},
                "zones": [{"name": "z1", "region": "EU"}],
                "sites": [{"id": "s1", "jurisdiction": "EU"}, {"id": "s1", "jurisdiction": "EU"}],
            }
        )
    with pytest.raises(ValueError, match="share a data partition"):
        FederationConfig.model_validate(
            {
                "task": {"target": "clients.tasks.synthetic:task"},
                "zones": [{"name": "z1", "region": "EU"}],
                "sites": [{"id": "a", "jurisdiction": "EU"}, {"id": "b", "jurisdiction": "EU", "partition": 0}],
            }
        )


def test_round_spec_lookups_agree_with_its_tuples_and_survive_replace() -> None:
    spec = RoundSpec(1, "t", "{}", "v0", ("a", "b"), base_versions=(("b", "v1"),), weights=(("a", 3.0),))
    assert spec.selects("a") and not spec.selects("c")
    assert spec.version_for("a") == "v0" and spec.version_for("b") == "v1"
    assert spec.weight_for("a") == 3.0 and spec.weight_for("b") == DEFAULT_WEIGHT
    other = dataclasses.replace(spec, sites=("c",), weights=(("c", 2.0),))
    assert other.selects("c") and not other.selects("a") and other.weight_for("c") == 2.0
    assert other != spec and dataclasses.replace(other) == other


def test_a_serve_decision_is_made_once_per_aggregate_and_refusals_repeat() -> None:
    from fedshard.assembly.routing import FederationRouting

    config = _config(2)
    config = config.model_copy(
        update={
            "zones": [*config.zones, config.zones[0].model_copy(update={"name": "z2", "region": "US"})],
            "sites": [*config.sites, config.sites[0].model_copy(update={"id": "us", "jurisdiction": "US"})],
        }
    )
    policy = FederationRouting(config).zone_policy("z1")
    personal = next(sid for sid, cls in policy.classes.items() if cls == "personal")
    contributors = {personal: ["s0", "s1"]}
    calls = []
    decide = policy._decision

    def counted(shard_id: str, site_id: str):  # type: ignore[no-untyped-def]
        calls.append((shard_id, site_id))
        return decide(shard_id, site_id)

    object.__setattr__(policy, "_decision", counted)
    for _ in range(3):
        policy.check_serve("regional/EU", contributors, "EU")
    assert len(calls) == 2  # two contributors, decided once
    for _ in range(2):
        with pytest.raises(ResidencyViolationError, match="may not be served to jurisdiction US"):
            policy.check_serve("regional/EU", contributors, "US")
    policy.check_serve("regional/EU", {personal: ["s0"]}, "EU")  # another aggregate: decided anew
    assert len(calls) == 4


def test_a_shared_channel_that_found_its_zone_down_is_replaced() -> None:
    from fedshard.zone.rpc.shared import SharedZoneChannels

    channels = SharedZoneChannels(timeout=5)
    try:
        first = channels("z1", "127.0.0.1:1")  # nothing listens on port 1
        assert channels("z1", "127.0.0.1:1")._client is first._client  # type: ignore[attr-defined]
        with pytest.raises(ZoneUnavailableError):
            first.fetch(1, "global", "s0")
        first.close()  # a site's close keeps nothing open and breaks nothing
        again = channels("z1", "127.0.0.1:1")
        assert again._client is not first._client  # type: ignore[attr-defined]
    finally:
        channels.close()


def test_a_process_keeps_every_small_site_and_drops_big_ones(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import fedshard.assembly._cache as assembly

    monkeypatch.setattr(assembly, "_SITES", type(assembly._SITES)())
    config = _config(12)
    for s in config.sites:
        assembly.site_for(config, s.id, tmp_path / "sites").model.module()
    assert len(assembly._SITES) == 12  # small models: all kept (well under SITE_CACHE_BYTES)
    monkeypatch.setattr(assembly, "SITE_CACHE_BYTES", 0)
    assembly.site_for(config, "s0", tmp_path / "other").model.module()
    assert len(assembly._SITES) == assembly.SITE_CACHE_SIZE


def test_the_synthetic_task_gives_each_site_its_own_examples_and_the_baseline_all() -> None:
    task = SyntheticTask(train_per_site=6, test_per_site=2)
    one = task.load_data(Partition(3, 10_000, seed=7))
    again = task.load_data(Partition(3, 10_000, seed=7))
    other = task.load_data(Partition(4, 10_000, seed=7))
    assert (one.num_train, one.num_test) == (6, 2)
    assert np.array_equal(one.train.x, again.train.x) and not np.array_equal(one.train.x, other.train.x)
    union = task.load_data(Partition(None, 5, seed=7))
    assert union.num_train == 30
    assert np.array_equal(union.train.x[18:24], task.load_data(Partition(3, 5, seed=7)).train.x)
    labels = union.train.y.numpy()
    assert 0 < labels.mean() < 1  # both classes occur
    with pytest.raises(ValueError):
        SyntheticTask(classes=1)


def test_progress_lines_count_sites_beyond_a_dozen() -> None:
    from rich.console import Console

    from fedshard.cli._progress import SHOWN_SITES, RoundProgress
    from fedshard.coordinator.results import RoundResult
    from fedshard.protocol.messages import SiteInfo

    console = Console(record=True, width=100)
    sites = [
        SiteInfo(
            site_id=f"s{i}",
            jurisdiction="EU" if i % 2 else "US",
            num_examples=6,
            plan_digest="p",
            plan_json="{}",
            genesis_version="g",
        )
        for i in range(SHOWN_SITES + 8)
    ]
    privacy = {
        s.site_id: {"epsilon_spent": 0.5 + i / 100, "epsilon_budget": 10.0, "status": "active"}
        for i, s in enumerate(sites)
    }
    privacy["s3"]["status"] = "exhausted"
    result = RoundResult(
        round=1,
        version="v" * 64,
        merkle_root="r",
        sites=tuple(s.site_id for s in sites),
        refused={},
        train_loss=0.5,
        accuracy=0.9,
        loss=0.3,
        bytes_up=1,
        privacy=privacy,
    )
    with RoundProgress(console) as progress:
        progress.on_start(sites, 2, "g" * 64)
        progress.on_round(result)
    text = console.export_text()
    assert "20 sites: 10 in EU, 10 in US" in text and "s19 (" not in text
    assert "ε spent 0.50 / 0.60 / 0.69 (least / median / most)  1 site(s) stopped" in text


def test_a_site_assembled_for_a_changed_config_replaces_the_one_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A process that runs one federation after another (a resumed simulation) holds each site once."""
    import fedshard.assembly._cache as assembly

    monkeypatch.setattr(assembly, "_SITES", type(assembly._SITES)())
    config = _config(3)
    first = assembly.site_for(config, "s0", tmp_path / "sites")
    assert assembly.site_for(config, "s0", tmp_path / "sites") is first
    later = config.model_copy(update={"federation": config.federation.model_copy(update={"rounds": 9})})
    again = assembly.site_for(later, "s0", tmp_path / "sites")
    assert again is not first and len(assembly._SITES) == 1
