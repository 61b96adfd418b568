"""The terminal output of a run in an 80-column terminal: one line per round, details
folded under it (indented, never split mid-item), tables that fit."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from fedshard.cli._progress import SHOWN_SITES, RoundProgress, packed_lines, results_table, round_line, zones_table
from fedshard.coordinator.results import RoundResult
from fedshard.errors import RefusalCode
from fedshard.protocol.messages import SiteInfo

WIDTH = 80
SITES = [f"hospital-{name}" for name in ("charite-berlin", "ap-hp-paris", "mayo-rochester", "sgh-singapore")] * 3


def _sites() -> list[SiteInfo]:
    return [
        SiteInfo(
            site_id=f"{name}-{i}",
            jurisdiction="EU",
            num_examples=114,
            plan_digest="p",
            plan_json="{}",
            genesis_version="g",
        )
        for i, name in enumerate(SITES)
    ]


def _result(sites: list[SiteInfo]) -> RoundResult:
    refused = {sites[0].site_id: "zone eu-central refused the push for round 7: shard fc1.weight#r0c0: " + "x" * 90}
    privacy = {
        s.site_id: {"epsilon_spent": 2.345, "epsilon_budget": 3.0, "status": "exhausted" if i == 3 else "active"}
        for i, s in enumerate(sites)
    }
    return RoundResult(
        round=107,
        version="a" * 64,
        merkle_root="r",
        sites=tuple(s.site_id for s in sites[1:]),
        refused=refused,
        refusal_codes={sites[0].site_id: RefusalCode.DIGEST},
        train_loss=0.12345,
        accuracy=0.95612,
        loss=0.13201,
        bytes_up=123_456_789,
        privacy=privacy,
    )


def test_a_round_with_a_dozen_sites_and_a_refusal_fits_80_columns() -> None:
    console = Console(record=True, width=WIDTH, color_system=None)
    sites = _sites()
    assert len(sites) == SHOWN_SITES
    with RoundProgress(console) as progress:
        progress.on_start(sites, 200, "g" * 64)
        progress.on_round(_result(sites))
    lines = console.export_text().splitlines()
    assert all(len(line.rstrip()) <= WIDTH for line in lines), "\n".join(lines)
    (line,) = [ln for ln in lines if ln.startswith("round ")]
    assert "acc 0.9561" in line and "11/12 sites" in line and "123.5 MB" in line
    epsilon = [ln for ln in lines if "/3" in ln]
    assert sum(ln.count("/3") for ln in epsilon) == SHOWN_SITES  # every site's ε, none split over two lines
    assert all(ln.startswith(" " * 10) for ln in epsilon)
    assert any("exhausted" in ln for ln in epsilon)
    reason = [ln for ln in lines if "x" * 20 in ln or "refused the push" in ln]
    assert reason and all(ln.startswith(" " * 10) for ln in reason)  # the refusal wraps under its round


def test_a_round_line_drops_the_version_rather_than_wrap() -> None:
    result = _result(_sites())
    assert round_line(result, 200).endswith("  aaaaaaaa")
    narrow = Text.from_markup(round_line(result, 75))
    assert narrow.cell_len <= 75 and "aaaaaaaa" not in narrow.plain


def test_packed_lines_never_split_an_item() -> None:
    items = [f"item-{i} 0.25/3" for i in range(20)]
    lines = packed_lines(items, 40, indent=4)
    assert all(len(ln) <= 40 for ln in lines)
    assert " ".join(lines).split() == " ".join(items).split()


def test_the_summary_tables_fit_80_columns() -> None:
    zones = [
        {
            "name": name,
            "region": region,
            "reducing": name == "eu-central",
            "pushes": 400,
            "bytes_received": 660_800_000,
            "shards_by_class": {f"personal from {region}": 2000, f"public from {region}": 1600},
            "forwarded_shards": 1800 if name != "eu-central" else 0,
            "refused": 12,
        }
        for name, region in (("eu-central", "EU"), ("us-east", "US"), ("sg-central", "SG"))
    ]
    console = Console(record=True, width=WIDTH, color_system=None)
    console.print(zones_table({"zones": zones}))
    console.print(results_table({"final_accuracy": 0.9561, "centralized_accuracy": 0.9737}))
    lines = console.export_text().splitlines()
    assert all(len(line.rstrip()) <= WIDTH for line in lines), "\n".join(lines)
    rows = [ln.split() for ln in lines if ln.strip().startswith(("eu-central", "us-east", "sg-central"))]
    assert [r[:3] for r in rows] == [
        ["eu-central*", "EU", "400"],
        ["us-east", "US", "400"],
        ["sg-central", "SG", "400"],
    ]
    assert all("personal" in r for r in rows)  # each class on a line of its own, under its zone
