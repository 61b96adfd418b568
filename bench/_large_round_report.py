"""The large-round benchmark's report: its table rows, notes and interpretation (see ``large_round.py``)."""

from __future__ import annotations

import argparse
from typing import Any

import _common as c

__all__ = ["GOAL", "SECTION", "ratio", "report"]

SECTION = "large_round"


# report ------------------------------------------------------------------------------------------
def _gb_s(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f}" if seconds >= 1e-3 and nbytes else "–"  # not for a call that did nothing


_BYTE_PHASES = {
    "site: push": ("pushed", "pushed"),
    "zone: push (receive, validate, fold)": ("pushed", "pushed"),
    "site: fetch": ("fetched", "fetched"),
    "site: digest": ("model", "pushed"),
    "site: split": ("model", "model"),
    "site: verify": ("model", "fetched"),
    "site: apply": ("model", "model"),
    "site: save": ("model", "model"),
    "site: load": ("model", "model"),
    "site: update": ("model", "model"),
    "site: encrypt": ("model", "model"),
    "site: decrypt": ("model", "model"),
}
"""Which bytes a phase's GB/s is taken over: (plaintext, encrypted), each ``model`` (every site's
model), ``pushed`` or ``fetched``."""

GOAL = 1.2
"""Issue 39: a federation round's data plane ≤ 1.2× its components' sum."""

_MB = 1e6


def _rows(plain: dict[str, Any], he: dict[str, Any]) -> list[list[str]]:
    """The table: one row per phase, then the components' sum, the round, the data plane and the copy floor."""

    def nbytes(run: dict[str, Any], what: str) -> float:
        return run["sites"] * run["model_bytes"] if what == "model" else run[what]

    alone, together, he_alone = plain["one_at_a_time"], plain["at_once"], he["one_at_a_time"]
    rows = []
    for phase in alone["phases"]:
        p, t, k = alone["phases"][phase], together["phases"].get(phase, 0.0), he_alone["phases"].get(phase, 0.0)
        which = _BYTE_PHASES.get(phase)
        rows.append(
            [
                phase,
                c.fmt(p, 3),
                _gb_s(nbytes(plain, which[0]), p) if which else "–",
                c.fmt(t, 3),
                c.fmt(k, 3),
                _gb_s(nbytes(he, which[1]), k) if which else "–",
            ]
        )

    def line(label: str, key: str, gb: bool = False) -> list[str]:
        cells = [label]
        for run, part, show_gb in (
            (plain, "one_at_a_time", True),
            (plain, "at_once", False),
            (he, "one_at_a_time", True),
        ):
            cells.append(c.fmt(run[part][key], 3))
            if show_gb:
                cells.append(_gb_s(run["moved"], run[part][key]) if gb else "–")
        return cells

    rows.append(line("components' sum (the site phases but training, + zone close)", "components_s"))
    rows.append(line("round (wall)", "round_s"))
    rows.append(line("data plane (round − training)", "data_plane_s", gb=True))
    rows.append(
        [
            "copy floor (np.copyto of the bytes moved)",
            c.fmt(plain["copy_floor_s"], 3),
            f"{plain['copy_gb_s']:.2f}",
            "–",
            c.fmt(he["copy_floor_s"], 3),
            f"{he['copy_gb_s']:.2f}",
        ]
    )
    return rows


def ratio(run: dict[str, Any]) -> float:
    """A federation round's data plane over a component round's components' sum (issue 39's goal)."""
    return float(run["at_once"]["data_plane_s"] / run["one_at_a_time"]["components_s"])


