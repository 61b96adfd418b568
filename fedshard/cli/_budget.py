"""``fedshard budget show`` and ``recover``: what each site has spent of its privacy budget,
and a new ledger for a site whose ledger was lost, rolled back or edited."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fedshard.errors import ConfigError, DeployError, FedshardError

if TYPE_CHECKING:
    from fedshard.site.privacy import SitePrivacy

__all__ = ["budget_app", "ledger_summary", "recover_ledger", "reported_summary"]

budget_app = typer.Typer(no_args_is_help=True, help="Privacy budgets: what each site has spent.")
console = Console()


def _site_privacy(site_config: Path, key_file: Path | None) -> SitePrivacy:
    """The site's privacy bookkeeping as the site assembles it: its ledger key (from
    ``key_file`` or its key bundle's store.kek) and where its ledger is anchored."""
    from fedshard.assembly import LEDGER_ANCHOR_FILE
    from fedshard.config import load_site
    from fedshard.config.layout import SiteBundle
    from fedshard.crypto.at_rest import load_kek
    from fedshard.site.ledger_anchor import AnchorStore, CatalogAnchor, FileAnchor
    from fedshard.site.privacy import SitePrivacy, ledger_key
    from fedshard.site.terms import PrivacyTerms

    local = load_site(site_config)
    site = local.site
    terms = PrivacyTerms(budget=site.cap)  # what recovery and `show` read: the site's own cap
    if key_file is None and local.deployment is not None:
        key_file = SiteBundle(local.deployment.keys).store_kek
    if key_file is None:
        return SitePrivacy(site.id, site.state_dir, terms)
    kek = load_kek(key_file)
    key = ledger_key(kek)
    anchor: AnchorStore
    if (site.state_dir / "shards" / "catalog").exists():
        anchor = CatalogAnchor(site.state_dir / "shards", kek)
    elif key_file.with_suffix(".ledger-anchor").exists():  # a simulated site without store encryption
        anchor = FileAnchor(key_file.with_suffix(".ledger-anchor"), key)
    else:
        anchor = FileAnchor(site.state_dir / LEDGER_ANCHOR_FILE, key)
    return SitePrivacy(site.id, site.state_dir, terms, key=key, anchor=anchor)


def ledger_summary(site_config: Path, key_file: Path | None = None) -> dict[str, Any]:
    """A site's budget, read from its own ledger (the authoritative record)."""
    from fedshard.config import load_site
    from fedshard.privacy.events import Guarantee
    from fedshard.privacy.ledger import Budget, PrivacyLedger
    from fedshard.protocol.messages import PrivacyStatus

    site = load_site(site_config).site
    privacy = _site_privacy(site_config, key_file)
    cap = Budget(site.cap.epsilon, site.cap.delta) if site.cap is not None else None
    with PrivacyLedger(privacy.ledger_path, cap if privacy.key is None else None, key=privacy.key) as ledger:
        entries = ledger.entries()
        last_round = max((e.round for e in entries), default=None)
        next_round = [e.event for e in entries if e.round == last_round]
        status = ledger.status(next_round)
    spent = status.spent
    binding = Guarantee.RECORD if Guarantee.RECORD in spent else Guarantee.UPDATE
    note = ""
    if cap is not None and spent.get(binding, 0.0) > cap.epsilon:
        note = (
            f"the site's cap (ε {cap.epsilon:g}) is below what its ledger records as spent "
            f"(ε {spent.get(binding, 0.0):.2f}): it releases nothing more"
        )
    return {
        "note": note,
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


def _latest_run(name: str, state_dir: Path | None = None) -> Path:
    """The newest run of federation ``name``: under a deployment's ``state_dir`` (``run-*``), else under ``runs/``."""
    import yaml

    found = [
        *(state_dir.glob("run-*/summary.json") if state_dir is not None else []),
        *Path("runs").glob("*/summary.json"),
    ]
    runs = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    for summary in runs:
        config = summary.parent / "federation.yaml"
        try:
            ran = yaml.safe_load(config.read_text()) if config.exists() else None
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not a run of this federation as far as anyone can tell; another may be
        if isinstance(ran, dict) and isinstance(ran.get("federation"), dict) and ran["federation"].get("name") == name:
            return summary.parent
    raise FedshardError(f"no run of federation {name!r} under runs/; pass --run DIR (the folder holding summary.json)")


def reported_summary(config: Path, run: Path | None) -> list[dict[str, Any]]:
    """Every site's budget as it last reported it to the aggregator in a run."""
    from fedshard.config import load_federation

    cfg = load_federation(config)
    run_dir = run or _latest_run(cfg.federation.name, cfg.deployment.state_dir if cfg.deployment else None)
    path = run_dir / "summary.json"
    if not path.exists():
        raise FedshardError(f"{run_dir} holds no summary.json; is it a run folder?")
    sites = _summary_sites(path)
    if not any("epsilon_budget" in s for s in sites):
        raise ConfigError(f"{config}: the run in {run_dir} had no differential privacy on, so no budget to show")
    for s in sites:
        if "epsilon_budget" in s:
            s["epsilon_remaining"] = max(s["epsilon_budget"] - s["epsilon_spent"], 0.0)
    return sites


def _summary_sites(path: Path) -> list[dict[str, Any]]:
    """The ``sites`` of a run's ``summary.json``; a file that is not one is a one-line error."""
    try:
        sites = json.loads(path.read_text())["sites"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path} is not a run summary fedshard can read ({exc}); pass --run DIR of another run"
        ) from None
    if not isinstance(sites, list) or not all(isinstance(s, dict) and {"id", "jurisdiction"} <= set(s) for s in sites):
        raise ConfigError(
            f"{path}: `sites` is not a list of sites (id, jurisdiction, ...); pass --run DIR of another run"
        )
    return sites


