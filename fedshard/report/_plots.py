"""The report's plots, one PNG each (matplotlib, no display needed): accuracy and loss
against the central baseline, ε spent against each budget, traffic per zone by class
and origin, where the time of a round went. The residency flow picture has a module
of its own (:mod:`fedshard.report._flow`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedshard.protocol.messages import PrivacyStatus
from fedshard.protocol.timings import Phase
from fedshard.report._run import RunRecord

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "PLOTS",
    "SHOWN_SITES",
    "WAITING",
    "Plot",
    "class_colour",
    "empty_note",
    "figure",
    "save",
    "wrapped_text",
    "zone_colours",
]

SHOWN_SITES = 12
"""Sites a plot draws one by one; beyond, it draws their spread (least, median, most)."""

DPI = 110

PHASE_COLOURS: dict[str, str] = {
    Phase.OPEN: "#bbbbbb",
    Phase.FETCH: "#9ecae1",
    Phase.APPLY: "#4292c6",
    Phase.TRAIN: "#31a354",
    Phase.SEAL: "#a1d99b",
    Phase.PUSH: "#fd8d3c",
    Phase.FOLD: "#e6550d",
    Phase.CLOSE: "#756bb1",
    Phase.EVALUATE: "#969696",
    "waiting": "#eeeeee",
}
"""One colour per phase of a round (and for the time no phase of a typical site accounts for)."""

WAITING = (
    "waiting: the part of a round no phase of a typical site accounts for: the slowest selected "
    "site still training or pushing (the round closes when every selected site is in or timed "
    "out), messages in transit between the coordinator, the sites and the zones, and starting "
    "the sites' processes (Flower starts one per message in simulation)"
)
"""What the ``waiting`` part of a round's time bar is, said under the plot."""

ZONE_PALETTE = ("#1b9e77", "#7570b3", "#66a61e", "#e6ab02", "#a6761d", "#d95f02", "#17becf", "#666666")
"""Zone colours: greens, purples, ochres, oranges, teal (reds and blues mean classes of shard)."""

SITE_MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h", "<", ">", "p", "d")
SITE_LINES = ("-", "-.", ":")


def figure(width: float = 9.0, height: float = 4.5) -> Figure:
    """A figure of its own (no pyplot state: reports may be built from any thread)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (rounds on any axis labelled ``round`` ticked as integers)."""
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        if ax.get_xlabel() == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.savefig(path, format="png")
    return path


def zone_colours(zones: list[str]) -> dict[str, str]:
    """A colour per zone, the same in every report: taken from the zone's name (a hash), moved
    to the next free colour only where two zones of this run would share one."""
    import hashlib

    out: dict[str, str] = {}
    for zone in sorted(zones):
        start = hashlib.sha256(zone.encode()).digest()[0] % len(ZONE_PALETTE)
        taken = set(out.values())
        free = [ZONE_PALETTE[(start + i) % len(ZONE_PALETTE)] for i in range(len(ZONE_PALETTE))]
        out[zone] = next((c for c in free if c not in taken), free[0])
    return out


def _below_from_zero(ax: Axes) -> None:
    """Start the y axis at 0 (what is drawn is a count, a loss, an accuracy or an ε)."""
    ax.set_ylim(bottom=0)


