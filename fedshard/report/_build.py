"""Build a run's report: its plots as PNGs and one HTML page showing them with the run's
tables (sites, zones, refusals), referencing only the files written beside it.

The page is a jinja2 template (``page.html.j2``) filled with the run's tables. Names and
reasons in a run's records may come from sites (a refusal's reason, the ids a lying site
claimed): the template escapes every one (autoescape), and the plots never interpret text
(matplotlib's mathtext and TeX are off while they are drawn), so ``$…$`` is drawn as it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedshard.errors import ConfigError
from fedshard.report._flow import flows, residency_flow
from fedshard.report._plots import PLOTS
from fedshard.report._run import RunRecord, load_run

__all__ = ["REPORT_FILE", "Report", "build_report"]

REPORT_FILE = "report.html"
PAGE_TEMPLATE = "page.html.j2"
FLOW_PLOT = ("residency.png", "Residency: which zones received each class of shard from where, and what they published")
MAX_REFUSAL_ROWS = 200

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } img { max-width: 100%; } figcaption { color: #555; font-size: 0.9em; }
.ok { color: #2ca02c; } .warn { color: #d62728; } code { font-size: 0.9em; }
"""


@dataclass(frozen=True)
class Report:
    """What :func:`build_report` wrote."""

    html: Path
    images: list[Path]
    skipped: list[str] = field(default_factory=list)  # what was left out as malformed (RunRecord.skipped)


def build_report(run_dir: str | Path, out: str | Path | None = None) -> Report:
    """Write the report of the run in ``run_dir`` to ``out`` (default: ``run_dir/report``).

    Raises
    ------
    ConfigError
        ``run_dir`` holds no run (see :func:`~fedshard.report._run.load_run`), or ``out``
        cannot be written.
    """
    run = load_run(run_dir)
    target = Path(out) if out is not None else run.folder / "report"
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {target}: cannot create it ({exc.strerror or exc}); choose another --out") from None
    from matplotlib import rc_context

    with rc_context({"text.parse_math": False, "text.usetex": False}):  # text from a run is drawn as it is
        images = [draw(run, target / name) for name, _, draw in PLOTS]
        images.append(residency_flow(run, target / FLOW_PLOT[0]))
    page = target / REPORT_FILE
    page.write_text(_page(run), encoding="utf-8")
    return Report(page, images, list(run.skipped))


@dataclass(frozen=True)
class _Table:
    header: list[str]
    rows: list[list[Any]]


@dataclass(frozen=True)
class _Block:
    """A paragraph, and the table or list under it."""

    text: str
    table: _Table | None = None
    items: list[str] = field(default_factory=list)
    more: int = 0  # rows left out of the table
    css: str = ""


def _page(run: RunRecord) -> str:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=PackageLoader("fedshard.report", "."),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    figures = {name: {"name": name, "caption": caption} for name, caption, _ in PLOTS}
    figures[FLOW_PLOT[0]] = {"name": FLOW_PLOT[0], "caption": FLOW_PLOT[1]}
    return env.get_template(PAGE_TEMPLATE).render(
        name=run.name,
        style=_STYLE,
        when=_when(run),
        overview=_overview(run),
        changes=_changes(run),
        figures=figures,
        sites=_sites_table(run),
        residency=[(line, home) for _, line, home in flows(run).residency_lines()],
        zones=_zones_table(run),
        refusals=_refusals(run),
    )