def _notes(plain: dict[str, Any], he: dict[str, Any], plan_bytes: tuple[int, int], quick: bool) -> list[str]:
    """The section's notes: models, set-up, rounds, bytes, memory, HE bytes."""
    mb = _MB
    model_mb = plain["model_bytes"] / mb
    he_measured = he["pushed"] / (he["sites"] * 4 * he["values"])
    tile = plain["tile"]
    he_plan = plan_bytes[0] / (4 * plan_bytes[1])
    plain_model = f"{plain['values'] / 1e6:.1f} M-parameter transformer ({model_mb:.1f} MB)"
    he_model = f"{he['values'] / 1e6:.1f} M-parameter transformer ({he['model_bytes'] / mb:.1f} MB)"
    notes = [
        f"- Plaintext: the {plain_model}; every shard encrypted with {he['scheme']}: the {he_model}"
        + (
            " (--quick: small models, a smoke test of the path)."
            if quick
            else " (a subset of the 118 M one: one block, "
            "vocab 4,096, so that 4 sites' encryption and decryption fit a run on 2 cores)."
        ),
        "- 4 site processes (2 EU, 2 US), 2 zone processes (eu-central reducing, us-east), gRPC on loopback, plain "
        "text; the real Coordinator, Site (sealed store, signed manifests) and zones (residency policy, signatures "
        "checked); training replaced by a synthetic in-place update. A round's train message catches the site up "
        "to the round before (fetch, verify, apply, save) and then trains and pushes. "
        f"Shard tile {tile[0]}x{tile[1]} ({tile[0] * tile[1] * 4 / 2**20:g} MiB shards; `--tile`).",
        "- Component rounds (even) send the sites their messages one after the other, so each phase runs with "
        "nothing else of the round beside it; their phases summed (every site's but training, and the zones' close, "
        "which the coordinator runs zone after zone) are the components' sum. Federation rounds (odd, from 3) send "
        "every site its message at once, as a deployment does. "
        f"Plaintext: {plain['one_at_a_time']['rounds']} component and {plain['at_once']['rounds']} federation "
        f"rounds of {plain['rounds']}, medians; {he['scheme']}: component round 2 of {he['rounds']}. Round 1 "
        f"(model build, genesis save, HE pool start: {plain['first_round_s']:.2f} s / {he['first_round_s']:.2f} s) "
        "and the last (an evaluate message besides) "
        "are left out. Phase seconds are summed over the 4 sites (zone phases over both zones); a phase is a "
        "wrapped library call, so `push` includes the zone's work on the frames.",
        f"- Bytes moved per round: pushed {plain['pushed'] / mb:,.1f} MB + fetched {plain['fetched'] / mb:,.1f} MB "
        f"(plaintext); {he['scheme']} {he['pushed'] / mb:,.1f} MB + {he['fetched'] / mb:,.1f} MB. The copy floor is "
        f"`np.copyto` of that many bytes at {plain['copy_gb_s']:.2f} GB/s, measured in the same run; zone-to-zone "
        "forwarding of partial sums is not counted in it.",
        f"- Data plane of a federation round: {plain['at_once']['data_plane_s']:.2f} s = {ratio(plain):.2f}× the "
        f"components' sum ({plain['one_at_a_time']['components_s']:.2f} s) and "
        f"{plain['at_once']['data_plane_s'] / plain['copy_floor_s']:.0f}× the copy floor "
        f"({plain['copy_floor_s']:.3f} s); of a component round {plain['one_at_a_time']['data_plane_s']:.2f} s "
        f"({plain['one_at_a_time']['data_plane_s'] / plain['one_at_a_time']['components_s']:.2f}× its components: "
        "the rest is the coordinator, messages and the pipes).",
        f"- Peak RSS (VmHWM): zone {plain['zone_peak_rss'] / mb:,.0f} MB (its RSS at start "
        f"{plain['zone_base_rss'] / mb:,.0f} MB; staging budget {plain['staging_bytes'] / mb:,.0f} MB) = "
        f"{plain['zone_peak_rss'] / plain['model_bytes']:.2f}× the model; site during a message "
        f"{plain['site_peak_rss'] / mb:,.0f} MB = {plain['site_peak_rss'] / plain['model_bytes']:.2f}× the model "
        "(the median over rounds of the round's largest message peak; both include the processes' Python, gRPC and "
        f"torch); the site's RSS once assembled, before any message, {plain['site_base_rss'] / mb:,.0f} MB, so a "
        f"message adds {_site_added(plain):.2f}× the model.",
        f"- {he['scheme']} bytes per float32 byte: {he_measured:.2f}× pushed in the measured round; "
        f"{he_plan:.2f}× for the {plan_bytes[1] / 1e6:.1f} M values of the "
        f"{'quick' if quick else '118 M'} model's plan (packed as sites pack it, bytes exact).",
    ]
    if plain["missing"] or he["missing"]:
        notes.append(f"- Not timed (the library no longer has them): {', '.join(plain['missing'] + he['missing'])}.")
    notes.append(
        "- Zone memory with 20 sites is not run here (20 site processes of the 118 M model do not fit this machine): "
        "`bench/zone_memory.py` pushes 20 synthetic updates into one zone."
    )
    return notes