def _outside_legend(ax: Axes, **kw: Any) -> None:
    """A legend right of the axes, where it covers nothing."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def _mark_changes(ax: Axes, run: RunRecord) -> None:
    """A line before each round the federation changed at (zones added or drained, sites joined)."""
    for i, change in enumerate(run.result.changes):
        label = "federation changed before this round" if i == 0 else None
        ax.axvline(change["round"] - 0.5, color="black", ls="-.", lw=1, label=label)


def wrapped_text(ax: Axes, x: float, y: float, text: str, **kw: Any) -> None:
    """``text`` wrapped to the figure, drawn as it is: matplotlib measures wrapped lines as
    mathtext whatever ``text.parse_math`` says, so every ``$`` is escaped (and shown as ``$``)."""
    ax.text(x, y, text.replace("$", r"\$"), wrap=True, parse_math=True, **kw)


def empty_note(ax: Axes, message: str) -> None:
    wrapped_text(ax, 0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#555555")
    ax.set_xticks([])
    ax.set_yticks([])


def _mark_aborted(ax: Axes, run: RunRecord) -> None:
    for i, aborted in enumerate(run.result.aborted):
        ax.axvline(aborted["round"], color="#d62728", ls=":", lw=1, label="round aborted" if i == 0 else None)


def accuracy(run: RunRecord, path: Path) -> Path:
    """Accuracy and loss per round, the central baseline as a line."""
    fig = figure()
    acc_ax, loss_ax = fig.subplots(1, 2)
    rounds = [r.round for r in run.rounds]
    acc_ax.plot(rounds, [r.accuracy for r in run.rounds], marker="o", ms=3, label="federated (test)")
    central = run.central_accuracy
    if central is not None:
        acc_ax.axhline(central, color="black", ls="--", lw=1, label=f"central baseline {central:.4f}")
    _mark_aborted(acc_ax, run)
    _mark_changes(acc_ax, run)
    acc_ax.set(title="Accuracy per round", xlabel="round", ylabel="accuracy", ylim=(0, 1.02))
    loss_ax.plot(rounds, [r.loss for r in run.rounds], marker="o", ms=3, label="test loss")
    loss_ax.plot(rounds, [r.train_loss for r in run.rounds], ls="--", label="train loss (sites' mean)")
    _mark_aborted(loss_ax, run)
    _mark_changes(loss_ax, run)
    loss_ax.set(title="Loss per round", xlabel="round", ylabel="loss")
    _below_from_zero(loss_ax)
    for ax in (acc_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left" if ax is acc_ax else "upper right")
    if not rounds:
        empty_note(acc_ax, "no round finished")
    return save(fig, path)


def privacy(run: RunRecord, path: Path) -> Path:
    """ε spent per site per round (each site its own marker and line style; sites whose lines
    coincide are drawn a little apart along the rounds), each budget as a dashed line,
    exhaustion marked; y from 0; each site's δ in the legend."""
    fig = figure()
    ax = fig.subplots()
    ax.set(title="Privacy budget: ε spent per site", xlabel="round", ylabel="ε spent")
    spent = _epsilon_by_site(run)
    if not spent:
        empty_note(ax, "differential privacy is off in this run: no site reported a privacy ledger")
        return save(fig, path)
    if len(spent) <= SHOWN_SITES:
        offsets = _apart(spent)
        for i, (site, points) in enumerate(sorted(spent.items())):
            xs = [p.round + offsets[site] for p in points]
            marker, ls = SITE_MARKERS[i % len(SITE_MARKERS)], SITE_LINES[i % len(SITE_LINES)]
            label = f"{site} (δ {points[-1].delta:g})"
            (line,) = ax.plot(xs, [p.spent for p in points], marker=marker, ls=ls, ms=4, label=label)
            stopped = next((p for p in points if p.status != PrivacyStatus.ACTIVE), None)
            if stopped is not None:
                x = stopped.round + offsets[site]
                ax.plot(x, stopped.spent, marker="X", ms=10, color=line.get_color(), mec="k")
        _budget_lines(ax, spent)
        moved = " (drawn apart: equal ε)" if any(offsets.values()) else ""
        _outside_legend(ax, fontsize=7, title=f"site (δ){moved}; X: stopped", title_fontsize=7)
    else:
        rounds = sorted({p.round for points in spent.values() for p in points})
        by_round = {r: sorted(p.spent for points in spent.values() for p in points if p.round == r) for r in rounds}
        ax.fill_between(rounds, [by_round[r][0] for r in rounds], [by_round[r][-1] for r in rounds], alpha=0.3)
        ax.plot(rounds, [statistics.median(by_round[r]) for r in rounds], label=f"median of {len(spent)} sites")
        _budget_lines(ax, spent)
        halted = sum(1 for points in spent.values() if points[-1].status != PrivacyStatus.ACTIVE)
        deltas = sorted({points[-1].delta for points in spent.values()})
        delta = ", ".join(f"{d:g}" for d in deltas[:4]) + (" …" if len(deltas) > 4 else "")
        _outside_legend(ax, fontsize=7, title=f"band: least to most\nδ {delta}\n{halted} site(s) stopped")
    _mark_changes(ax, run)
    _below_from_zero(ax)
    ax.grid(alpha=0.3)
    return save(fig, path)


@dataclass(frozen=True)
class _Spent:
    round: int
    spent: float
    budget: float
    delta: float
    status: str