def _stamp(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _when(run: RunRecord) -> str:
    """When the run started and how long it took, by its event log's clock."""
    started, last = run.result.started_at, run.result.last_at
    if started is None:
        return "The run's event log records no times (written before they were recorded)."
    took = f", {_duration(last - started)} to its latest event ({_stamp(last)})" if last is not None else ""
    return f"Started {_stamp(started)}{took}. Run folder: {run.folder}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(max(seconds, 0.0), 60)
    hours, minutes = divmod(int(minutes), 60)
    if hours:
        return f"{hours} h {minutes} min {secs:.0f} s"
    return f"{minutes} min {secs:.0f} s" if minutes else f"{secs:.1f} s"


def _overview(run: RunRecord) -> _Table:
    s, last = run.summary, (run.rounds[-1] if run.rounds else None)
    rows: list[list[Any]] = [
        ["started", _stamp(run.result.started_at)],
        ["latest event", _stamp(run.result.last_at)],
        ["rounds finished", len(run.rounds)],
        ["sites", len(run.result.sites)],
        ["final accuracy", f"{last.accuracy:.4f}" if last else "-"],
        ["central baseline", f"{run.central_accuracy:.4f}" if run.central_accuracy is not None else "-"],
        ["model version", run.result.version],
        ["engine", s.get("engine", "-")],
        ["elapsed", f"{s['elapsed_s']:.1f} s" if isinstance(s.get("elapsed_s"), int | float) else "-"],
        ["stopped", run.result.stopped_reason or ("completed" if s else "no summary yet (running, or it died)")],
    ]
    return _Table(["", ""], rows)


def _changes(run: RunRecord) -> _Block:
    """The changes taken during the run (zones added or drained, sites that joined)."""
    if not run.result.changes:
        return _Block("The federation did not change during the run.")
    rows = [[c["round"], c["change"] or "-", ", ".join(c["joined"]) or "-"] for c in run.result.changes]
    text = "Changes taken during the run (before the round named):"
    return _Block(text, _Table(["before round", "change", "sites that joined"], rows))


def _sites_table(run: RunRecord) -> _Table:
    privacy = run.result.privacy
    joined = {site: c["round"] for c in run.result.changes for site in c["joined"]}
    rows = []
    for site in run.result.sites:
        p = privacy.get(site.site_id, {})
        eps = f"{p['epsilon_spent']:.3f} / {p['epsilon_budget']:g}" if p else "-"
        delta = f"{p['delta']:g}" if p and "delta" in p else "-"
        status = p.get("status", "-") if p else "-"
        since = f"before round {joined[site.site_id]}" if site.site_id in joined else "start"
        rows.append([site.site_id, site.jurisdiction, site.num_examples, eps, delta, status, since])
    return _Table(["site", "jurisdiction", "records", "ε spent / budget", "δ", "privacy", "took part from"], rows)


def _zones_table(run: RunRecord) -> _Table | None:
    if not run.zones:
        return None
    rows = []
    for z in run.zones:
        classes = ", ".join(f"{k} {v}" for k, v in z.get("shards_by_class", {}).items()) or "-"
        rows.append(
            [
                z.get("name", "?") + (" (reducing)" if z.get("reducing") else ""),
                z.get("region", ""),
                z.get("pushes", 0),
                f"{z.get('bytes_received', 0) / 1e6:.2f} MB",
                classes,
                _forwarded(z),
                z.get("refused", 0),
            ]
        )
    header = ["zone", "region", "pushes", "received", "shards by class and origin", "forwarded", "refused"]
    return _Table(header, rows)


def _forwarded(zone: dict[str, Any]) -> str:
    n = zone.get("forwarded_shards", 0)
    by_class = zone.get("forwarded_by_class")
    if not n or not by_class:
        return str(n)
    return f"{n} partial sums of " + ", ".join(f"{k} {v}" for k, v in by_class.items())


def _refusals(run: RunRecord) -> list[_Block]:
    blocks: list[_Block] = []
    rows: list[list[Any]] = []
    for r in run.rounds:
        for site in sorted(r.refused):
            code = r.refusal_codes.get(site)
            rows.append([r.round, site, code.value if code is not None else "-", r.refused[site]])
    if rows:
        table = _Table(["round", "site", "code", "why"], rows[:MAX_REFUSAL_ROWS])
        blocks.append(_Block("Selected sites that did not contribute:", table, more=len(rows) - len(table.rows)))
    else:
        blocks.append(_Block("No selected site was refused.", css="ok"))
    left_out = [[r.round, site, r.excluded[site]] for r in run.rounds for site in sorted(r.excluded)]  # one per site
    if left_out:
        text = (
            "Replies the coordinator left out of a round's metrics (they disagreed with what it knows, "
            "or were out of bounds):"
        )
        table = _Table(["round", "site", "why"], left_out[:MAX_REFUSAL_ROWS])
        blocks.append(_Block(text, table, more=len(left_out) - len(table.rows)))
    if run.result.refused_nodes:
        nodes = [
            [n.get("node", "?"), n.get("site_id", "?"), n.get("code", "-"), n.get("reason", "")]
            for n in run.result.refused_nodes[:MAX_REFUSAL_ROWS]
        ]
        text = (
            "Nodes refused for the run (they could not prove which site they are, or claimed a site "
            "another node holds):"
        )
        blocks.append(_Block(text, _Table(["node", "claimed site", "code", "why"], nodes)))
    if run.result.aborted:
        aborted = [[a["round"], a["reason"]] for a in run.result.aborted]
        blocks.append(_Block("Rounds aborted at every zone:", _Table(["round", "why"], aborted)))
    zone_rows = [[z.get("name", "?"), reason] for z in run.zones for reason in z.get("refusals", [])]
    if zone_rows:
        blocks.append(_Block("What the zones refused (their latest reasons):", _Table(["zone", "why"], zone_rows)))
    if run.result.stopped_reason:
        blocks.append(_Block(f"The run stopped: {run.result.stopped_reason}", css="warn"))
    if run.skipped:
        notes = list(run.skipped[:MAX_REFUSAL_ROWS])
        blocks.append(_Block("Left out of this report as malformed:", items=notes, css="warn"))
    return blocks
