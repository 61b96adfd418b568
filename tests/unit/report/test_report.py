"""`fedshard report` on run folders a real run can leave: a finished run, one that died
before its summary (the event log only), many sites, refusals and aborted rounds; and
the folders it refuses, in one line, writing nothing."""

from __future__ import annotations

import html
import json
from dataclasses import replace
from pathlib import Path

import pytest

from fedshard.coordinator.events import EventLog
from fedshard.coordinator.results import RoundResult, RunResult
from fedshard.errors import ConfigError, RefusalCode
from fedshard.protocol.messages import SiteInfo
from fedshard.report import build_report
from fedshard.report._flow import flows
from fedshard.report._run import RunRecord

SITES = 20  # beyond the dozen a plot draws one by one


def _site(i: int) -> SiteInfo:
    return SiteInfo(
        site_id=f"s{i:02d}",
        jurisdiction="EU" if i % 2 else "US",
        num_examples=10,
        plan_digest="p",
        plan_json="{}",
        genesis_version="g" * 64,
    )


def _round(rnd: int, sites: list[SiteInfo]) -> RoundResult:
    privacy = {
        s.site_id: {"epsilon_spent": 0.4 * rnd, "epsilon_budget": 1.0, "status": "exhausted" if rnd > 2 else "active"}
        for s in sites
    }
    refused = {"s03": "zone eu refused s03's push for round 2: shard w#r0c0: digest does not match"} if rnd == 2 else {}
    return RoundResult(
        round=rnd,
        version=f"{rnd:064x}",
        merkle_root="m",
        sites=tuple(s.site_id for s in sites if s.site_id not in refused),
        refused=refused,
        refusal_codes={"s03": RefusalCode.DIGEST} if refused else {},
        train_loss=1.0 / rnd,
        accuracy=0.5 + 0.1 * rnd,
        loss=1.0 / rnd,
        bytes_up=1000,
        privacy=privacy,
        aggregates=[{"zone": "eu", "group": "global", "merkle_root": "m", "shards": 3, "sites": ["s00"]}],
        timings={
            "round": 2.0,
            "coordinator": {"open": 0.1, "train": 1.2, "close": 0.2, "evaluate": 0.4},
            "zones": {"eu": {"close": 0.2, "fold": 0.05}},
            "sites": {s.site_id: {"train": 0.5, "push": 0.2, "fold": 0.01, "evaluate": 0.1} for s in sites},
        },
        traffic={
            "eu": {"bytes": 600, "shards": {"personal from EU": 10, "public from EU": 5}},
            "us": {"bytes": 400, "shards": {"personal from US": 10}},
        },
    )


def _logged_run(folder: Path) -> Path:
    """A run's event log as the coordinator writes it: 3 rounds, round 2 refused a site, round 4 aborted."""
    sites = [_site(i) for i in range(SITES)]
    log = EventLog(folder / "events.jsonl")
    log.on_start(sites, 4, "g" * 64)
    for rnd in (1, 2, 3):
        log.on_opened(rnd)
        log.on_round(_round(rnd, sites))
    log.on_aborted(4, "round 4: zone eu could not close the round: connection refused")
    (folder / "federation.yaml").write_text("zones:\n  - {name: eu, region: EU}\n  - {name: us, region: US}\n")
    return folder


def test_a_run_that_wrote_no_summary_is_reported_from_its_event_log(tmp_path: Path) -> None:
    run = _logged_run(tmp_path / "run")
    written = build_report(run)
    assert written.html == run / "report" / "report.html"
    assert {p.name for p in written.images} == {
        "accuracy.png",
        "privacy.png",
        "traffic.png",
        "round_times.png",
        "residency.png",
    }
    assert all(p.stat().st_size > 10_000 for p in written.images)
    page = written.html.read_text()
    assert "digest" in page and "does not match" in page and "s03" in page  # the refusal, with its code
    assert "round 4: zone eu could not close the round" in page  # the aborted round
    assert "no summary yet" in page  # and the page says what it lacks
    # regions from the config; without the zones' counters what left in partial sums is unknown, and said so
    assert "personal from EU: raw shards received in EU only; what left in partial sums is unknown" in page
    assert "Started 20" in page and "<td>start</td>" in page  # the run's date; every site took part from the start
    assert not (run / "summary.json").exists()  # the report writes only under its folder


def test_residency_lines_say_where_each_class_went() -> None:
    sites = [_site(0), _site(1)]
    record = RunRecord(
        Path("."),
        RunResult(sites, "g", "g"),
        summary={
            "zones": [
                {"name": "eu", "region": "EU", "shards_by_class": {"personal from EU": 4, "public from US": 2}},
                {"name": "us", "region": "US", "shards_by_class": {"public from US": 2, "personal from EU": 1}},
            ]
        },
    )
    lines = {name: (line, home) for name, line, home in flows(record).residency_lines()}
    assert lines["personal from EU"] == ("personal from EU: raw shards received in EU, US", False)  # not ticked
    assert lines["public from US"] == ("public from US: raw shards received in EU, US", False)


