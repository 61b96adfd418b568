"""Choosing ``bench/dp_accuracy.py``'s settings on validation data (``--tune``; not a benchmark itself).

Every candidate of ``CANDIDATES`` (and the non-private ``CENTRAL_CANDIDATES``) is scored on
validation splits carved out of each fold's training part, never on a test fold, and the
table goes to its own section of BENCHMARKS.md (``--tuning-section``).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import _common as c
from _dp_runs import Job, Outcome, by_fold, job_key, load_cache, mean_se, paired_gap, pct, pp, run_jobs
from _dp_settings import (
    CANDIDATES,
    CENTRAL_CANDIDATES,
    DELTA,
    FOLDS,
    SITES,
    TUNE_SEED0,
    TUNING_INTERPRETATIONS,
    VALIDATION_FRACTION,
    Central,
    Federated,
)

__all__ = ["TUNING_SECTION", "tune", "tuning_table"]

TUNING_SECTION = "dp_accuracy_tuning"  # the default section; TUNING_INTERPRETATIONS has one text per section


def tune(args: argparse.Namespace, desc: dict[str, str]) -> int:
    """Score candidate settings on validation splits (never the test folds)."""
    names = set(args.tune.split(",")) if args.tune not in ("", "all") else None
    # the reference of the tuning table is the demo model trained centrally (the first candidate)
    reference = CENTRAL_CANDIDATES[0]
    centrals = [s for s in CENTRAL_CANDIDATES if names is None or s.name in names or s is reference]
    feds = [s for s in CANDIDATES if names is None or s.name in names]
    epsilon = args.tune_epsilon
    seeds = range(TUNE_SEED0, TUNE_SEED0 + args.tune_seeds)
    jobs: list[Job] = []
    for seed in seeds:
        for fold in range(FOLDS):
            jobs += [("central", s, None, seed, fold, True) for s in centrals]
            jobs += [("dp", s, epsilon, seed, fold, True) for s in feds]
    cached = load_cache(args.tune_cache)
    todo = [j for j in jobs if job_key(j) not in cached]
    print(
        f"tuning on validation splits ({VALIDATION_FRACTION:.0%} of each training part): seeds "
        f"{seeds.start}-{seeds.stop - 1} × {FOLDS} folds, ε={epsilon:g}; {len(jobs)} runs, "
        f"{len(jobs) - len(todo)} of them cached",
        flush=True,
    )
    fresh = run_jobs(todo, args.jobs, args.tune_cache)
    outcomes = [cached[job_key(j)] for j in jobs if job_key(j) in cached] + fresh
    rows, figures = tuning_table(outcomes, reference, centrals, feds, epsilon)
    headers = [
        "candidate",
        "settings",
        "validation accuracy %",
        f"gap vs {reference.name} pp",
        "σ",
        "steps/site",
        "s/run",
    ]
    # without --output or --publish-tuning the table is shown (and --json printed), no section written
    written = args.output is not None or args.publish_tuning
    c.publish(
        args if written else argparse.Namespace(**{**vars(args), "quick": True}),
        args.tuning_section,
        "DP accuracy: choosing settings on validation data"
        + ("" if args.tuning_section == TUNING_SECTION else " (noise shared under CKKS)"),
        f"{len(seeds) * FOLDS} validation splits per candidate (seeds {seeds.start}-{seeds.stop - 1} × {FOLDS} "
        "folds); mean ± standard error over splits",
        desc,
        notes=[
            f"- Each split: the training part of a stratified {FOLDS}-fold split (shuffle seed as listed) loses "
            f"a stratified {VALIDATION_FRACTION:.0%} validation split, scored here; the remaining training data "
            f"is cut into {SITES} non-IID sites as in the benchmark. The test folds are never loaded.",
            f"- DP candidates: record-level DP-SGD, per-site budget ε={epsilon:g}, δ={DELTA:g}, σ calibrated to "
            "spend it over the planned rounds. Gap = paired difference to the central reference on the same split.",
        ],
        headers=headers,
        rows=rows,
        interpretation=TUNING_INTERPRETATIONS.get(args.tuning_section, ""),
        headline=figures,
        console_title=f"validation, ε={epsilon:g} (δ={DELTA:g})",
    )
    return 0


def tuning_table(
    outcomes: list[Outcome], reference: Central, centrals: list[Central], feds: list[Federated], epsilon: float
) -> tuple[list[list[str]], dict[str, Any]]:
    """One row per candidate, and the ``--json`` figures (validation accuracy and gap per candidate)."""
    ref = by_fold(outcomes, reference.name, None)
    rows = []
    accuracy: dict[str, float] = {}
    gap: dict[str, float] = {}
    for s, eps in [*((s, None) for s in centrals), *((s, epsilon) for s in feds)]:
        runs = by_fold(outcomes, s.name, eps)
        acc, diff = mean_se([o.accuracy for o in runs.values()]), paired_gap(ref, runs)
        accuracy[s.name], gap[s.name] = acc[0], diff[0]
        secs = statistics.fmean(o.seconds for o in runs.values())
        if eps is None:
            rows.append([s.name, s.describe(), pct(*acc), pp(*diff), "-", "-", f"{secs:.1f}"])
            continue
        any_run = next(iter(runs.values()))
        sigma = f"{any_run.sigma:.2f}" if any_run.sigma else "-"
        rows.append([s.name, s.describe(), pct(*acc), pp(*diff), sigma, str(any_run.steps), f"{secs:.1f}"])
    return rows, {"validation_accuracy": accuracy, "gap_pp": gap}
