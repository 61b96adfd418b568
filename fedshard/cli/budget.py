"""``fedshard budget show``: what each site has spent of its privacy budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from fedshard.errors import ConfigError, FedshardError

__all__ = ["budget_app", "ledger_summary", "reported_summary"]

budget_app = typer.Typer(no_args_is_help=True, help="Privacy budgets: what each site has spent.")
console = Console()


def ledger_summary(site_config: Path) -> dict[str, Any]:
    """A site's budget, read from its own ledger (the authoritative record)."""
    from fedshard.config import load_site
    from fedshard.privacy.events import Guarantee
    from fedshard.privacy.ledger import Budget, PrivacyLedger
    from fedshard.protocol.messages import PrivacyStatus
    from fedshard.site.privacy import LEDGER_FILE

    site = load_site(site_config).site
    cap = Budget(site.cap.epsilon, site.cap.delta) if site.cap is not None else None
    with PrivacyLedger(site.state_dir / LEDGER_FILE, cap) as ledger:
        entries = ledger.entries()
        last_round = max((e.round for e in entries), default=None)
        next_round = [e.event for e in entries if e.round == last_round]
        status = ledger.status(next_round)
    spent = status.spent
    binding = Guarantee.RECORD if Guarantee.RECORD in spent else Guarantee.UPDATE
    return {
        "id": site.id,
        "jurisdiction": site.jurisdiction,
        "epsilon_budget": status.budget.epsilon,
        "delta": status.budget.delta,
        "epsilon_spent": spent.get(binding, 0.0),
        "epsilon_record": spent.get(Guarantee.RECORD, 0.0),
        "epsilon_update": spent.get(Guarantee.UPDATE, 0.0),
        "epsilon_remaining": max(status.budget.epsilon - spent.get(binding, 0.0), 0.0),
        "rounds_participated": status.rounds_participated,
        "pending_rounds": list(status.pending),
        "projected_rounds_left": status.projected_rounds_left,
        "status": (PrivacyStatus.ACTIVE if status.can_afford_next or not next_round else PrivacyStatus.EXHAUSTED).value,
    }


def _latest_run(name: str) -> Path:
    import yaml

    runs = sorted((p for p in Path("runs").glob("*/summary.json")), key=lambda p: p.stat().st_mtime, reverse=True)
    for summary in runs:
        config = summary.parent / "federation.yaml"
        if config.exists() and (yaml.safe_load(config.read_text()) or {}).get("federation", {}).get("name") == name:
            return summary.parent
    raise FedshardError(f"no run of federation {name!r} under runs/; pass --run DIR (the folder holding summary.json)")


def reported_summary(config: Path, run: Path | None) -> list[dict[str, Any]]:
    """Every site's budget as it last reported it to the aggregator in a run."""
    from fedshard.config import load_federation

    cfg = load_federation(config)
    run_dir = run or _latest_run(cfg.federation.name)
    path = run_dir / "summary.json"
    if not path.exists():
        raise FedshardError(f"{run_dir} holds no summary.json; is it a run folder?")
    sites: list[dict[str, Any]] = json.loads(path.read_text())["sites"]
    if not any("epsilon_budget" in s for s in sites):
        raise ConfigError(f"{config}: the run in {run_dir} had no differential privacy on, so no budget to show")
    for s in sites:
        if "epsilon_budget" in s:
            s["epsilon_remaining"] = max(s["epsilon_budget"] - s["epsilon_spent"], 0.0)
    return sites


def _table(sites: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("site", "jurisdiction", "ε budget", "δ", "ε spent", "ε left", "rounds", "rounds left", "status"):
        table.add_column(column, justify="left" if column in ("site", "jurisdiction", "status") else "right")
    from fedshard.cli.progress import STATUS_COLOURS
    from fedshard.protocol.messages import PrivacyStatus

    for s in sites:
        if "epsilon_budget" not in s:
            table.add_row(s["id"], s["jurisdiction"], "—", "—", "—", "—", "—", "—", "no DP report")
            continue
        left = s.get("projected_rounds_left")
        status = s.get("status", PrivacyStatus.ACTIVE.value)
        table.add_row(
            s["id"],
            s["jurisdiction"],
            f"{s['epsilon_budget']:g}",
            f"{s['delta']:g}",
            f"{s['epsilon_spent']:.3f}",
            f"{s['epsilon_remaining']:.3f}",
            str(s["rounds_participated"]),
            "—" if left is None else str(left),
            f"[{STATUS_COLOURS.get(status, 'white')}]{status}[/]",
        )
    return table


@budget_app.command("show")
def show(
    site_config: Annotated[
        Path | None, typer.Option("--site-config", help="A site's own config: read its ledger")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="A federation config: every site, as last reported")
    ] = None,
    run: Annotated[Path | None, typer.Option("--run", help="Run folder (default: the latest run)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
) -> None:
    """Budget, ε spent and left, rounds taken part in, projected rounds left, per site."""
    if (site_config is None) == (config is None):
        raise ConfigError("give exactly one of --site-config FILE (a site's ledger) or --config FILE (a federation)")
    if site_config is not None:
        sites = [ledger_summary(site_config)]
        title = f"privacy ledger of {sites[0]['id']}"
    else:
        assert config is not None
        sites = reported_summary(config, run)
        title = "privacy budgets as last reported by each site"
    if as_json:
        print(json.dumps(sites if config is not None else sites[0], indent=2))
    else:
        console.print(_table(sites, title))
