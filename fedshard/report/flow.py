"""The residency flow picture: sites' jurisdictions → the zones that received their
shards, by class → the aggregates those zones published (and the partial sums they
forwarded to the reducing zone). A line under it says, for each class and origin,
which regions held it: "personal from EU: EU only" at a glance.

Counts are the zones' own where the run wrote them (``summary.json``), else the
acknowledgements the sites relayed, summed over the rounds.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard.report.plots import class_colour, empty_note, figure, save, wrapped_text
from fedshard.report.run import RunRecord

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["Flows", "flows", "residency_flow"]

GLOBAL_GROUP = "global"


@dataclass
class Flows:
    """Shards by (class from origin) per zone, aggregates per zone, partial sums forwarded."""

    received: dict[str, dict[str, int]] = field(default_factory=dict)  # zone -> "personal from EU" -> shards
    regions: dict[str, str] = field(default_factory=dict)  # zone -> region ("" unknown)
    aggregates: dict[tuple[str, str], int] = field(default_factory=dict)  # (zone, group) -> shards published
    forwarded: dict[str, int] = field(default_factory=dict)  # zone -> partial sums sent to the reducing zone
    sites: dict[str, int] = field(default_factory=dict)  # jurisdiction -> sites

    def held_in(self) -> dict[str, list[str]]:
        """``"personal from EU"`` → the regions of the zones that received such shards."""
        out: dict[str, set[str]] = {}
        for zone, counts in self.received.items():
            for name, n in counts.items():
                if n:
                    out.setdefault(name, set()).add(self.regions.get(zone) or f"zone {zone}")
        return {name: sorted(regions) for name, regions in sorted(out.items())}

    def residency_lines(self) -> list[tuple[str, str, bool]]:
        """Per class and origin: the line to show and whether it stayed in its own region."""
        lines = []
        for name, regions in self.held_in().items():
            origin = name.split(" from ", 1)[1] if " from " in name else ""
            home = bool(origin) and regions == [origin]
            lines.append((name, f"{name}: {origin} only" if home else f"{name}: {', '.join(regions)}", home))
        return lines


def flows(run: RunRecord) -> Flows:
    """The run's flows (see the module's docstring for which counts)."""
    out = Flows()
    out.regions = run.regions
    for details in run.zones:
        name = str(details.get("name"))
        out.received[name] = dict(details.get("shards_by_class", {}))
        if details.get("forwarded_shards"):
            out.forwarded[name] = int(details["forwarded_shards"])
    if not out.received:  # no zone counters: what the sites relayed
        totals: dict[str, collections.Counter[str]] = {}
        for r in run.rounds:
            for zone, t in r.traffic.items():
                totals.setdefault(zone, collections.Counter()).update(t.get("shards", {}))
        out.received = {zone: dict(c) for zone, c in totals.items()}
    for r in run.rounds:
        for entry in r.aggregates:
            key = (str(entry["zone"]), str(entry["group"]))
            out.aggregates[key] = out.aggregates.get(key, 0) + int(entry.get("shards", 0))
    out.sites = dict(collections.Counter(run.jurisdictions.values()))
    return out


def residency_flow(run: RunRecord, path: Path) -> Path:
    """Draw the flow picture to ``path``."""
    data = flows(run)
    zones = sorted(data.received, key=lambda z: (data.regions.get(z, ""), z))
    origins = sorted({n.split(" from ", 1)[1] for c in data.received.values() for n in c if " from " in n})
    origins = sorted(set(origins) | set(data.sites))
    aggregates = sorted(data.aggregates)
    rows = max(len(origins), len(zones), len(aggregates), 1)
    fig = figure(10.0, 1.6 + 0.9 * rows)
    ax = fig.subplots()
    ax.set_title("Where shards went: sites' jurisdictions → zones (by class) → aggregates")
    if not zones:
        empty_note(ax, "no zone received anything")
        return save(fig, path)
    ax.set_xlim(-0.35, 2.45)
    ax.set_ylim(-0.6, rows)
    ax.axis("off")
    y_origin = _rows(origins, rows)
    y_zone = _rows(zones, rows)
    y_agg = _rows([f"{z}|{g}" for z, g in aggregates], rows)
    for origin, y in y_origin.items():
        sites = data.sites.get(origin, 0)
        _node(ax, 0.0, y, f"{origin}\n{sites} site{'s' if sites != 1 else ''}", "#f0f0f0")
    for zone, y in y_zone.items():
        region = data.regions.get(zone, "")
        _node(ax, 1.0, y, f"{zone}\nregion {region}" if region else zone, "#e5f5e0")
    for (zone, group), y in zip(aggregates, y_agg.values(), strict=True):
        _node(ax, 2.0, y, f"{zone}: {group}\n{data.aggregates[(zone, group)]} shards published", "#efedf5")
    heaviest = max((n for c in data.received.values() for n in c.values()), default=1) or 1
    for zone, counts in data.received.items():
        names = sorted(counts)
        for i, name in enumerate(names):
            origin = name.split(" from ", 1)[1] if " from " in name else ""
            if origin not in y_origin:
                continue
            offset = (i - (len(names) - 1) / 2) * 0.2
            colour = class_colour(name, 0)
            width = 0.8 + 4.0 * counts[name] / heaviest
            _edge(ax, (0.18, y_origin[origin] + offset), (0.82, y_zone[zone] + offset), colour, width)
            ax.text(
                0.5,
                (y_origin[origin] + y_zone[zone]) / 2 + offset + 0.03,
                f"{name.split(' from ')[0]} {counts[name]}",
                fontsize=7,
                ha="center",
                va="bottom",
                color=colour,
            )
    reducer = next((z for z, g in aggregates if g == GLOBAL_GROUP), None)
    for (zone, _), y in zip(aggregates, y_agg.values(), strict=True):
        if zone in y_zone:
            _edge(ax, (1.18, y_zone[zone]), (1.7, y), "#555555", 1.2)
    if reducer is not None:
        target = y_agg[f"{reducer}|{GLOBAL_GROUP}"]
        for zone, n in sorted(data.forwarded.items()):
            if zone in y_zone:
                _edge(ax, (1.18, y_zone[zone]), (1.7, target), "#555555", 1.2, dashed=True)
                ax.text(1.5, (y_zone[zone] + target) / 2, f"{n} partial sums", fontsize=7, ha="center", color="#555555")
    lines = data.residency_lines()
    text = "   ".join(f"{'✓' if home else '→'} {line}" for _, line, home in lines)
    wrapped_text(ax, 1.05, -0.45, f"Shards received, by region: {text}", ha="center", va="center", fontsize=8)
    return save(fig, path)


def _rows(names: list[str], rows: int) -> dict[str, float]:
    """Spread ``names`` evenly over ``rows`` rows, top to bottom."""
    if not names:
        return {}
    step = rows / len(names)
    return {name: rows - step * (i + 0.5) for i, name in enumerate(names)}


def _node(ax: Axes, x: float, y: float, label: str, colour: str) -> None:
    ax.text(
        x,
        y,
        label,
        ha="center",
        va="center",
        fontsize=8,
        bbox={"boxstyle": "round,pad=0.4", "fc": colour, "ec": "#888888"},
    )


def _edge(
    ax: Axes, start: tuple[float, float], end: tuple[float, float], colour: str, width: float, *, dashed: bool = False
) -> None:
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        arrowprops={
            "arrowstyle": "-|>",
            "color": colour,
            "lw": width,
            "ls": "--" if dashed else "-",
            "shrinkA": 0,
            "shrinkB": 0,
            "alpha": 0.8,
        },
    )