def _epsilon_by_site(run: RunRecord) -> dict[str, list[_Spent]]:
    """Site → what it reported after each round: ε spent, its budget, δ, its status."""
    out: dict[str, list[_Spent]] = {}
    for r in run.rounds:
        for site, report in r.privacy.items():
            point = _Spent(
                r.round,
                float(report["epsilon_spent"]),
                float(report["epsilon_budget"]),
                float(report.get("delta", 0.0)),
                str(report["status"]),
            )
            out.setdefault(site, []).append(point)
    return out


def _apart(spent: dict[str, list[_Spent]]) -> dict[str, float]:
    """An offset along the rounds per site, so sites whose ε lines coincide stay visible
    side by side (0 for a site no other one shares its line with)."""
    same: dict[tuple[tuple[int, float], ...], list[str]] = {}
    for site, points in sorted(spent.items()):
        same.setdefault(tuple((p.round, round(p.spent, 3)) for p in points), []).append(site)
    offsets: dict[str, float] = {}
    for sites in same.values():
        for i, site in enumerate(sites):
            offsets[site] = (i - (len(sites) - 1) / 2) * 0.12 if len(sites) > 1 else 0.0
    return offsets


def _budget_lines(ax: Axes, spent: dict[str, list[_Spent]]) -> None:
    """One dashed line per budget, labelled with how many sites have it."""
    budgets: dict[float, int] = {}
    for points in spent.values():
        budgets[points[-1].budget] = budgets.get(points[-1].budget, 0) + 1
    for budget, n in sorted(budgets.items()):
        ax.axhline(budget, color="black", ls="--", lw=0.8)
        ax.annotate(
            f"budget ε {budget:g} ({n} site{'s' if n != 1 else ''})",
            (0.0, budget),
            xycoords=("axes fraction", "data"),
            xytext=(4, 3),
            textcoords="offset points",
            fontsize=7,
        )


