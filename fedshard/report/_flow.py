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

from fedshard.report._plots import class_colour, empty_note, figure, save, wrapped_text
from fedshard.report._run import RunRecord

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
    forwarded_by_class: dict[str, dict[str, int]] = field(default_factory=dict)  # zone -> class -> sites' shards
    reducer: str = ""  # the reducing zone ("" none, or not known)
    counted: bool = True  # False: the zones' own counters are missing (no summary.json), the sites' word only
    sites: dict[str, int] = field(default_factory=dict)  # jurisdiction -> sites

    def _region(self, zone: str) -> str:
        return self.regions.get(zone) or f"zone {zone}"

    def held_in(self) -> dict[str, list[str]]:
        """``"personal from EU"`` → the regions of the zones that received such shards."""
        out: dict[str, set[str]] = {}
        for zone, counts in self.received.items():
            for name, n in counts.items():
                if n:
                    out.setdefault(name, set()).add(self._region(zone))
        return {name: sorted(regions) for name, regions in sorted(out.items())}

    def summed_in(self, name: str) -> tuple[list[str], list[str]]:
        """Where partial sums of ``name``'s shards were reduced: the reducing zone's region when
        any zone holding them forwarded some (by its per-class counts); and the zones that
        forwarded partial sums without saying of which classes (runs from before they were counted)."""
        regions: set[str] = set()
        unknown: list[str] = []
        for zone, counts in self.received.items():
            if not counts.get(name) or not self.forwarded.get(zone):
                continue
            by_class = self.forwarded_by_class.get(zone)
            if by_class is None:
                unknown.append(zone)
            elif by_class.get(name):
                regions.add(self._region(self.reducer) if self.reducer else "the reducing zone")
        return sorted(regions), sorted(unknown)

    def residency_lines(self) -> list[tuple[str, str, bool]]:
        """Per class and origin: the line to show, saying where the raw shards were received and
        where partial sums containing them were reduced; and whether neither left its region."""
        lines = []
        for name, regions in self.held_in().items():
            origin = name.split(" from ", 1)[1] if " from " in name else ""
            summed, unknown = self.summed_in(name)
            raw_home = bool(origin) and regions == [origin]
            line = f"{name}: raw shards received in {origin + ' only' if raw_home else ', '.join(regions)}"
            if summed:
                line += f"; partial sums containing them reduced in {', '.join(summed)}"
            if unknown:
                line += f"; zone(s) {', '.join(unknown)} forwarded partial sums (which classes not recorded)"
            if not self.counted and self.reducer:
                line += "; what left in partial sums is unknown (the zones' counters are in summary.json, not written)"
            home = raw_home and not unknown and all(r == origin for r in summed) and (self.counted or not self.reducer)
            lines.append((name, line, home))
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
        if "forwarded_by_class" in details:
            out.forwarded_by_class[name] = dict(details["forwarded_by_class"])
        if details.get("reducing"):
            out.reducer = name
    if not out.received:  # no zone counters: what the sites relayed
        out.counted = False
        totals: dict[str, collections.Counter[str]] = {}
        for r in run.rounds:
            for zone, t in r.traffic.items():
                totals.setdefault(zone, collections.Counter()).update(t.get("shards", {}))
        out.received = {zone: dict(c) for zone, c in totals.items()}
    for r in run.rounds:
        for entry in r.aggregates:
            key = (str(entry["zone"]), str(entry["group"]))
            out.aggregates[key] = out.aggregates.get(key, 0) + int(entry.get("shards", 0))
    if not out.reducer:
        out.reducer = next((zone for zone, group in out.aggregates if group == GLOBAL_GROUP), "")
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
    leaving: dict[str, list[tuple[str, str]]] = {}  # origin -> (zone, class from origin), its edges top to bottom
    for zone in zones:
        for name in sorted(data.received[zone]):
            origin = name.split(" from ", 1)[1] if " from " in name else ""
            if origin in y_origin:
                leaving.setdefault(origin, []).append((zone, name))
    for origin, edges in leaving.items():
        for j, (zone, name) in enumerate(edges):
            arriving = sorted(data.received[zone])
            start = (0.18, y_origin[origin] - _spread(j, len(edges), 0.22))
            end = (0.82, y_zone[zone] - _spread(arriving.index(name), len(arriving), 0.15))
            colour = class_colour(name, 0)
            count = data.received[zone][name]
            _edge(ax, start, end, colour, 0.8 + 4.0 * count / heaviest)
            _label_on(ax, start, end, 0.12, f"{name.split(' from ')[0]} {count}", colour)
    for (zone, _), y in zip(aggregates, y_agg.values(), strict=True):
        if zone in y_zone:
            _edge(ax, (1.18, y_zone[zone]), (1.7, y), "#555555", 1.2)
    if data.reducer and f"{data.reducer}|{GLOBAL_GROUP}" in y_agg:
        target = y_agg[f"{data.reducer}|{GLOBAL_GROUP}"]
        for zone, n in sorted(data.forwarded.items()):
            if zone in y_zone:
                start, end = (1.18, y_zone[zone]), (1.7, target)
                _edge(ax, start, end, "#555555", 1.2, dashed=True)
                _label_on(ax, start, end, 0.3, f"{n} partial sums", "#555555")
    lines = data.residency_lines()
    text = "   ".join(f"{'✓' if home else '→'} {line}." for _, line, home in lines)
    wrapped_text(ax, 1.05, -0.45, text, ha="center", va="center", fontsize=8)
    return save(fig, path)


def _spread(i: int, n: int, step: float) -> float:
    """The offset of the ``i``-th of ``n`` edges at one node, ``step`` apart, centred on it."""
    return (i - (n - 1) / 2) * step


def _rows(names: list[str], rows: int) -> dict[str, float]:
    """Spread ``names`` evenly over ``rows`` rows, top to bottom."""
    if not names:
        return {}
    step = rows / len(names)
    return {name: rows - step * (i + 0.5) for i, name in enumerate(names)}


def _label_on(ax: Axes, start: tuple[float, float], end: tuple[float, float], t: float, text: str, colour: str) -> None:
    """``text`` on the line from ``start`` to ``end``, at ``t`` of its length (near its own end,
    where lines do not yet cross), on a white ground so no other line runs through it."""
    x, y = start[0] + t * (end[0] - start[0]), start[1] + t * (end[1] - start[1])
    box = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": colour, "lw": 0.6}
    ax.text(x, y, text, fontsize=7, ha="center", va="center", color=colour, bbox=box, zorder=5)


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
