"""The aggregator's status: what ``aggregator up`` shows live and ``aggregator status`` prints once.

``aggregator up`` keeps ``<state_dir>/status.json`` current (its processes, the run, the
sites the SuperLink sees); the rounds and each site's ε come from the run's event log.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table

from fedshard.config import FederationConfig
from fedshard.errors import DeployError
from fedshard.transports.flower.host_watch import pid_alive

if TYPE_CHECKING:
    from fedshard.crypto.tls import TlsFiles

__all__ = [
    "ENDED",
    "STATUS_FILE",
    "HostState",
    "deployed_run_state",
    "read_state",
    "render_status",
    "write_state",
    "zone_details",
]

STATUS_FILE = "status.json"


@dataclass
class HostState:
    """What ``aggregator up`` records about itself in ``status.json``."""

    phase: str = "starting"  # starting, waiting for sites, running, finished, stopped, failed
    pid: int = field(default_factory=os.getpid)
    superlink: str = ""
    superlink_pid: int | None = None
    zones: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> endpoint, pid, log
    run_id: str | None = None
    run_dir: str | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # node id -> site id (registered keys)
    online: list[str] = field(default_factory=list)  # node ids online at the last check
    checked_at: float = 0.0
    message: str = ""
    metrics: str = ""  # where the run's metrics are served ("": not)


def write_state(state_dir: Path, state: HostState) -> None:
    """Replace ``status.json`` atomically."""
    tmp = state_dir / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(tmp, state_dir / STATUS_FILE)


def read_state(state_dir: Path) -> HostState:
    """The last recorded state; :class:`DeployError` if the aggregator never ran here."""
    path = state_dir / STATUS_FILE
    try:
        return HostState(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise DeployError(f"no aggregator has run with state folder {state_dir} (no {STATUS_FILE})") from None
    except (OSError, ValueError, TypeError) as exc:
        raise DeployError(f"{path} is unreadable ({exc}); start the aggregator again") from None


def deployed_run_state(run_dir: Path) -> str | None:
    """What the aggregator host says of ``run_dir``, a run without a summary: running (its
    aggregator holds the state folder's lock), or its aggregator died; None when ``run_dir``
    is not a deployed run (no ``status.json`` beside it)."""
    from fedshard.deploy.host_lock import is_held

    host = run_dir.parent
    if not (host / STATUS_FILE).exists():
        return None
    try:
        current = read_state(host).run_dir == str(run_dir)
    except DeployError:
        current = False
    if not current:
        return "no summary (it died; the host has run another since)"
    if is_held(host):
        return "running"
    return "no summary: its aggregator died (`aggregator up --resume` goes on)"


def _events(run_dir: str | None) -> list[dict[str, Any]]:
    if not run_dir:
        return []
    from fedshard.coordinator.events import EventLog

    with contextlib.suppress(OSError, ValueError):
        return EventLog(Path(run_dir) / "events.jsonl").read()[0]
    return []


ENDED = ("finished", "stopped", "failed")
"""The phases an aggregator records as it ends; any other phase of one that no longer runs means it died."""


def render_status(config: FederationConfig, state: HostState, running: bool | None = None) -> RenderableType:
    """Sites connected, round, ε per site and zones, as a rich renderable. ``running``: whether
    the aggregator runs (:func:`fedshard.deploy.host_lock.is_held`); None: its recorded pid is alive."""
    from fedshard.coordinator.events import EventKind

    events = _events(state.run_dir)
    rounds = [e for e in events if e["event"] == EventKind.ROUND]
    privacy: dict[str, dict[str, Any]] = rounds[-1].get("privacy", {}) if rounds else {}
    if not privacy:
        starts = [e for e in events if e["event"] == EventKind.START]
        for site in starts[-1]["sites"] if starts else []:
            if site.get("privacy"):
                privacy[site["site_id"]] = site["privacy"]
    running = pid_alive(state.pid) if running is None else running
    phase = state.phase if running or state.phase in ENDED else f"[red]died[/] while {state.phase}"
    site_of_node = state.nodes
    online_sites = {site_of_node.get(n, n) for n in state.online}
    age = f", checked {time.time() - state.checked_at:.0f}s ago" if state.checked_at else ""
    head = f"[bold]{config.federation.name}[/]  aggregator [cyan]{phase}[/]"
    head += f"  round {len(rounds)}/{config.federation.rounds}"
    if rounds:
        head += f"  accuracy {rounds[-1]['accuracy']:.4f}"
    head += f"\nSuperLink {state.superlink}  run {state.run_id or '-'}"
    if state.metrics:
        head += f"\nmetrics {state.metrics} (this host's zones: the ports after it)"
    sites = Table(title=f"Sites ({len(online_sites & {s.id for s in config.sites})} connected{age})")
    for column in ("site", "jurisdiction", "connected", "ε spent / budget", "status"):
        sites.add_column(column)
    for s in config.sites:
        p = privacy.get(s.id)
        eps = f"{p['epsilon_spent']:.2f} / {p['epsilon_budget']:g}" if p else "-"
        sites.add_row(
            s.id,
            s.jurisdiction,
            "[green]yes[/]" if s.id in online_sites else "[red]no[/]",
            eps,
            str(p["status"]) if p else "-",
        )
    zones = Table(title="Zones on this host")
    for column in ("zone", "region", "endpoint", "process"):
        zones.add_column(column)
    regions = {z.name: z.region for z in config.zones}
    for name, z in state.zones.items():
        zones.add_row(name, regions.get(name, "?"), str(z.get("endpoint")), "up" if pid_alive(z.get("pid")) else "down")
    parts: list[RenderableType] = [head, sites, zones]
    if state.message:
        parts.append(state.message)
    return Group(*parts)


def zone_details(zones: dict[str, dict[str, Any]], tls: TlsFiles | None) -> list[dict[str, Any]]:
    """Each zone's counters, residency role and audit head as it reports them over ``Info``
    (``zones``: name → ``{"endpoint": …}``, as :attr:`HostState.zones` has them); a zone that does not
    answer is an entry with its ``error``."""
    from fedshard.zone.rpc.client import GrpcZoneClient

    out = []
    for name, zone in zones.items():
        try:
            with GrpcZoneClient(zone["endpoint"], timeout=10, tls=tls) as client:
                out.append({"endpoint": zone["endpoint"], **client.details()})
        except Exception as exc:
            out.append({"name": name, "endpoint": zone["endpoint"], "error": str(exc)})
    return out
