"""``fedshard tune``: run every candidate as a federation, score each on a private validation split,
pick the best by the noisy scores alone."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshard.assembly import check_privacy
from fedshard.assembly.sites import STORE_KEYS_DIR, site_ledger_events
from fedshard.config import FederationConfig
from fedshard.config.tuning import TuningConfig
from fedshard.errors import ConfigError, StoreError
from fedshard.run_folder.tune_folder import TUNE_FILE, candidate_dir
from fedshard.simulate.run import simulate
from fedshard.tuning.candidates import CandidateRun, candidate_runs
from fedshard.tuning.selection import SiteScore, TuningLedgers, score_std, validation_count

__all__ = ["TUNE_FILE", "CandidateResult", "tune"]


@dataclass
class CandidateResult:
    """One candidate's outcome: its noisy validation accuracy (None: its run stopped, so it is
    out of the selection), the score's noise in accuracy units, and its σ."""

    name: str
    settings: dict[str, Any]
    rounds: int
    sigma: float | None = None
    score: float | None = None
    score_std: float | None = None
    stopped: str = ""
    scores: list[SiteScore] = field(default_factory=list)


def tune(
    base: FederationConfig,
    tuning: TuningConfig,
    out: str | Path,
    *,
    on_start: Callable[[float], None] | None = None,
    on_candidate: Callable[[CandidateResult], None] | None = None,
) -> dict[str, Any]:
    """Run ``tuning``'s candidates of ``base`` under ``out``, choose one, write ``out/tune.json``.

    Each candidate is an in-process simulation in ``out/candidates/<name>`` (its summary
    and model as ``fedshard simulate`` leaves them); then every site releases its noisy
    validation count (:mod:`fedshard.tuning.selection`), and the candidate with the largest
    sum is chosen. ``on_start`` is called, before anything runs, with the standard deviation
    the noise will give every candidate's score (in accuracy units), ``on_candidate`` with each
    candidate's result as it comes.

    Raises
    ------
    ConfigError
        ``out`` is not empty (nothing is overwritten), or a candidate's config is invalid (δ
        above 1/records at a site included).
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: fedshard tune writes a new folder (nothing is overwritten)")
    plan = candidate_runs(base, tuning)
    runs = plan.runs
    for run in runs:  # what a candidate's run would refuse at its start, before anything is written
        check_privacy(run.config)
    out.mkdir(parents=True, exist_ok=True)
    ledgers = TuningLedgers(out, base, plan.splits)
    results: list[CandidateResult] = []
    try:
        if on_start is not None:
            on_start(plan.score_noise)
        for index, run in enumerate(runs):
            result = _run_candidate(index, run, candidate_dir(out, run.name), ledgers)
            results.append(result)
            if on_candidate is not None:
                on_candidate(result)
        spent = ledgers.spent()
    finally:
        ledgers.close()
    scored = [r for r in results if r.score is not None]
    chosen = max(scored, key=lambda r: r.score if r.score is not None else -math.inf) if scored else None
    summary = {
        "federation": base.federation.name,
        "validation_fraction": tuning.validation_fraction,
        "selection_share": tuning.selection_share,
        "chosen": chosen.name if chosen is not None else None,
        "chosen_run": str(candidate_dir(out, chosen.name)) if chosen is not None else None,
        "candidates": [
            {
                "name": r.name,
                "settings": r.settings,
                "rounds": r.rounds,
                "sigma": r.sigma,
                "noisy_validation_accuracy": r.score,
                "noise_std": r.score_std,
                "stopped": r.stopped,
            }
            for r in results
        ],
        "sites": {
            site: {
                "epsilon_spent": eps,
                "epsilon_budget": budget.epsilon,
                "delta": budget.delta,
                "epsilon_training": plan.splits[site].training.epsilon,
                "score_sigma": plan.splits[site].score_sigma,
            }
            for site, (eps, budget) in spent.items()
        },
    }
    (out / TUNE_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _run_candidate(index: int, run: CandidateRun, run_dir: Path, ledgers: TuningLedgers) -> CandidateResult:
    """Run one candidate, charge its training to every site's tuning ledger, release its scores."""
    config = run.config
    summary = simulate(config, run_dir)
    result = CandidateResult(run.name, run.settings, int(summary.get("rounds", 0)))
    sigmas: list[float] = []
    for site in config.sites:
        state_dir = run_dir / "sites" / site.id
        if not state_dir.exists():
            continue
        events = site_ledger_events(config, state_dir, run_dir / STORE_KEYS_DIR / f"{site.id}.kek")
        ledgers.charge_training(site.id, index, events)
        sigmas.extend(e.noise_multiplier for e in events)
    result.sigma = min(sigmas) if sigmas else None
    if summary.get("stopped_reason"):
        result.stopped = str(summary["stopped_reason"])
        return result
    try:  # every site's count first: a candidate some site cannot score is released by none
        counts = {site.id: validation_count(config, run_dir, site.id) for site in config.sites}
    except StoreError as exc:
        result.stopped = f"not every site can score it: {exc}"
        return result
    for site_id, (correct, records) in counts.items():
        result.scores.append(ledgers.release_score(site_id, index, correct, records))
    records = sum(s.records for s in result.scores)
    result.score = sum(s.noisy for s in result.scores) / records
    result.score_std = score_std(result.scores) / records
    return result
