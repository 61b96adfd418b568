"""What a site finds after it was killed mid-write: a store created but never given a
model, a calibration cache torn by an older version (see also the crash-point test,
``tests/integration/test_site_crashes.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedshard.privacy.accountant import AccountantKind
from fedshard.protocol.messages import PrivacyPlan, RecordPlan
from fedshard.sharding import ShardPlan
from fedshard.site.model_store import SealedModelStore, site_kek
from fedshard.site.privacy import SitePrivacy
from fedshard.store.sealed_store import SealedShardStore


def test_a_store_killed_before_its_first_model_commit_holds_no_model(tmp_path: Path) -> None:
    kek = site_kek(tmp_path / "keys" / "s.kek", create=True)
    root = tmp_path / "state" / "shards"
    SealedShardStore.open(root, kek, create=True).close()  # the store's first commit: an empty catalog
    store = SealedModelStore(root, kek)
    assert not store.exists()  # so the site saves its genesis model, instead of reading a model that is not there
    values = {"w": np.arange(16, dtype=np.float32).reshape(4, 4)}
    plan = ShardPlan.from_state_dict(values, (2, 2))
    store.save(plan, plan.split(values), {}, {"version": "v0", "plan": plan.to_json()})
    assert store.exists() and store.meta()["version"] == "v0"


def test_a_torn_calibration_cache_is_computed_again_and_replaced_whole(tmp_path: Path) -> None:
    plan = PrivacyPlan(
        accountant=AccountantKind.RDP,
        epsilon=2.0,
        delta=1e-5,
        batch_size=10,
        epochs=1,
        record=RecordPlan(noise_multiplier=None, max_grad_norm=1.0, planned_rounds=5),
    )
    site = SitePrivacy("s1", tmp_path)
    (tmp_path / "privacy-calibration.json").write_text('{"rdp|2.0|1e-05|0.1|')  # a write cut short
    ledger, _ = site.open_ledger(plan, num_examples=100)
    with ledger:
        (event,) = site.round_events(plan, ledger, num_examples=100)
    assert event.noise_multiplier > 0
    assert list(json.loads((tmp_path / "privacy-calibration.json").read_text()).values()) == [event.noise_multiplier]
    assert not list(tmp_path.glob(".privacy-calibration*"))