def test_residency_lines_name_partial_sums_that_left_a_region() -> None:
    """A zone that forwarded partial sums containing a class says so: "US only" would read as
    "never left the US" while its sums were reduced in the EU."""
    zones = [
        {"name": "eu", "region": "EU", "reducing": True, "shards_by_class": {"personal from EU": 4}},
        {
            "name": "us",
            "region": "US",
            "shards_by_class": {"personal from US": 2, "public from US": 2},
            "forwarded_shards": 2,
            "forwarded_by_class": {"public from US": 2},
        },
        {"name": "sg", "region": "SG", "shards_by_class": {"public from SG": 1}, "forwarded_shards": 1},
    ]
    record = RunRecord(Path("."), RunResult([_site(0)], "g", "g"), summary={"zones": zones})
    lines = {name: (line, home) for name, line, home in flows(record).residency_lines()}
    assert lines["personal from EU"] == ("personal from EU: raw shards received in EU only", True)
    assert lines["personal from US"] == ("personal from US: raw shards received in US only", True)  # kept home
    assert lines["public from US"] == (
        "public from US: raw shards received in US only; partial sums containing them reduced in EU",
        False,
    )
    assert lines["public from SG"][1] is False and "(which classes not recorded)" in lines["public from SG"][0]


def test_sites_with_the_same_epsilon_are_drawn_apart_and_zone_colours_hold_across_reports() -> None:
    from fedshard.report._plots import ZONE_PALETTE, _apart, _epsilon_by_site, class_colour, zone_colours

    sites = [_site(i) for i in range(4)]
    record = RunRecord(Path("."), RunResult(sites, "g", "g", rounds=[_round(r, sites) for r in (1, 2)]))
    offsets = _apart(_epsilon_by_site(record))
    assert len(set(offsets.values())) == 4  # four equal lines, four places
    alone = _apart({"a": _epsilon_by_site(record)["s00"]})
    assert alone == {"a": 0.0}
    one = zone_colours(["eu-central", "us-east", "sg-central"])
    other = zone_colours(["eu-central", "ap-south"])
    assert len(set(one.values())) == 3 and set(one.values()) <= set(ZONE_PALETTE)
    assert one["eu-central"] == other["eu-central"]  # the same zone, the same colour, in another report
    classes = {class_colour(f"{kind} from X", i) for kind in ("personal", "public") for i in range(3)}
    assert not classes & set(ZONE_PALETTE)  # zone colours never read as a class


def test_changes_and_late_joiners_are_shown(tmp_path: Path) -> None:
    run = _logged_run(tmp_path / "run")
    late = _site(99)
    EventLog(run / "events.jsonl").on_reconfigured(4, "zone ap-south added", [late])
    page = build_report(run).html.read_text()
    assert "Changes taken during the run" in page and "zone ap-south added" in page
    assert "<td>s99</td>" in page and "before round 4" in page


def test_a_folder_without_a_run_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"holds no run \(no events.jsonl\)") as caught:
        build_report(tmp_path)
    assert "\n" not in str(caught.value) and list(tmp_path.iterdir()) == []


