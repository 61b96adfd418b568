"""Build a run's report: its plots as PNGs and one HTML page showing them with the run's
tables (sites, zones, refusals), referencing only the files written beside it.

Names and reasons in a run's records may come from sites (a refusal's reason, the ids a
lying site claimed): the page escapes every one, and the plots never interpret text
(matplotlib's mathtext and TeX are off while they are drawn), so ``$…$`` is drawn as it is."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedshard.errors import ConfigError
from fedshard.report.flow import flows, residency_flow
from fedshard.report.plots import PLOTS
from fedshard.report.run import RunRecord, load_run

__all__ = ["REPORT_FILE", "Report", "build_report"]

REPORT_FILE = "report.html"
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
        ``run_dir`` holds no run (see :func:`~fedshard.report.run.load_run`), or ``out``
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


def _page(run: RunRecord) -> str:
    captions = {name: caption for name, caption, _ in PLOTS}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>fedshard run {_e(run.name)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>fedshard run <code>{_e(run.name)}</code></h1>",
        f"<p>{_e(_when(run))}</p>",
        _overview(run),
        _changes(run),
        "<h2>Learning</h2>",
        _figure("accuracy.png", captions["accuracy.png"]),
        "<h2>Privacy</h2>",
        _figure("privacy.png", captions["privacy.png"]),
        _sites_table(run),
        "<h2>Residency</h2>",
        _figure(*FLOW_PLOT),
        _residency_list(run),
        "<h2>Traffic</h2>",
        _figure("traffic.png", captions["traffic.png"]),
        _zones_table(run),
        "<h2>Time</h2>",
        _figure("round_times.png", captions["round_times.png"]),
        "<h2>Refusals</h2>",
        _refusals(run),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _figure(name: str, caption: str) -> str:
    return f'<figure><img src="{_e(name)}" alt="{_e(caption)}"><figcaption>{_e(caption)}</figcaption></figure>'


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{_e(c)}</td>' if _numeric(c) else f"<td>{_e(c)}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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


def _overview(run: RunRecord) -> str:
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
    return _table(["", ""], rows)


def _changes(run: RunRecord) -> str:
    """The changes taken during the run (zones added or drained, sites that joined)."""
    if not run.result.changes:
        return "<p>The federation did not change during the run.</p>"
    rows = [[c["round"], c["change"] or "-", ", ".join(c["joined"]) or "-"] for c in run.result.changes]
    return "<p>Changes taken during the run (before the round named):</p>" + _table(
        ["before round", "change", "sites that joined"], rows
    )


def _sites_table(run: RunRecord) -> str:
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
    return _table(["site", "jurisdiction", "records", "ε spent / budget", "δ", "privacy", "took part from"], rows)


def _residency_list(run: RunRecord) -> str:
    lines = flows(run).residency_lines()
    if not lines:
        return "<p>No zone reported shards by class.</p>"
    items = "".join(
        f'<li class="{"ok" if home else ""}">{"✓" if home else "→"} {_e(line)}</li>' for _, line, home in lines
    )
    return (
        "<p>Where each class of shard went, by the pushing site's jurisdiction: the regions whose zones "
        "received the raw (noised or encrypted) shards, and where partial sums containing them were "
        "reduced (a partial sum adds up every shard of one kind a zone received in a round):</p>"
        f"<ul>{items}</ul>"
    )


def _zones_table(run: RunRecord) -> str:
    if not run.zones:
        return "<p>The zones' own counters are in summary.json, which this run has not written.</p>"
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
    return _table(["zone", "region", "pushes", "received", "shards by class and origin", "forwarded", "refused"], rows)


def _forwarded(zone: dict[str, Any]) -> str:
    n = zone.get("forwarded_shards", 0)
    by_class = zone.get("forwarded_by_class")
    if not n or not by_class:
        return str(n)
    return f"{n} partial sums of " + ", ".join(f"{k} {v}" for k, v in by_class.items())


def _refusals(run: RunRecord) -> str:
    rows: list[list[Any]] = []
    for r in run.rounds:
        for site in sorted(r.refused):
            code = r.refusal_codes.get(site)
            rows.append([r.round, site, code.value if code is not None else "-", r.refused[site]])
    parts = []
    if rows:
        shown = rows[:MAX_REFUSAL_ROWS]
        more = f"<p>and {len(rows) - len(shown)} more (events.jsonl has them all)</p>" if len(rows) > len(shown) else ""
        parts.append("<p>Selected sites that did not contribute:</p>" + _table(["round", "site", "code", "why"], shown))
        parts.append(more)
    else:
        parts.append('<p class="ok">No selected site was refused.</p>')
    left_out = [[r.round, site, r.excluded[site]] for r in run.rounds for site in sorted(r.excluded)]  # one per site
    if left_out:
        shown = left_out[:MAX_REFUSAL_ROWS]
        parts.append(
            "<p>Replies the coordinator left out of a round's metrics (they disagreed with what it knows, "
            "or were out of bounds):</p>" + _table(["round", "site", "why"], shown)
        )
        if len(left_out) > len(shown):
            parts.append(f"<p>and {len(left_out) - len(shown)} more (events.jsonl has them all)</p>")
    if run.result.refused_nodes:
        nodes = [
            [n.get("node", "?"), n.get("site_id", "?"), n.get("code", "-"), n.get("reason", "")]
            for n in run.result.refused_nodes[:MAX_REFUSAL_ROWS]
        ]
        parts.append(
            "<p>Nodes refused for the run (they could not prove which site they are, or claimed a site "
            "another node holds):</p>" + _table(["node", "claimed site", "code", "why"], nodes)
        )
    if run.result.aborted:
        aborted = [[a["round"], a["reason"]] for a in run.result.aborted]
        parts.append("<p>Rounds aborted at every zone:</p>" + _table(["round", "why"], aborted))
    zone_rows = [[z.get("name", "?"), reason] for z in run.zones for reason in z.get("refusals", [])]
    if zone_rows:
        parts.append("<p>What the zones refused (their latest reasons):</p>" + _table(["zone", "why"], zone_rows))
    if run.result.stopped_reason:
        parts.append(f'<p class="warn">The run stopped: {_e(run.result.stopped_reason)}</p>')
    if run.skipped:
        items = "".join(f"<li>{_e(note)}</li>" for note in run.skipped[:MAX_REFUSAL_ROWS])
        parts.append(f'<p class="warn">Left out of this report as malformed:</p><ul>{items}</ul>')
    return "\n".join(parts)
