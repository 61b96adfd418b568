"""What the coordinator takes from a site: weights it fixes itself (at most 4x the median
site), and train replies checked against what it knows (property-based)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshard.config import FederationConfig
from fedshard.coordinator._replies import MAX_EXAMPLES, MAX_TEXT, ReplyBounds, check_train, one_line, weighted_mean
from fedshard.coordinator._selection import fixed_weights
from fedshard.errors import RefusalCode
from fedshard.protocol.messages import PrivacyReport, SiteInfo, TrainReport, ZonePush
from fedshard.protocol.timings import MAX_PHASE_S, PhaseTimes
from fedshard.sharding import ShardPlan


def _config(aggregation: dict[str, Any] | None = None, sites: int = 4) -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "replies", "rounds": 1, "min_sites": 1},
            "task": {"target": "tests.toy_task:task"},
            "aggregation": aggregation or {},
            "zones": [{"name": "eu", "region": "EU"}, {"name": "us", "region": "US"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(sites)],
        }
    )


def _info(site: str, examples: int) -> SiteInfo:
    return SiteInfo(
        site_id=site, jurisdiction="EU", num_examples=examples, plan_digest="p", plan_json="{}", genesis_version="g"
    )


def test_no_site_weighs_more_than_four_times_the_median_site() -> None:
    nodes = {f"n{i}": _info(f"s{i}", n) for i, n in enumerate([114, 114, 113, 10**12])}
    assert fixed_weights(_config(), nodes) == {"n0": 114.0, "n1": 114.0, "n2": 113.0, "n3": 456.0}
    two = {"n0": _info("s0", 100), "n1": _info("s1", 10**9)}  # the lower median: the honest one
    assert fixed_weights(_config(sites=2), two) == {"n0": 100.0, "n1": 400.0}
    assert fixed_weights(_config({"max_weight_over_median": None}), nodes)["n3"] == 1e6  # max_site_weight
    assert fixed_weights(_config({"max_site_weight": 200}), nodes)["n3"] == 200.0
    assert fixed_weights(_config(), {"n0": _info("s0", 0), "n1": _info("s1", -7)}) == {"n0": 1.0, "n1": 1.0}


PLAN = ShardPlan.from_state_dict({"w": np.zeros((4, 4), "float32")}, (2, 2))
BOUNDS = ReplyBounds.of(_config(), PLAN)


def _report(**update: Any) -> TrainReport:
    honest = TrainReport(
        site_id="s1",
        round=3,
        ok=True,
        num_examples=30,
        loss=0.4,
        applied_round=2,
        pushes=[ZonePush(zone="eu", merkle_root="m", shards=4, nbytes=64, classes={"personal": 4})],
    )
    return honest.model_copy(update=update)


def test_an_honest_reply_is_taken_and_each_lie_is_left_out_with_its_code() -> None:
    assert check_train(_report(), "s1", 3, BOUNDS) is None
    lies = {
        RefusalCode.IDENTITY: {"site_id": "s2"},
        RefusalCode.MALFORMED: {"round": 2},
        RefusalCode.ZONE: {"pushes": [ZonePush(zone="$x$", merkle_root="m", shards=1, nbytes=1)]},
        RefusalCode.DUPLICATE: {"pushes": [ZonePush(zone="eu", merkle_root="m", shards=1, nbytes=1)] * 2},
        RefusalCode.CLASS: {"pushes": [ZonePush(zone="eu", merkle_root="m", shards=1, nbytes=1, classes={"x": 1})]},
    }
    for code, update in lies.items():
        why = check_train(_report(**update), "s1", 3, BOUNDS)
        assert why is not None and why.code is code, (code, why)
    for update in (
        {"num_examples": MAX_EXAMPLES + 1},
        {"loss": -0.1},
        {"applied_round": 3},
        {"pushes": [ZonePush(zone="eu", merkle_root="m", shards=5, nbytes=1)]},  # the plan has 4
        {"pushes": [ZonePush(zone="eu", merkle_root="m", shards=4, nbytes=BOUNDS.push_bytes(4) + 1)]},
        {"privacy": PrivacyReport.model_construct(epsilon_budget=1.0, delta=1e-5, epsilon_spent=math.inf)},
    ):
        why = check_train(_report(**update), "s1", 3, BOUNDS)
        assert why is not None and why.code is RefusalCode.BOUND, update


_NUMBERS = st.one_of(st.floats(), st.sampled_from([0.0, -1.0, 1e300, math.inf, math.nan]))
_INTS = st.one_of(st.integers(), st.sampled_from([0, -1, 10**15, 2**63]))
_PUSHES = st.lists(
    st.builds(
        ZonePush.model_construct,
        zone=st.sampled_from(["eu", "us", "$\\alpha$", "x" * 1000]),
        merkle_root=st.just("m"),
        shards=_INTS,
        nbytes=_INTS,
        fold_s=_NUMBERS,
        classes=st.dictionaries(st.sampled_from(["personal", "public", "$x$", ""]), _INTS, max_size=3),
    ),
    max_size=3,
)
_TIMES = st.builds(PhaseTimes.model_construct, train_s=_NUMBERS, push_s=_NUMBERS)


@settings(max_examples=300, deadline=None)
@given(
    site=st.sampled_from(["s1", "s2", ""]),
    rnd=_INTS,
    examples=_INTS,
    loss=_NUMBERS,
    applied=st.one_of(st.none(), _INTS),
    pushes=_PUSHES,
    timings=_TIMES,
)
def test_a_reply_the_coordinator_takes_is_within_every_bound(
    site: str, rnd: int, examples: int, loss: float, applied: int | None, pushes: list[Any], timings: Any
) -> None:
    reply = _report().model_copy(
        update={
            "site_id": site,
            "round": rnd,
            "num_examples": examples,
            "loss": loss,
            "applied_round": applied,
            "pushes": pushes,
            "timings": timings,
        }
    )
    why = check_train(reply, "s1", 3, BOUNDS)
    if why is not None:
        assert "\n" not in why.line() and len(why.line()) < 400
        return
    assert reply.site_id == "s1" and reply.round == 3 and 0 <= reply.num_examples <= MAX_EXAMPLES
    assert math.isfinite(reply.loss) and reply.loss >= 0 and (applied is None or 0 <= applied <= 2)
    assert len({p.zone for p in pushes}) == len(pushes) and all(p.zone in ("eu", "us") for p in pushes)
    for p in pushes:
        assert 0 <= p.shards <= 4 and 0 <= p.nbytes <= BOUNDS.push_bytes(4) and 0 <= p.fold_s <= MAX_PHASE_S
        assert set(p.classes) <= {"personal", "public"} and sum(p.classes.values()) <= p.shards
    assert all(0 <= v <= MAX_PHASE_S for v in reply.timings.model_dump().values())


def test_site_text_is_kept_as_one_short_printable_line() -> None:
    line = one_line("a\nb\x1b[31m" + "x" * 10_000)
    assert "\n" not in line and "\x1b" not in line and len(line) == MAX_TEXT and line.endswith("…")


def test_means_are_weighted_by_the_fixed_weights_and_ignore_what_is_not_a_number() -> None:
    weights = {"a": 1.0, "b": 3.0, "c": 100.0}
    assert weighted_mean({"a": 1.0, "b": 0.0}, weights) == 0.25
    assert weighted_mean({"a": 1.0, "c": math.nan}, weights) == 1.0
    assert math.isnan(weighted_mean({}, weights))
