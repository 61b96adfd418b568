"""Unit tests of :mod:`fedshard.privacy.events`: validation, the stored form and its stability."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshard.errors import PrivacyError
from fedshard.privacy.events import MECHANISM, DPEvent, Guarantee


def test_values_are_coerced_so_equal_events_compare_equal() -> None:
    loose = DPEvent("record", 1, 1, 3)  # type: ignore[arg-type]
    strict = DPEvent(Guarantee.RECORD, 1.0, 1.0, 3)

    assert loose == strict
    assert hash(loose) == hash(strict)
    assert loose.guarantee is Guarantee.RECORD
    assert type(loose.noise_multiplier) is float
    assert type(loose.sample_rate) is float


def test_event_is_immutable() -> None:
    event = DPEvent(Guarantee.UPDATE, 1.0, 1.0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.steps = 2  # type: ignore[misc]


def test_stored_form_is_frozen() -> None:
    # The stability contract: this exact form is what ledgers hold; changing it breaks them.
    event = DPEvent(Guarantee.RECORD, 1.1, 0.01, 250)
    assert event.to_dict() == {
        "mechanism": "poisson_subsampled_gaussian",
        "guarantee": "record",
        "noise_multiplier": 1.1,
        "sample_rate": 0.01,
        "steps": 250,
    }
    assert MECHANISM == "poisson_subsampled_gaussian"
    assert [g.value for g in Guarantee] == ["record", "update"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("noise_multiplier", 0.0),
        ("noise_multiplier", -1.0),
        ("noise_multiplier", math.inf),
        ("noise_multiplier", math.nan),
        ("noise_multiplier", "1.0"),
        ("noise_multiplier", True),
        ("sample_rate", 0.0),
        ("sample_rate", 1.0000001),
        ("sample_rate", -0.1),
        ("sample_rate", math.nan),
        ("steps", 0),
        ("steps", -3),
        ("steps", 2.0),
        ("steps", True),
        ("guarantee", "patient"),
    ],
)
def test_invalid_values_are_refused_with_one_line_naming_them(field: str, value: object) -> None:
    fields: dict[str, object] = {"guarantee": "record", "noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 5}
    fields[field] = value

    with pytest.raises(PrivacyError) as info:
        DPEvent(**fields)  # type: ignore[arg-type]

    message = str(info.value)
    assert "\n" not in message
    assert repr(value) in message


def test_boundaries_are_accepted() -> None:
    low = DPEvent(Guarantee.UPDATE, 1e-6, 1.0, 1)
    high = DPEvent(Guarantee.RECORD, 1e6, 1e-9, 10**9)

    assert (low.noise_multiplier, low.sample_rate, low.steps) == (1e-6, 1.0, 1)
    assert (high.noise_multiplier, high.sample_rate, high.steps) == (1e6, 1e-9, 10**9)
    assert DPEvent.from_dict(low.to_dict()) == low and DPEvent.from_dict(high.to_dict()) == high


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"mechanism": "laplace"}, "laplace"),
        ({"mechanism": None}, "None"),
        ({"guarantee": "zone"}, "zone"),
        ({"clip_norm": 1.0}, "clip_norm"),
        ({"steps": 2.5}, "2.5"),
    ],
)
def test_from_dict_refuses_what_it_does_not_know(change: dict[str, object], needle: str) -> None:
    data = DPEvent(Guarantee.RECORD, 1.0, 0.1, 2).to_dict()
    data.update(change)
    with pytest.raises(PrivacyError, match=needle):
        DPEvent.from_dict(data)


def test_from_dict_refuses_a_missing_key() -> None:
    data = DPEvent(Guarantee.RECORD, 1.0, 0.1, 2).to_dict()
    del data["steps"]
    with pytest.raises(PrivacyError, match="steps"):
        DPEvent.from_dict(data)
    with pytest.raises(PrivacyError):
        DPEvent.from_dict([("mechanism", MECHANISM)])  # type: ignore[arg-type]


events = st.builds(
    DPEvent,
    guarantee=st.sampled_from(Guarantee),
    noise_multiplier=st.floats(min_value=1e-3, max_value=1e3),
    sample_rate=st.floats(min_value=1e-6, max_value=1.0),
    steps=st.integers(min_value=1, max_value=10**7),
)


@settings(max_examples=100)
@given(events)
def test_to_dict_from_dict_round_trips(event: DPEvent) -> None:
    assert DPEvent.from_dict(event.to_dict()) == event
