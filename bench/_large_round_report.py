"""The large-round benchmark's report: its table rows, notes and interpretation (see ``large_round.py``)."""

from __future__ import annotations

import argparse
from typing import Any

import _common as c

__all__ = ["SECTION", "report"]

SECTION = "large_round"


# report ------------------------------------------------------------------------------------------
def _gb_s(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f}" if seconds >= 1e-3 and nbytes else "–"  # not for a call that did nothing


_BYTE_PHASES = {
    "train msg: push": ("pushed", "pushed"),
    "zone push (receive, validate, fold)": ("pushed", "pushed"),
    "evaluate msg: fetch": ("fetched", "fetched"),
    "train msg: digest": ("model", "pushed"),
    "train msg: split": ("model", "model"),
    "evaluate msg: verify": ("model", "fetched"),
    "evaluate msg: apply": ("model", "model"),
    "evaluate msg: save": ("model", "model"),
    "evaluate msg: load": ("model", "model"),
    "train msg: load": ("model", "model"),
    "train msg: update": ("model", "model"),
    "train msg: encrypt": ("model", "model"),
    "evaluate msg: decrypt": ("model", "model"),
}


_MB = 1e6


def _rows(plain: dict[str, Any], ckks: dict[str, Any]) -> list[list[str]]:
    """The table: one row per phase, then the round, the data plane and the copy floor."""

    def nbytes(run: dict[str, Any], what: str) -> float:
        return run["sites"] * run["model_bytes"] if what == "model" else run[what]

    rows = []
    for phase in plain["phases"]:
        p, k = plain["phases"][phase], ckks["phases"].get(phase, 0.0)
        which = _BYTE_PHASES.get(phase)
        rows.append(
            [
                phase,
                c.fmt(p, 3),
                _gb_s(nbytes(plain, which[0]), p) if which else "–",
                c.fmt(k, 3),
                _gb_s(nbytes(ckks, which[1]), k) if which else "–",
            ]
        )
    rows.append(["round (wall)", c.fmt(plain["round_s"], 3), "–", c.fmt(ckks["round_s"], 3), "–"])
    rows.append(
        [
            "data plane (round − training)",
            c.fmt(plain["data_plane_s"], 3),
            _gb_s(plain["moved"], plain["data_plane_s"]),
            c.fmt(ckks["data_plane_s"], 3),
            _gb_s(ckks["moved"], ckks["data_plane_s"]),
        ]
    )
    rows.append(
        [
            "copy floor (np.copyto of the bytes moved)",
            c.fmt(plain["copy_floor_s"], 3),
            f"{plain['copy_gb_s']:.2f}",
            c.fmt(ckks["copy_floor_s"], 3),
            f"{ckks['copy_gb_s']:.2f}",
        ]
    )
    return rows


def _notes(plain: dict[str, Any], ckks: dict[str, Any], plan_bytes: tuple[int, int], quick: bool) -> list[str]:
    """The section's notes: models, set-up, rounds, bytes, memory, CKKS bytes."""
    mb = _MB
    model_mb = plain["model_bytes"] / mb
    ckks_measured = ckks["pushed"] / (ckks["sites"] * 4 * ckks["values"])
    tile = plain["tile"]
    ckks_plan = plan_bytes[0] / (4 * plan_bytes[1])
    plain_model = f"{plain['values'] / 1e6:.1f} M-parameter transformer ({model_mb:.1f} MB)"
    ckks_model = f"{ckks['values'] / 1e6:.1f} M-parameter transformer ({ckks['model_bytes'] / mb:.1f} MB)"
    notes = [
        f"- Plaintext: the {plain_model}; every shard CKKS-encrypted: the {ckks_model}"
        + (
            " (--quick: small models, a smoke test of the path)."
            if quick
            else " (a subset of the 118 M one: one block, "
            "vocab 4,096, so that 4 sites' encryption and decryption fit a run on 2 cores)."
        ),
        "- 4 site processes (2 EU, 2 US), 2 zone processes (eu-central reducing, us-east), gRPC on loopback, plain "
        "text; the real Coordinator, Site (sealed store, signed manifests) and zones (residency policy, signatures "
        "checked); training replaced by a synthetic in-place update. Sites are sent their messages one at a time. "
        f"Shard tile {tile[0]}x{tile[1]} ({tile[0] * tile[1] * 4 / 2**20:g} MiB shards; `--tile`).",
        f"- Times are medians over rounds 2…{plain['rounds']} (plaintext) and 2…{ckks['rounds']} (CKKS); round 1 "
        f"(model build, genesis save, CKKS pool start) took {plain['first_round_s']:.2f} s / "
        f"{ckks['first_round_s']:.2f} s. Phase seconds are summed over the 4 sites (zone phases over both zones); "
        "a phase is a wrapped library call, so `push` includes the zone's work on the frames.",
        f"- Bytes moved per round: pushed {plain['pushed'] / mb:,.1f} MB + fetched {plain['fetched'] / mb:,.1f} MB "
        f"(plaintext); CKKS {ckks['pushed'] / mb:,.1f} MB + {ckks['fetched'] / mb:,.1f} MB. The copy floor is "
        f"`np.copyto` of that many bytes at {plain['copy_gb_s']:.2f} GB/s, measured in the same run; zone-to-zone "
        "forwarding of partial sums is not counted in it.",
        f"- Data plane: {plain['data_plane_s']:.2f} s = {plain['data_plane_s'] / plain['copy_floor_s']:.0f}× the "
        f"copy floor ({plain['copy_floor_s']:.3f} s).",
        f"- Peak RSS (VmHWM): zone {plain['zone_peak_rss'] / mb:,.0f} MB (its RSS at start "
        f"{plain['zone_base_rss'] / mb:,.0f} MB; staging budget {plain['staging_bytes'] / mb:,.0f} MB) = "
        f"{plain['zone_peak_rss'] / plain['model_bytes']:.2f}× the model; site during a message "
        f"{plain['site_peak_rss'] / mb:,.0f} MB = {plain['site_peak_rss'] / plain['model_bytes']:.2f}× the model "
        "(the median over rounds of the round's largest message peak; both include the processes' Python, gRPC and "
        f"torch); the site's RSS once assembled, before any message, {plain['site_base_rss'] / mb:,.0f} MB, so a "
        f"message adds {_site_added(plain):.2f}× the model.",
        f"- CKKS bytes per float32 byte: {ckks_measured:.2f}× pushed in the measured round; "
        f"{ckks_plan:.2f}× for the {plan_bytes[1] / 1e6:.1f} M values of the "
        f"{'quick' if quick else '118 M'} model's plan (packed as sites pack it, bytes exact).",
    ]
    if plain["missing"] or ckks["missing"]:
        notes.append(f"- Not timed (the library no longer has them): {', '.join(plain['missing'] + ckks['missing'])}.")
    notes.append(
        "- Zone memory with 20 sites is not run here (20 site processes of the 118 M model do not fit this machine): "
        "`bench/zone_memory.py` pushes 20 synthetic updates into one zone."
    )
    return notes


