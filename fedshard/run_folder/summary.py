"""A run's ``summary.json`` (the contract the README documents), the same for every engine
and for a deployed run: rounds, accuracy, versions, each site's privacy and model version,
the residency groups, the zones' own counters."""

from __future__ import annotations

from typing import Any

from fedshard.config import FederationConfig
from fedshard.coordinator.results import RunResult
from fedshard.protocol.messages import SiteInfo

__all__ = ["build_summary", "site_versions"]


def site_versions(result: RunResult) -> dict[str, str]:
    """The model version each site should hold after the run: its residency group's, else the federation's."""
    last = result.rounds[-1].versions if result.rounds else {}
    out = {s.site_id: result.version for s in result.sites}
    for group, members in result.groups.items():
        if group in last:
            out.update(dict.fromkeys(members, last[group]))
    return out


def _site_summary(site: SiteInfo, privacy: dict[str, Any] | None, version: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": site.site_id, "jurisdiction": site.jurisdiction, "examples": site.num_examples}
    entry["model_version"] = version  # what `fedshard verify --version` compares a site's store with
    if privacy is not None:
        entry.update(
            epsilon_budget=privacy["epsilon_budget"],
            epsilon_spent=privacy["epsilon_spent"],
            epsilon_record=privacy["epsilon_record"],
            epsilon_update=privacy["epsilon_update"],
            delta=privacy["delta"],
            rounds_participated=privacy["rounds_participated"],
            status=privacy["status"],
            projected_rounds_left=privacy["projected_rounds_left"],
        )
        if privacy.get("note"):
            entry["note"] = privacy["note"]
    return entry


def build_summary(
    config: FederationConfig,
    result: RunResult,
    engine: str,
    zones: list[dict[str, Any]],
    centralized_accuracy: float | None,
    elapsed_s: float,
) -> dict[str, Any]:
    """The ``summary.json`` contract (see README)."""
    last = result.rounds[-1] if result.rounds else None
    versions = site_versions(result)
    privacy = result.privacy  # built once: a property over every site and round
    return {
        "federation": config.federation.name,
        "engine": engine,
        "rounds": len(result.rounds),
        "final_accuracy": last.accuracy if last else None,
        "final_loss": last.loss if last else None,
        "centralized_accuracy": centralized_accuracy,
        "model_version": result.version,
        "genesis_version": result.genesis_version,
        "elapsed_s": round(elapsed_s, 3),
        "history": [
            {
                "round": r.round,
                "accuracy": r.accuracy,
                "loss": r.loss,
                "train_loss": r.train_loss,
                "bytes_up": r.bytes_up,
                "sites": list(r.sites),
                "refused": {site: r.refusal(site) for site in sorted(r.refused)},
                "refusal_codes": {site: code.value for site, code in sorted(r.refusal_codes.items())},
                "excluded": r.excluded,  # replies the coordinator left out (coordinator/_replies.py)
                "excluded_codes": {site: [c.value for c in codes] for site, codes in r.excluded_codes.items()},
                "merkle_root": r.merkle_root,
                "model_version": r.version,
                "group_versions": r.versions,
                "group_roots": r.roots,
                "aggregates": r.aggregates,
            }
            for r in result.rounds
        ],
        "sites": [_site_summary(s, privacy.get(s.site_id), versions[s.site_id]) for s in result.sites],
        "residency_groups": result.groups,
        "zones": zones,
        "aborted_rounds": result.aborted,
        "refused_nodes": result.refused_nodes,  # nodes that could not prove their site id (coordinator/binding.py)
        "stopped_reason": result.stopped_reason,
    }
