"""Rich progress display for a running federation."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedshard.coordinator.results import RoundResult
from fedshard.protocol.messages import PrivacyStatus, SiteInfo

__all__ = ["SHOWN_SITES", "STATUS_COLOURS", "RoundProgress", "format_bytes", "results_table", "zones_table"]

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


class RoundProgress:
    """A :class:`~fedshard.coordinator.results.RoundObserver` that shows a progress bar
    and one line per finished round (accuracy, loss, bytes sent)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._progress = Progress(
            TextColumn("[bold]rounds"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> RoundProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def on_start(self, sites: list[SiteInfo], rounds: int, genesis_version: str) -> None:
        """Show the assembled federation and start the bar."""
        if len(sites) <= SHOWN_SITES:
            names = ", ".join(f"{s.site_id} ({s.jurisdiction}, {s.num_examples} ex.)" for s in sites)
        else:  # thousands of sites: how many per jurisdiction
            counts: dict[str, int] = {}
            for s in sites:
                counts[s.jurisdiction] = counts.get(s.jurisdiction, 0) + 1
            names = ", ".join(f"{n} in {j}" for j, n in sorted(counts.items()))
        self._progress.console.print(f"[bold]{len(sites)} sites[/]: {names}")
        self._task = self._progress.add_task("rounds", total=rounds, status="training…")

    def on_round(self, result: RoundResult) -> None:
        """Print the round's line and advance the bar."""
        refused = f"  [yellow]{len(result.refused)} refused[/]" if result.refused else ""
        self._progress.console.print(
            f"round {result.round:>3}  accuracy [bold]{result.accuracy:.4f}[/]  loss {result.loss:.4f}  "
            f"train loss {result.train_loss:.4f}  sent {format_bytes(result.bytes_up)}  "
            f"sites {len(result.sites)}{refused}  version {result.version[:12]}"
        )
        refused_sites = sorted(result.refused)
        for site in refused_sites[:SHOWN_SITES]:
            self._progress.console.print(f"          [yellow]{escape(site)}[/] {escape(result.refusal(site))}")
        if len(refused_sites) > SHOWN_SITES:
            self._progress.console.print(f"          [yellow]and {len(refused_sites) - SHOWN_SITES} more[/]")
        if result.privacy and len(result.privacy) <= SHOWN_SITES:
            self._progress.console.print(
                "          ε " + "  ".join(_epsilon(site, p) for site, p in result.privacy.items())
            )
        elif result.privacy:
            self._progress.console.print("          " + _epsilon_spread(result.privacy))
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
    return f"{site} [{colour}]{privacy['epsilon_spent']:.2f}[/]/{privacy['epsilon_budget']:g}{mark}"


def results_table(summary: dict[str, object]) -> Table:
    """Final comparison: federated vs centrally trained."""
    table = Table(title="Result", show_header=True)
    table.add_column("model")
    table.add_column("test accuracy", justify="right")
    table.add_row("federated (fedshard)", f"{summary['final_accuracy'] or float('nan'):.4f}")
    table.add_row("central baseline (all data pooled)", f"{summary['centralized_accuracy']:.4f}")
    return table


def zones_table(summary: dict[str, object]) -> Table:
    """Where the shards went: each zone's pushes, classes held, partial sums forwarded, refusals."""
    table = Table(title="Zones: shards received by class and origin", show_header=True)
    for column in ("zone", "region", "pushes", "received", "shards by class", "forwarded", "refused"):
        table.add_column(
            column, justify="right" if column in ("pushes", "received", "forwarded", "refused") else "left"
        )
    zones = summary.get("zones")
    for z in zones if isinstance(zones, list) else []:
        classes = ", ".join(f"{k} {v}" for k, v in z.get("shards_by_class", {}).items()) or "-"
        role = " (reducing)" if z.get("reducing") else ""
        forwarded = f"{z.get('forwarded_shards', 0)} shards" if z.get("forwarded_shards") else "-"
        table.add_row(
            f"{z.get('name')}{role}",
            str(z.get("region")),
            str(z.get("pushes", 0)),
            f"{z.get('bytes_received', 0) / 1e6:.2f} MB",
            classes,
            forwarded,
            str(z.get("refused", 0)),
        )
    return table