def _site_added(plain: dict[str, Any]) -> float:
    """What a site's largest message adds to its RSS before any message, in models."""
    return float((plain["site_peak_rss"] - plain["site_base_rss"]) / plain["model_bytes"])


def _interpretation(plain: dict[str, Any], ckks_plan: float) -> str:
    """The goals in words, and where the data plane's time goes."""
    mb = _MB
    floor_ratio = plain["data_plane_s"] / plain["copy_floor_s"]
    site_phases = {
        k: v for k, v in plain["phases"].items() if "msg: " in k and not k.endswith(("whole message", ": train"))
    }
    largest = sorted(site_phases.items(), key=lambda kv: -kv[1])[:3]
    where = ", ".join(f"{k.split(': ')[1]} ({k.split(' msg')[0]} message) {v:.2f} s" for k, v in largest)
    interpretation = (
        f"Goals: data plane ≤ 3× the copy floor: {floor_ratio:.0f}× ({'met' if floor_ratio <= 3 else 'not met'}); "
        f"the largest site phases are {where}. "
        f"Zone peak RSS ≤ 1.5 × model + staging budget: {plain['zone_peak_rss'] / mb:,.0f} MB "
        f"({(plain['zone_peak_rss'] - plain['zone_base_rss']) / mb:,.0f} MB over its RSS at start) against "
        f"{(1.5 * plain['model_bytes'] + plain['staging_bytes']) / mb:,.0f} MB; site peak RSS during a message "
        f"≤ 2.5 × model: {plain['site_peak_rss'] / plain['model_bytes']:.2f}× ({_site_added(plain):.2f}× over the "
        "site's RSS before its first message); CKKS bytes ≤ 3× float32: "
        f"{ckks_plan:.2f}×."
    )
    return interpretation


def report(
    plain: dict[str, Any], ckks: dict[str, Any], plan_bytes: tuple[int, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Print the table, write the section, print the headline JSON."""
    ckks_plan = plan_bytes[0] / (4 * plan_bytes[1])
    headers = ["phase (4 sites, summed)", "plaintext s", "plaintext GB/s", "CKKS s", "CKKS GB/s"]
    rows = _rows(plain, ckks)
    headline = {
        "data_plane_s": plain["data_plane_s"],
        "copy_floor_s": plain["copy_floor_s"],
        "zone_peak_rss_mb": plain["zone_peak_rss"] / _MB,
        "site_peak_rss_mb": plain["site_peak_rss"] / _MB,
        "site_base_rss_mb": plain["site_base_rss"] / _MB,
        "model_mb": plain["model_bytes"] / _MB,
        "ckks_bytes_per_f32": ckks_plan,
    }
    c.print_table("a large full-parameter round, 4 sites, 2 zones", headers, rows)
    notes = _notes(plain, ckks, plan_bytes, args.quick)
    runs = f"{plain['rounds']} plaintext rounds, {ckks['rounds']} CKKS rounds (medians of rounds ≥ 2)"
    c.publish(args, SECTION, "A large full-parameter round", runs, None, notes, headers, rows,
              _interpretation(plain, ckks_plan), headline=headline)  # fmt: skip
    return headline
