"""Phase timings: what a site may report (bounded), how a stopwatch splits nested phases,
and what the coordinator makes of the replies of a round."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from fedshard.coordinator._timings import RoundClock
from fedshard.protocol import timings as timings_module
from fedshard.protocol.messages import EvaluateReport, TrainReport, ZonePush
from fedshard.protocol.timings import MAX_PHASE_S, Phase, PhaseTimes, Stopwatch


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, MAX_PHASE_S * 2])
def test_a_reported_phase_is_finite_non_negative_and_bounded(bad: float) -> None:
    with pytest.raises(ValidationError):
        PhaseTimes(train_s=bad)
    with pytest.raises(ValidationError):
        ZonePush(zone="z", merkle_root="r", shards=1, nbytes=1, fold_s=bad)


def test_a_push_may_count_a_bounded_number_of_classes() -> None:
    ZonePush(zone="z", merkle_root="r", shards=2, nbytes=1, classes={"personal": 1, "public": 1})
    with pytest.raises(ValidationError):
        ZonePush(zone="z", merkle_root="r", shards=1, nbytes=1, classes={f"c{i}": 1 for i in range(65)})
    with pytest.raises(ValidationError):
        ZonePush(zone="z", merkle_root="r", shards=1, nbytes=1, classes={"x" * 65: 1})
    with pytest.raises(ValidationError):
        ZonePush(zone="z", merkle_root="r", shards=1, nbytes=1, classes={"personal": -1})


def test_nested_phases_count_once_in_the_innermost(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 3.0, 10.0, 10.0, 12.0])  # apply 0..10 holding fetch 1..3; train 10..12
    monkeypatch.setattr(timings_module.time, "perf_counter", lambda: next(clock))
    watch = Stopwatch()
    with watch.phase(Phase.APPLY):
        watch.timed(Phase.FETCH, lambda: None)()
    with watch.phase(Phase.TRAIN):
        pass
    assert watch.seconds == {Phase.FETCH: 2.0, Phase.APPLY: 8.0, Phase.TRAIN: 2.0}
    assert watch.times() == PhaseTimes(fetch_s=2.0, apply_s=8.0, train_s=2.0)
    assert watch.times().as_dict() == {"fetch": 2.0, "apply": 8.0, "train": 2.0}


def _push(zone: str, fold_s: float, classes: dict[str, int], nbytes: int = 100) -> ZonePush:
    return ZonePush(
        zone=zone, merkle_root="r", shards=sum(classes.values()), nbytes=nbytes, fold_s=fold_s, classes=classes
    )


def test_the_round_clock_adds_up_what_sites_and_zones_reported() -> None:
    clock = RoundClock()
    with clock.waiting(Phase.TRAIN):
        pass
    with clock.closing("eu"):
        pass
    a = TrainReport(
        site_id="a",
        round=1,
        ok=True,
        pushes=[_push("eu", 0.5, {"personal": 3}), _push("global", 0.25, {"public": 2}, nbytes=50)],
        timings=PhaseTimes(train_s=2.0, push_s=1.0, fetch_s=0.5),
    )
    b = TrainReport(site_id="b", round=1, ok=False, reason="refused", timings=PhaseTimes(train_s=1.0))
    clock.trained("a", a, "EU")
    clock.trained("b", b, "US")
    clock.evaluated(
        "a",
        EvaluateReport(
            site_id="a", round=1, version="v", num_examples=1, loss=0.0, accuracy=1.0, timings=PhaseTimes(fetch_s=0.25)
        ),
    )
    timings = clock.timings()
    assert timings["sites"]["a"] == {"fetch": 0.75, "fold": 0.5, "push": 1.0, "train": 2.0}
    assert timings["sites"]["b"] == {"train": 1.0}  # a refused site's time still shows
    assert timings["zones"]["eu"]["fold"] == 0.5 and timings["zones"]["global"] == {"close": 0.0, "fold": 0.25}
    assert set(timings["coordinator"]) == {"train"} and timings["round"] >= 0
    assert clock.traffic() == {
        "eu": {"bytes": 100, "shards": {"personal from EU": 3}},
        "global": {"bytes": 50, "shards": {"public from EU": 2}},
    }