def _site_added(plain: dict[str, Any]) -> float:
    """What a site's largest message adds to its RSS before any message, in models."""
    return float((plain["site_peak_rss"] - plain["site_base_rss"]) / plain["model_bytes"])


def _interpretation(plain: dict[str, Any], he_plan: float, scheme: str) -> str:
    """The goals in words, and where the data plane's time goes."""
    mb = _MB
    together = plain["at_once"]["data_plane_s"]
    floor_ratio = together / plain["copy_floor_s"]
    site_phases = {
        k: v
        for k, v in plain["one_at_a_time"]["phases"].items()
        if k.startswith("site: ") and k not in ("site: train", "site: whole messages")
    }
    largest = sorted(site_phases.items(), key=lambda kv: -kv[1])[:3]
    where = ", ".join(f"{k.removeprefix('site: ')} {v:.2f} s" for k, v in largest)
    return (
        f"Goals: a federation round's data plane ≤ {GOAL}× its components' sum (issue 39): {ratio(plain):.2f}× "
        f"({together:.2f} s against {plain['one_at_a_time']['components_s']:.2f} s; "
        f"{'met' if ratio(plain) <= GOAL else 'not met'}). Data plane ≤ 3× the copy floor: {floor_ratio:.0f}× "
        f"({'met' if floor_ratio <= 3 else 'not met'}); the largest components (4 sites summed) are {where}. "
        f"Zone peak RSS ≤ 1.5 × model + staging budget: {plain['zone_peak_rss'] / mb:,.0f} MB "
        f"({(plain['zone_peak_rss'] - plain['zone_base_rss']) / mb:,.0f} MB over its RSS at start) against "
        f"{(1.5 * plain['model_bytes'] + plain['staging_bytes']) / mb:,.0f} MB; site peak RSS during a message "
        f"≤ 2.5 × model: {plain['site_peak_rss'] / plain['model_bytes']:.2f}× ({_site_added(plain):.2f}× over the "
        f"site's RSS before its first message); {scheme} bytes ≤ 3× float32: "
        f"{he_plan:.2f}×."
    )


def report(
    plain: dict[str, Any], he: dict[str, Any], plan_bytes: tuple[int, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Print the table, write the section, print the headline JSON."""
    he_plan = plan_bytes[0] / (4 * plan_bytes[1])
    headers = [
        "phase (4 sites, summed)",
        "plaintext s, one at a time",
        "GB/s",
        "plaintext s, at once",
        f"{he['scheme']} s, one at a time",
        f"{he['scheme']} GB/s",
    ]
    rows = _rows(plain, he)
    headline = {
        "data_plane_s": plain["at_once"]["data_plane_s"],
        "components_s": plain["one_at_a_time"]["components_s"],
        "data_plane_over_components": ratio(plain),
        "one_at_a_time_data_plane_s": plain["one_at_a_time"]["data_plane_s"],
        "copy_floor_s": plain["copy_floor_s"],
        "zone_peak_rss_mb": plain["zone_peak_rss"] / _MB,
        "site_peak_rss_mb": plain["site_peak_rss"] / _MB,
        "site_base_rss_mb": plain["site_base_rss"] / _MB,
        "model_mb": plain["model_bytes"] / _MB,
        "he_scheme": he["scheme"],
        "he_bytes_per_f32": he_plan,
    }
    c.print_table("a large full-parameter round, 4 sites, 2 zones", headers, rows)
    notes = _notes(plain, he, plan_bytes, args.quick)
    runs = (
        f"{plain['rounds']} plaintext rounds, {he['rounds']} {he['scheme']} rounds (medians of the component "
        "rounds and of the federation rounds)"
    )
    c.publish(args, SECTION, "A large full-parameter round", runs, None, notes, headers, rows,
              _interpretation(plain, he_plan, he['scheme']), headline=headline)  # fmt: skip
    return headline
