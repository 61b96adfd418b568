"""``fedshard route explain``: where each shard of a site goes, and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["route_app"]

route_app = typer.Typer(no_args_is_help=True, help="Residency routing: which zone each shard goes to.")
console = Console()


@route_app.command("explain")
def explain(
    config: Annotated[Path, typer.Option("--config", "-c", help="Federation YAML")],
    site: Annotated[str, typer.Option("--site", help="Site id")],
    tensor: Annotated[str | None, typer.Option("--tensor", help="Only this tensor's shards")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
) -> None:
    """Per shard: class, the reason for it, regions the policy allows, the zone it is
    pushed to, and the aggregate it ends up in (global, or a regional group)."""
    from fedshard.assembly.routing import explain_routes
    from fedshard.config import load_federation

    cfg = load_federation(config)
    decisions = explain_routes(cfg, site, tensor)
    if as_json:
        print(json.dumps([d.to_dict() for d in decisions], indent=2))
        return
    jurisdiction = cfg.site(site).jurisdiction
    table = Table(title=f"routes of {site} (jurisdiction {jurisdiction})")
    for column in ("shard", "class", "reason", "allowed regions", "zone", "aggregated in"):
        table.add_column(column, overflow="fold")  # an identifier wraps at 80 columns, never cut
    for d in decisions:
        final, group = d.aggregate
        table.add_row(d.shard_id, d.shard_class, d.reason, ", ".join(d.allowed_regions), d.zone, f"{final} ({group})")
    console.print(table)