def traffic(run: RunRecord, path: Path) -> Path:
    """Bytes per zone per round, and shards per zone per round by class and origin."""
    zones = sorted({z for r in run.rounds for z in r.traffic})
    shown = zones[:6]
    fig = figure(10.0, 3.2 * (1 + math.ceil(max(len(shown), 1) / 3)))
    grid = fig.add_gridspec(1 + math.ceil(max(len(shown), 1) / 3), 3)
    bytes_ax = fig.add_subplot(grid[0, :])
    bytes_ax.set(title="Bytes received per round, by zone", xlabel="round", ylabel="MB")
    if not zones:
        empty_note(bytes_ax, "no traffic recorded (a run logged before traffic was recorded, or no round finished)")
        return save(fig, path)
    rounds = [r.round for r in run.rounds]
    bottom = [0.0] * len(rounds)
    colours = zone_colours(zones)
    for zone in zones:
        mb = [r.traffic.get(zone, {}).get("bytes", 0) / 1e6 for r in run.rounds]
        bytes_ax.bar(rounds, mb, bottom=bottom, label=zone, color=colours[zone])
        bottom = [b + m for b, m in zip(bottom, mb, strict=True)]
    _mark_changes(bytes_ax, run)
    _outside_legend(bytes_ax, fontsize=8)
    regions = run.regions
    for i, zone in enumerate(shown):
        ax = fig.add_subplot(grid[1 + i // 3, i % 3])
        classes = sorted({k for r in run.rounds for k in r.traffic.get(zone, {}).get("shards", {})})
        origins = sorted({name.split(" from ", 1)[-1] for name in classes})
        below = [0] * len(rounds)
        for name in classes:
            counts = [r.traffic.get(zone, {}).get("shards", {}).get(name, 0) for r in run.rounds]
            shade = origins.index(name.split(" from ", 1)[-1])
            ax.bar(rounds, counts, bottom=below, label=name, color=class_colour(name, shade))
            below = [b + c for b, c in zip(below, counts, strict=True)]
        region = f" ({regions[zone]})" if regions.get(zone) else ""
        ax.set(title=f"{zone}{region}: shards by class", xlabel="round")
        ax.title.set_color(colours[zone])
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2, frameon=False)
    return save(fig, path)


def class_colour(name: str, index: int) -> str:
    """Personal shards in reds, public in blues, others in greys (shades by origin)."""
    shades = {"personal": ["#d62728", "#ff9896", "#8c1c13"], "public": ["#1f77b4", "#aec7e8", "#08306b"]}
    kind = name.split(" from ", 1)[0]
    palette = shades.get(kind, ["#7f7f7f", "#c7c7c7", "#525252"])
    return palette[index % len(palette)]


def round_times(run: RunRecord, path: Path) -> Path:
    """Where each round's time went: the coordinator's open and close, a typical site's
    phases (the mean over the round's sites), and the rest (waiting for slower sites,
    message transport, process starts)."""
    fig = figure(10.0, 4.5)
    ax, sites_ax = fig.subplots(1, 2, width_ratios=[2, 1])
    ax.set(title="Where each round's time went", xlabel="round", ylabel="seconds")
    timed = [r for r in run.rounds if r.timings.get("round")]
    if not timed:
        empty_note(ax, "no timings recorded (a run logged before timings were recorded)")
        empty_note(sites_ax, "")
        return save(fig, path)
    segments = [_segments(r.timings) for r in timed]
    rounds = [r.round for r in timed]
    bottom = [0.0] * len(timed)
    for phase in PHASE_COLOURS:
        values = [s.get(phase, 0.0) for s in segments]
        if any(values):
            label = "waiting (see below)" if phase == "waiting" else str(phase)
            ax.bar(rounds, values, bottom=bottom, label=label, color=PHASE_COLOURS[phase])
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    _mark_changes(ax, run)
    ax.legend(fontsize=7, ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    _site_totals(sites_ax, timed)
    return save(fig, path)


def _segments(timings: dict[str, Any]) -> dict[str, float]:
    """One round's bar: open and close as the coordinator waited, site phases as the mean
    over its sites (push less the zones' fold), the rest as waiting."""
    waits = timings.get("coordinator", {})
    sites = list(timings.get("sites", {}).values())
    out: dict[str, float] = {Phase.OPEN: waits.get(Phase.OPEN, 0.0), Phase.CLOSE: waits.get(Phase.CLOSE, 0.0)}
    for phase in (Phase.FETCH, Phase.APPLY, Phase.TRAIN, Phase.SEAL, Phase.PUSH, Phase.FOLD, Phase.EVALUATE):
        out[phase] = statistics.fmean(s.get(phase, 0.0) for s in sites) if sites else 0.0
    out[Phase.PUSH] = max(out[Phase.PUSH] - out[Phase.FOLD], 0.0)  # the site's push includes the zone's fold
    out["waiting"] = max(float(timings["round"]) - sum(out.values()), 0.0)
    return out


def _site_totals(ax: Axes, rounds: list[Any]) -> None:
    """Each site's mean seconds per round by phase (the slowest sites, at most a dozen)."""
    totals: dict[str, dict[str, float]] = {}
    for r in rounds:
        for site, phases in r.timings.get("sites", {}).items():
            mine = totals.setdefault(site, {})
            for phase, seconds in phases.items():
                mine[phase] = mine.get(phase, 0.0) + seconds / len(rounds)
    slowest = sorted(totals, key=lambda s: -sum(totals[s].values()))[:SHOWN_SITES]
    left = [0.0] * len(slowest)
    for phase, colour in PHASE_COLOURS.items():
        values = [totals[s].get(phase, 0.0) for s in slowest]
        if phase == Phase.PUSH:
            values = [max(v - totals[s].get(Phase.FOLD, 0.0), 0.0) for v, s in zip(values, slowest, strict=True)]
        if any(values):
            ax.barh(slowest, values, left=left, color=colour)
            left = [a + v for a, v in zip(left, values, strict=True)]
    title = "Per site, mean per round" if len(totals) <= SHOWN_SITES else f"Slowest {SHOWN_SITES} of {len(totals)}"
    ax.set(title=title, xlabel="seconds")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)


Plot = tuple[str, str, Callable[[RunRecord, Path], Path]]
"""A plot: its file name, its caption, the function drawing it."""

PLOTS: list[Plot] = [
    ("accuracy.png", "Accuracy and loss per round, against the central baseline (all data pooled)", accuracy),
    ("privacy.png", "ε spent per site per round; dashed: each site's budget; X: the site stopped", privacy),
    ("traffic.png", "What each zone received per round: bytes, and shards by class and origin", traffic),
    ("round_times.png", f"Where the time of each round went, by phase. {WAITING}.", round_times),
]
"""The plots drawn from the run's records, in the order the report shows them."""
