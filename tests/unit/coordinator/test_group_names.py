"""Resumed residency groups take the names the run recorded, whoever has reconnected yet."""

from __future__ import annotations

from fedshard.coordinator._groups import recorded_names


def test_a_group_formed_before_all_its_sites_reconnected_takes_its_recorded_name() -> None:
    # the US site had not reconnected when the resumed run formed its groups: SG alone, recorded SG+US
    assert recorded_names(["EU", "SG"], {"EU", "SG+US"}) == {"SG": "SG+US"}


def test_names_the_run_recorded_stay_and_an_unknown_or_ambiguous_group_keeps_its_own() -> None:
    assert recorded_names(["EU", "SG+US"], {"EU", "SG+US"}) == {}
    assert recorded_names(["UK"], {"EU", "SG+US"}) == {}  # no recorded group holds UK: the chain check refuses
    assert recorded_names(["SG"], {"SG+US", "SG+UK"}) == {}  # two could be meant