def test_a_corrupt_summary_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    run = _logged_run(tmp_path / "run")
    (run / "summary.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"summary\.json: not JSON"):
        build_report(run)
    assert (run / "summary.json").read_text() == "{not json" and not (run / "report").exists()


def test_a_log_that_never_assembled_its_sites_is_refused(tmp_path: Path) -> None:
    EventLog(tmp_path / "events.jsonl").on_stop("2 site(s) refused: plan mismatch")
    with pytest.raises(ConfigError, match="nothing to report"):
        build_report(tmp_path)


def test_the_summary_adds_the_zones_own_counts_and_the_central_baseline(tmp_path: Path) -> None:
    run = _logged_run(tmp_path / "run")
    zones = [
        {
            "name": "eu",
            "region": "EU",
            "reducing": True,
            "pushes": 9,
            "bytes_received": 5000,
            "shards_by_class": {"personal from EU": 30},
            "forwarded_shards": 0,
            "refused": 1,
            "refusals": ["shard w#r0c0: digest does not match the manifest"],
        }
    ]
    (run / "summary.json").write_text(
        json.dumps(
            {"federation": "fed", "centralized_accuracy": 0.97, "engine": "inprocess", "elapsed_s": 3.5, "zones": zones}
        )
    )
    page = build_report(run, tmp_path / "elsewhere").html.read_text()
    assert "0.9700" in page and "eu (reducing)" in page and "digest does not match the manifest" in page
    assert "fedshard run <code>fed</code>" in page


BAD_MATH = r"$\pwned{x}_{$"  # not valid mathtext: matplotlib raises if it parses it


def test_names_in_mathtext_are_drawn_as_they_are(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    with pytest.raises(ValueError):  # what the report did before: a traceback, no page
        fig = Figure()
        fig.subplots().set_title(BAD_MATH)
        fig.savefig(tmp_path / "x.png")
    folder = tmp_path / "run"
    sites = [_site(0), _site(1)]
    log = EventLog(folder / "events.jsonl")
    log.on_start(sites, 2, "g" * 64)
    odd = replace(
        _round(1, sites),
        privacy={BAD_MATH: {"epsilon_spent": 0.1, "epsilon_budget": 1.0, "status": "active"}},
        traffic={"eu": {"bytes": 10, "shards": {f"{BAD_MATH} from EU": 3}}},
        timings={"round": 1.0, "sites": {BAD_MATH: {"train": 0.5}}},
        refused={BAD_MATH: BAD_MATH},
    )
    log.on_round(odd)
    (folder / "federation.yaml").write_text("zones:\n  - {name: eu, region: EU}\n")
    written = build_report(folder)
    assert len(written.images) == 5 and html.escape(BAD_MATH) in written.html.read_text()


def test_malformed_events_and_unknown_zones_are_left_out_with_one_line_each(tmp_path: Path) -> None:
    run = _logged_run(tmp_path / "run")
    sites = [_site(i) for i in range(SITES)]
    invented = replace(_round(4, sites), traffic={"mars-1": {"bytes": 10**18, "shards": {"personal from EU": 1}}})
    EventLog(run / "events.jsonl").on_round(invented)
    with (run / "events.jsonl").open("a") as fh:
        fh.write("garbage {\n")
        fh.write(json.dumps({"event": "round", "round": 5, "traffic": {"eu": {"bytes": "many"}}}) + "\n")
        fh.write(json.dumps({"event": "start", "sites": [{"site_id": 3}], "genesis_version": "g"}) + "\n")
        fh.write(json.dumps({"event": "round", **_event_fields(_round(6, sites)), "accuracy": "high"}) + "\n")
    zones = [{"name": "eu", "region": "EU", "pushes": "nine"}, {"name": "us", "region": "US"}]
    (run / "summary.json").write_text(json.dumps({"zones": zones}))
    written = build_report(run)
    notes = written.skipped
    assert any("line 10: not JSON" in n for n in notes)
    assert sum("a 'round' event" in n for n in notes) == 2 and any("a 'start' event" in n for n in notes)
    assert any("a zone entry that is not one" in n for n in notes)
    assert any("round 4: traffic for 1 zone(s) not in the run's config ('mars-1')" in n for n in notes)
    assert all("\n" not in n for n in notes)
    page = written.html.read_text()
    assert "Left out of this report as malformed" in page and "mars-1" not in page.split("Left out")[0]


def _event_fields(result: RoundResult) -> dict[str, object]:
    from dataclasses import asdict

    return asdict(result)


def test_runs_are_listed_with_their_date_progress_and_end(tmp_path: Path) -> None:
    from fedshard.report.listing import list_runs

    _logged_run(tmp_path / "a-unfinished")
    finished = _logged_run(tmp_path / "b-finished")
    (finished / "summary.json").write_text(json.dumps({"federation": "fed", "stopped_reason": ""}))
    broken = tmp_path / "c-broken"
    EventLog(broken / "events.jsonl").on_stop("2 site(s) refused: plan mismatch")  # never assembled
    (tmp_path / "not-a-run").mkdir()
    listed = {r.folder.name: r for r in list_runs(tmp_path)}
    assert set(listed) == {"a-unfinished", "b-finished", "c-broken"}  # a broken run is listed, not skipped
    assert listed["b-finished"].status == "finished" and listed["b-finished"].rounds == 3
    assert listed["b-finished"].federation == "fed" and listed["b-finished"].started.endswith("UTC")
    assert listed["a-unfinished"].status == "no summary (running, or it died)"
    assert listed["c-broken"].status.startswith("unreadable: ") and "never assembled" in listed["c-broken"].status


def test_a_tune_folder_is_listed_as_one_line_with_the_candidate_it_chose(tmp_path: Path) -> None:
    from fedshard.report.listing import list_runs

    tune = tmp_path / "tune-a"
    for name in ("lr-1", "lr-2"):
        run = _logged_run(tune / "candidates" / name)
        (run / "summary.json").write_text(json.dumps({"federation": "fed", "stopped_reason": ""}))
    (listed,) = list_runs(tmp_path)
    assert listed.folder == tune and listed.rounds == 6 and listed.accuracy is None
    assert listed.status == "tuning: 2 candidate run(s), no tune.json (running, or it died)"
    (tune / "tune.json").write_text(json.dumps({"federation": "fed", "chosen": "lr-2"}))
    (listed,) = list_runs(tmp_path)
    assert listed.status == "tuned: chose lr-2" and listed.federation == "fed" and listed.started.endswith("UTC")