def _table(sites: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("site", "jurisdiction", "ε budget", "δ", "ε spent", "ε left", "rounds", "rounds left", "status"):
        table.add_column(
            column, justify="left" if column in ("site", "jurisdiction", "status") else "right", overflow="fold"
        )  # at 80 columns a site id or status wraps, never cut
    from fedshard.cli._progress import STATUS_COLOURS
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


def recover_ledger(site_config: Path, key_file: Path | None = None) -> str:
    """Start a new ledger for the site that carries its anchored spend forward (see
    :meth:`fedshard.site.privacy.SitePrivacy.recover`); one line saying what was done.

    Holds the site's ``site up`` lock while it works (:mod:`fedshard.deploy.host_lock`): a running
    site may be reserving or committing a spend in the very ledger being moved aside, so recovery
    is refused, in one line and touching nothing, while ``site up`` runs, and ``site up`` cannot
    start until recovery ends."""
    from fedshard.deploy.host_lock import SITE_LOCK_FILE, holding
    from fedshard.deploy.site_status import read_site_state

    privacy = _site_privacy(site_config, key_file)
    if privacy.key is None:
        raise ConfigError(
            f"{site_config}: no key to authenticate the ledger with; pass --key-file (the site's store.kek) "
            "or use a site config with a deployment section"
        )
    state_dir = privacy.state_dir
    if not state_dir.is_dir():
        raise ConfigError(f"{site_config}: the site's state folder {state_dir} does not exist; nothing to recover")
    running = read_site_state(state_dir)
    try:
        with holding(state_dir, running.pid if running else None, lock_file=SITE_LOCK_FILE):
            return privacy.recover()
    except DeployError as exc:
        raise DeployError(f"stop the site before recovering its ledger: {exc}") from None


@budget_app.command("recover")
def recover(
    site_config: Annotated[Path, typer.Option("--site-config", help="The site's own config")],
    key_file: Annotated[
        Path | None, typer.Option("--key-file", help="The site's store key (default: its key bundle's store.kek)")
    ] = None,
) -> None:
    """Replace a missing, rolled-back or edited ledger by one that carries the anchored ε forward.

    The old file is moved aside, never deleted; ε spent never goes down.
    """
    console.print(recover_ledger(site_config, key_file))


@budget_app.command("show")
def show(
    site_config: Annotated[
        Path | None, typer.Option("--site-config", help="A site's own config: read its ledger")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="A federation config: every site, as last reported")
    ] = None,
    run: Annotated[Path | None, typer.Option("--run", help="Run folder (default: the latest run)")] = None,
    key_file: Annotated[
        Path | None,
        typer.Option("--key-file", help="With --site-config: the site's store key (default: its bundle's store.kek)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
) -> None:
    """Budget, ε spent and left, rounds taken part in, projected rounds left, per site."""
    if (site_config is None) == (config is None):
        raise ConfigError("give exactly one of --site-config FILE (a site's ledger) or --config FILE (a federation)")
    if site_config is not None:
        sites = [ledger_summary(site_config, key_file)]
        title = f"privacy ledger of {sites[0]['id']}"
    else:
        assert config is not None
        sites = reported_summary(config, run)
        title = "privacy budgets as last reported by each site"
    if as_json:
        print(json.dumps(sites if config is not None else sites[0], indent=2))
    else:
        console.print(_table(sites, title))
        for site in sites:
            if site.get("note"):
                console.print(f"[yellow]{escape(str(site['id']))}: {escape(str(site['note']))}[/]")
