"""Issue 13, items 2 and 8: weights and values bounded by what the coordinator knows.

Against real ``fedshard zone up`` processes with mutual TLS: the coordinator opens a
round with each site's weight fixed; a member site (``mayo-rochester``, US, valid
certificate and signing key) then pushes manifests claiming weights of 10⁹ and 10³⁰⁸,
and updates with huge finite values. Each is refused (``weight``, ``bound``), audited,
and the honest sites' aggregates are published exactly as if the attacker had only
pushed honestly: the non-reducing zone's partial sums stay finite, so the federation
closes the round. With ``aggregation.max_update_norm`` a scaled update is clipped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedshard.errors import PushRejectedError, RefusalCode
from fedshard.residency import AggregateKey
from tests.security.conftest import LiveFederation, Shards, live_federation

pytestmark = pytest.mark.slow

ATTACKER = "mayo-rochester"
WEIGHTS = {"charite-berlin": 120.0, "ap-hp-paris": 80.0, "mayo-rochester": 100.0, "sgh-singapore": 60.0}


def _refused(records: list[dict[str, Any]], code: RefusalCode) -> list[dict[str, Any]]:
    return [r for r in records if r["decision"] == "refused" and r.get("code") == code]


def _push_everyone(fed: LiveFederation, spec: Any) -> dict[str, dict[str, Shards]]:
    """Every site pushes an honest update to every zone its routes use; site → zone → values."""
    pushed: dict[str, dict[str, Shards]] = {}
    for i, site in enumerate(fed.sites):
        for zone in fed.routes(site):
            pushed.setdefault(site, {})[zone] = fed.push(site, zone, spec, seed=10 + i)
    return pushed


def _expected(fed: LiveFederation, pushed: dict[str, dict[str, Shards]], key: AggregateKey, sid: str) -> np.ndarray:
    """The weighted mean of shard ``sid`` over the sites whose routes put it in aggregate ``key``."""
    total, weight = 0.0, 0.0
    for site, zones in pushed.items():
        decision = fed.routing.site(site).routes[sid]
        if decision.aggregate == key:
            total = total + WEIGHTS[site] * zones[decision.zone][sid].astype(np.float64)
            weight += WEIGHTS[site]
    return np.asarray(total / weight)


def _check_published(fed: LiveFederation, pushed: dict[str, dict[str, Shards]], groups: dict[str, Any]) -> None:
    for group, summary in groups.items():
        assert np.isfinite(summary.total_weight) and summary.total_weight <= sum(WEIGHTS.values())
        reader = next(s for s in fed.sites if fed.config.site(s).jurisdiction == "EU")
        if group.startswith("regional/") and group != "regional/EU":
            reader = next(s for s in fed.sites if f"regional/{fed.config.site(s).jurisdiction}" == group)
        with fed.client(summary.zone, reader) as c:
            means = c.fetch(1, group).means
        for sid, values in means.items():
            expected = _expected(fed, pushed, AggregateKey(summary.zone, group), sid)
            np.testing.assert_allclose(values, expected.astype(values.dtype), rtol=1e-6, atol=1e-7)


def test_weight_lies_and_huge_values_are_refused_and_the_honest_aggregate_is_published(
    federation: LiveFederation,
) -> None:
    spec = federation.spec(1, weights=tuple(WEIGHTS.items()))
    federation.open_round(spec)
    attacks = [  # (site, zone, weight, scale, code): at a non-reducing zone and at the reducing one
        (ATTACKER, "us-east", 1e9, 1.0, RefusalCode.WEIGHT),
        (ATTACKER, "us-east", 1e308, 1.0, RefusalCode.WEIGHT),
        (ATTACKER, "us-east", WEIGHTS[ATTACKER], 1e30, RefusalCode.BOUND),  # finite, far beyond max_value
        ("charite-berlin", "eu-central", 1e308, 1.0, RefusalCode.WEIGHT),
        ("charite-berlin", "eu-central", WEIGHTS["charite-berlin"], 1e35, RefusalCode.BOUND),
    ]
    for site, zone, weight, scale, code in attacks:
        with pytest.raises(PushRejectedError) as info:
            federation.push(site, zone, spec, weight=weight, scale=scale)
        assert info.value.code is code, info.value
        assert "\n" not in str(info.value)
    pushed = _push_everyone(federation, spec)  # the attacker's honest push is still accepted

    groups = federation.close_round(1)  # us-east forwards finite partial sums; eu-central reduces them

    assert ATTACKER in groups["global"].sites
    _check_published(federation, pushed, groups)
    refused = _refused(federation.audit("us-east"), RefusalCode.WEIGHT)
    assert len(refused) == 2 and all(r["site"] == ATTACKER for r in refused)
    assert len(_refused(federation.audit("us-east"), RefusalCode.BOUND)) == 1
    assert {r["code"] for r in _refused(federation.audit("eu-central"), RefusalCode.WEIGHT)} == {"weight"}
    assert len(_refused(federation.audit("eu-central"), RefusalCode.BOUND)) == 1


def test_a_scaled_update_is_clipped_to_the_norm_bound(tmp_path: Any) -> None:
    fed = live_federation(tmp_path, edit=lambda data: data.update(aggregation={"max_update_norm": 5.0}))
    fed.start()
    try:
        spec = fed.spec(1, weights=tuple(WEIGHTS.items()))
        fed.open_round(spec)
        scaled = fed.push(ATTACKER, "us-east", spec, seed=1, scale=1000.0)  # values ~1e3: within max_value
        norm = float(np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in scaled.values())))
        assert norm > 5.0
        (accepted,) = [r for r in fed.audit("us-east") if r["decision"] == "accepted" and r["site"] == ATTACKER]
        assert accepted["norm_scale"] == pytest.approx(5.0 / norm, rel=1e-6)
        fed.close_round(1)  # the clipped update is folded and forwarded like any other
    finally:
        fed.stop()
