"""``fedshard tune``: choose among candidate settings on a private validation split (:mod:`fedshard.tuning`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from fedshard.cli._folders import fresh_run_dir

if TYPE_CHECKING:
    from fedshard.tuning import CandidateResult

__all__ = ["tune_command"]

console = Console()

_NOISY_ABOVE = 0.02
_NOISY = (
    ": more than settings usually differ by, so the choice will be close to chance. Its sites hold too few "
    "validation records for a private choice (more records, a larger selection_share or fewer candidates "
    'narrow it); fedshard\'s defaults need no tuning (README, "Privacy budgets")'
)


def tune_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="Federation YAML with record-level DP on")],
    candidates: Annotated[
        Path, typer.Option("--candidates", help="The candidates' YAML, e.g. configs/tune-dp-he.yaml")
    ],
    out: Annotated[Path | None, typer.Option("--out", help="A new folder (default: a fresh one under runs/)")] = None,
) -> None:
    """Run each candidate as a federation and choose one by noisy validation scores, charged to every budget."""
    from fedshard.config import load_federation
    from fedshard.config.loader import load_model
    from fedshard.config.tuning import TuningConfig
    from fedshard.run_folder.tune_folder import TUNE_FILE
    from fedshard.tuning import tune

    base = load_federation(config)
    tuning = load_model(TuningConfig, candidates)
    folder = out or fresh_run_dir("tune-")

    def shown(result: CandidateResult) -> None:
        what = (
            f"stopped: {result.stopped}"
            if result.score is None
            else f"noisy validation accuracy {result.score:.1%} ± {result.score_std or 0:.1%}"
        )
        console.print(f"  {result.name}: {result.rounds} rounds, {what}", highlight=False, soft_wrap=True)

    def planned(noise: float) -> None:
        console.print(
            f"[bold]fedshard tune[/] [cyan]{base.federation.name}[/]: {len(tuning.candidates)} candidates, "
            f"{tuning.validation_fraction:.0%} of every site's training records held out, "
            f"scores as noisy as {tuning.selection_share:.0%} of every budget alone would make them",
            highlight=False,
        )
        console.print(
            f"  every candidate's score will carry noise of ± {noise:.1%} (standard deviation)"
            + (_NOISY if noise > _NOISY_ABOVE else ""),
            highlight=False,
            soft_wrap=True,
        )

    summary = tune(base, tuning, folder, on_start=planned, on_candidate=shown)
    console.print(_table(summary))
    console.print(_budgets(summary))
    if summary["chosen"] is None:
        console.print("no candidate finished its run: nothing was chosen", highlight=False)
    else:
        console.print(
            f"chosen: {summary['chosen']}; its federation's model is in {summary['chosen_run']} "
            "(score it on your test data once; running its settings again spends a new budget)",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"summary: {folder / TUNE_FILE}", highlight=False, soft_wrap=True)


def _table(summary: dict[str, Any]) -> Table:
    table = Table(title="candidates (scores: noisy validation accuracy, the noise's standard deviation)")
    for column in ("candidate", "settings", "rounds", "σ", "score", "±"):
        table.add_column(column)
    for c in summary["candidates"]:
        settings = ", ".join(f"{k}={v}" for k, v in c["settings"].items()) or "(the config's)"
        chosen = " ✓" if c["name"] == summary["chosen"] else ""
        score = "-" if c["noisy_validation_accuracy"] is None else f"{c['noisy_validation_accuracy']:.1%}"
        noise = "-" if c["noise_std"] is None else f"{c['noise_std']:.1%}"
        sigma = "-" if c["sigma"] is None else f"{c['sigma']:.3g}"
        table.add_row(c["name"] + chosen, settings, str(c["rounds"]), sigma, score, noise)
    return table


def _budgets(summary: dict[str, Any]) -> Table:
    table = Table(title="every site's tuning ledger: candidates' training and scores together")
    for column in ("site", "ε spent", "ε budget", "δ"):
        table.add_column(column)
    for site, spent in summary["sites"].items():
        table.add_row(site, f"{spent['epsilon_spent']:.3f}", f"{spent['epsilon_budget']:g}", f"{spent['delta']:g}")
    return table
