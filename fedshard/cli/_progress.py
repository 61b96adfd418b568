"""Rich progress display for a running federation, readable in an 80-column terminal:
one line per round (details folded under it, indented), narrow tables."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from fedshard.coordinator.results import RoundResult
from fedshard.protocol.messages import PrivacyStatus, SiteInfo

__all__ = [
    "SHOWN_SITES",
    "STATUS_COLOURS",
    "RoundProgress",
    "format_bytes",
    "packed_lines",
    "results_table",
    "round_line",
    "zones_table",
]

INDENT = 10
"""Where the lines under a round's line start (past ``round NNN``)."""

SHOWN_SITES = 12
"""Sites a progress line names one by one; beyond, it counts them (thousands of simulated sites)."""

STATUS_COLOURS: dict[str, str] = {
    PrivacyStatus.ACTIVE: "green",
    PrivacyStatus.EXHAUSTED: "red",
    PrivacyStatus.REFUSED: "yellow",
}
"""How a site's privacy status is coloured (keys are the statuses' wire values)."""


def format_bytes(n: float) -> str:
    """Human-readable byte count."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def packed_lines(items: list[str], width: int, indent: int = INDENT) -> list[str]:
    """``items`` (rich markup) packed into lines of at most ``width`` cells, each line
    indented by ``indent``; an item is never split (one longer than a line has a line of its own)."""
    lines: list[str] = []
    current: list[str] = []
    used = indent
    for item in items:
        cells = Text.from_markup(item).cell_len
        if current and used + 2 + cells > width:
            lines.append(" " * indent + "  ".join(current))
            current, used = [], indent
        used += cells + (2 if current else 0)
        current.append(item)
    if current:
        lines.append(" " * indent + "  ".join(current))
    return lines


def round_line(result: RoundResult, width: int) -> str:
    """A round in one line of at most ``width`` cells (the version is left out where it would not fit)."""
    selected = len(result.sites) + len(result.refused)
    counted = f"{len(result.sites)}/{selected}" if result.refused else str(len(result.sites))
    sites = f"[yellow]{counted} sites[/]" if result.refused else f"{counted} sites"
    line = (
        f"round {result.round:>3}  acc [bold]{result.accuracy:.4f}[/]  loss {result.loss:.4f}  "
        f"train {result.train_loss:.4f}  {format_bytes(result.bytes_up)}  {sites}"
    )
    version = f"  {result.version[:8]}"
    return line + version if Text.from_markup(line + version).cell_len <= width else line


class RoundProgress:
    """A :class:`~fedshard.coordinator.results.RoundObserver` that shows a progress bar
    and one line per finished round (accuracy, loss, bytes sent, sites), with the sites
    refused and the ε spent folded under it."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._progress = Progress(
            TextColumn("[bold]rounds"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._phase: TaskID | None = None  # the phase shown before the rounds start

    def __enter__(self) -> RoundProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def _print(self, line: str) -> None:
        self._progress.console.print(line, highlight=False, overflow="fold")

    def on_phase(self, what: str) -> None:
        """Say what runs now, with the time it has taken so far (a phase may take minutes)."""
        status = escape(what.split(":", 1)[0]) + "…"  # the bar's field: the phase's name
        if self._task is None:
            self._phase = self._progress.add_task("rounds", total=None, status=status)
            return
        self._progress.update(self._task, status=status)
        self._print(f"[dim]{escape(what)}…[/]")

    def on_start(self, sites: list[SiteInfo], rounds: int, genesis_version: str) -> None:
        """Show the assembled federation and start the bar."""
        if self._phase is not None:
            self._progress.remove_task(self._phase)
            self._phase = None
        if len(sites) <= SHOWN_SITES:
            names = [f"{escape(s.site_id)} ({s.jurisdiction}, {s.num_examples} ex.)" for s in sites]
            self._print(f"[bold]{len(sites)} sites[/]:")
            for line in packed_lines(names, self.console.width, indent=2):
                self._print(line)
        else:  # thousands of sites: how many per jurisdiction
            counts: dict[str, int] = {}
            for s in sites:
                counts[s.jurisdiction] = counts.get(s.jurisdiction, 0) + 1
            self._print(f"[bold]{len(sites)} sites[/]: " + ", ".join(f"{n} in {j}" for j, n in sorted(counts.items())))
        self._task = self._progress.add_task("rounds", total=rounds, status="training…")

    def on_round(self, result: RoundResult) -> None:
        """Print the round's line (and its folded details) and advance the bar."""
        width = self.console.width
        self._print(round_line(result, width))
        refused_sites = sorted(result.refused)
        for site in refused_sites[:SHOWN_SITES]:
            reason = Text.from_markup(f"[yellow]{escape(site)}[/] ") + Text(result.refusal(site))
            self._progress.console.print(Padding(reason, (0, 0, 0, INDENT)), highlight=False)
        if len(refused_sites) > SHOWN_SITES:
            self._print(" " * INDENT + f"[yellow]and {len(refused_sites) - SHOWN_SITES} more[/]")
        left_out = sorted(result.excluded)
        for site in left_out[:SHOWN_SITES]:  # replies the coordinator did not take (a lying or broken site)
            why = Text.from_markup(f"[red]{escape(site)}[/] reply left out: ") + Text(result.excluded[site])
            self._progress.console.print(Padding(why, (0, 0, 0, INDENT)), highlight=False)
        if len(left_out) > SHOWN_SITES:
            self._print(" " * INDENT + f"[red]and {len(left_out) - SHOWN_SITES} more replies left out[/]")
        if result.privacy and len(result.privacy) <= SHOWN_SITES:
            items = [_epsilon(site, p) for site, p in result.privacy.items()]
            for line in packed_lines(["ε", *items], width):
                self._print(line)
        elif result.privacy:
            self._print(" " * INDENT + _epsilon_spread(result.privacy))
        if self._task is not None:
            self._progress.update(self._task, advance=1, status=f"acc {result.accuracy:.3f}")


def _epsilon_spread(privacy: dict[str, dict[str, Any]]) -> str:
    """ε spent over many sites: least, median and most, and how many stopped."""
    spent = sorted(p["epsilon_spent"] for p in privacy.values())
    stopped = sum(1 for p in privacy.values() if p["status"] != PrivacyStatus.ACTIVE)
    line = f"ε spent {spent[0]:.2f} / {spent[len(spent) // 2]:.2f} / {spent[-1]:.2f} (least / median / most)"
    return line + (f"  [yellow]{stopped} site(s) stopped[/]" if stopped else "")


def _epsilon(site: str, privacy: dict[str, Any]) -> str:
    status = privacy["status"]
    colour = STATUS_COLOURS.get(status, "white")
    mark = "" if status == PrivacyStatus.ACTIVE else f" [{colour}]{status}[/]"
    return f"{escape(site)} [{colour}]{privacy['epsilon_spent']:.2f}[/]/{privacy['epsilon_budget']:g}{mark}"


def results_table(summary: dict[str, object]) -> Table:
    """Final comparison: federated vs centrally trained."""
    table = Table(title="Result", show_header=True, box=box.SIMPLE_HEAD)
    table.add_column("model")
    table.add_column("test accuracy", justify="right")
    table.add_row("federated (fedshard)", f"{summary['final_accuracy'] or float('nan'):.4f}")
    table.add_row("central baseline (all data pooled)", f"{summary['centralized_accuracy']:.4f}")
    return table


def zones_table(summary: dict[str, object]) -> Table:
    """Where the shards went: each zone's pushes, shards by class and origin (one per line),
    partial sums forwarded, refusals; 80 columns wide at most for a handful of classes."""
    zones = summary.get("zones")
    reducing = isinstance(zones, list) and any(z.get("reducing") for z in zones)
    table = Table(
        title="Zones: shards received by class and origin",
        caption="* the reducing zone; fwd: partial sums forwarded to it" if reducing else None,
        show_header=True,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for column in ("zone", "region", "pushes", "MB in", "shards by class", "fwd", "refused"):
        numeric = column in ("pushes", "MB in", "fwd", "refused")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=column != "shards by class")
    for z in zones if isinstance(zones, list) else []:
        classes = "\n".join(f"{k.replace(' from ', ' ')} {v}" for k, v in z.get("shards_by_class", {}).items())
        table.add_row(
            f"{z.get('name')}{'*' if z.get('reducing') else ''}",
            str(z.get("region")),
            str(z.get("pushes", 0)),
            f"{z.get('bytes_received', 0) / 1e6:.2f}",
            classes or "-",
            str(z.get("forwarded_shards", 0) or "-"),
            str(z.get("refused", 0)),
        )
    return table
