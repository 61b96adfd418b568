"""Accuracy cost of differential privacy: non-private central training vs DP federated training.

Breast-cancer diagnosis (``clients/tasks/breast_cancer.py``), 5 non-IID sites (the
training part sorted by mean radius and cut into 5 contiguous slices), record-level
DP-SGD at every site with a per-site budget ε ∈ {1, 3, 8}, δ = 1e-5, σ calibrated by
each site so that its planned rounds spend exactly its budget (``noise_multiplier``
left empty). Every federation is a real one: ``fedshard.simulate.run.simulate``
with a gRPC zone on loopback, sites in process.

Repetitions: repeated stratified 5-fold cross-validation (``--seeds`` shuffles × 5
folds). On every test fold the same data is used by

* ``central``: the non-private reference, one model trained on the union of the five
  sites' training data (``fedshard.simulate.baseline.centralized_baseline``);
* ``dp``: the DP federation with the settings chosen on validation data (``DP``), at
  every ε;
* ``naive``: the naive DP federation (30 rounds, batch 16, lr 0.1, clip 1.0, FedAvg)
  at ε = 3, the reference line of the issue;

so a gap is a paired difference per fold: mean ± standard error (std of the per-fold
differences / √folds).

Settings were chosen without test data: ``--tune`` evaluates the candidate settings
(``CANDIDATES``) on validation splits carved out of the training part of each fold
(the task's ``validation_fraction``; the test fold is not even loaded) with other
shuffling seeds than the test runs, and writes its own section
(``dp_accuracy_tuning``).

    .venv/bin/python bench/dp_accuracy.py [--quick] [--seeds N] [--output FILE]
    .venv/bin/python bench/dp_accuracy.py --tune [NAME,...] [--tune-seeds N] [--jobs 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import _common as c

SECTION = "dp_accuracy"
TUNING_SECTION = "dp_accuracy_tuning"
SITES = 5
FOLDS = 5
DELTA = 1e-5
EPSILONS = (1.0, 3.0, 8.0)
GOAL_EPSILON = 3.0
GOAL_GAP_PP = 0.3
SE_GOAL_PP = 0.3
VALIDATION_FRACTION = 0.2
TUNE_SEED0 = 100  # tuning shuffles use seeds 100, 101, …; test runs use 0, 1, …
TASK = "clients.tasks.breast_cancer:task"


@dataclasses.dataclass(frozen=True)
class Central:
    """Non-private training on the pooled data."""

    name: str
    hidden: tuple[int, ...]
    epochs: int
    batch_size: int
    learning_rate: float
    momentum: float = 0.9
    features: tuple[int, ...] | None = None

    def describe(self) -> str:
        return (
            f"MLP {_arch(self.hidden, self.features)}, {self.epochs} epochs, batch {self.batch_size}, "
            f"SGD lr {self.learning_rate:g} "
            f"momentum {self.momentum:g}"
        )


@dataclasses.dataclass(frozen=True)
class Federated:
    """DP federated training settings (what a FederationConfig says)."""

    name: str
    hidden: tuple[int, ...]
    rounds: int
    local_epochs: int
    batch_size: int
    learning_rate: float
    max_grad_norm: float
    server: tuple[str, float] = ("avg", 1.0)  # (kind, learning rate); betas and tau: the defaults below
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    momentum: float = 0.9
    features: tuple[int, ...] | None = None

    def describe(self) -> str:
        kind, lr = self.server
        if kind == "avg":
            server = "FedAvg" if lr == 1.0 else f"FedAvg, server lr {lr:g}"
        elif kind == "momentum":
            server = f"server momentum β={self.beta1:g}, lr {lr:g}"
        else:
            server = f"server Adam lr {lr:g}, β=({self.beta1:g}, {self.beta2:g}), τ={self.tau:g}"
        return (
            f"MLP {_arch(self.hidden, self.features)}, {self.rounds} rounds × {self.local_epochs} "
            "local epoch(s), batch "
            f"{self.batch_size}, local SGD lr {self.learning_rate:g} momentum {self.momentum:g}, clip "
            f"{self.max_grad_norm:g}, {server}"
        )


WORST = tuple(range(20, 30))
FEATURE_GROUPS = {tuple(range(0, 10)): "mean", tuple(range(10, 20)): "SE", tuple(range(20, 30)): "worst"}


def _arch(hidden: Sequence[int], features: tuple[int, ...] | None = None) -> str:
    arch = "-".join(str(w) for w in (30 if features is None else len(features), *hidden, 2))
    if features is None:
        return arch
    return (
        f"{arch} on the {FEATURE_GROUPS[features]} features"
        if features in FEATURE_GROUPS
        else f"{arch} on features {features}"
    )


# The naive set-up (the demo model).
NAIVE = Federated("naive", (64, 32), rounds=30, local_epochs=1, batch_size=16, learning_rate=0.1, max_grad_norm=1.0)

# What `simulate` reports as `centralized_accuracy` for the naive set-up: the demo model trained
# non-privately with the naive settings (30 epochs = rounds × local epochs, batch 16, lr 0.1).
CENTRAL_DEMO = Central("central-demo", (64, 32), epochs=30, batch_size=16, learning_rate=0.1)

CENTRAL_CANDIDATES: tuple[Central, ...] = (
    Central("c-mlp-lr0.1", (64, 32), 30, 16, 0.1),
    Central("c-mlp-lr0.03", (64, 32), 30, 16, 0.03),
    Central("c-mlp-lr0.01", (64, 32), 30, 16, 0.01),
    Central("c-lin-lr0.1", (), 30, 16, 0.1),
    Central("c-lin-lr0.03", (), 30, 16, 0.03),
    Central("c-lin-lr0.01", (), 30, 16, 0.01),
    # the 10 "worst" features (the data set's published grouping: mean, SE, worst)
    Central("c-worst-lin-lr0.1-e100", (), 100, 16, 0.1, features=WORST),
    Central("c-worst-lin-lr0.3-e30", (), 30, 16, 0.3, features=WORST),
    Central("c-worst-h16-lr0.01-e100", (16,), 100, 16, 0.01, features=WORST),
    Central("c-worst-mlp-lr0.01", (64, 32), 30, 16, 0.01, features=WORST),
)
_LIN_FULL = Federated("lin-full", (), 30, 1, 128, 1.0, 1.0)
_ADAM = dataclasses.replace(_LIN_FULL, server=("adam", 0.05))
CANDIDATES: tuple[Federated, ...] = (
    NAIVE,
    dataclasses.replace(NAIVE, name="naive-lin", hidden=()),
    Federated("lin-b32-r20", (), 20, 1, 32, 0.1, 1.0),
    dataclasses.replace(_LIN_FULL, name="lin-full-r30-lr1"),
    dataclasses.replace(_LIN_FULL, name="lin-full-r30-lr3", learning_rate=3.0),
    dataclasses.replace(_LIN_FULL, name="lin-full-r30-lr10", learning_rate=10.0),
    dataclasses.replace(_LIN_FULL, name="lin-full-r30-adam", server=("adam", 0.05)),
    dataclasses.replace(_LIN_FULL, name="lin-full-r30-mom", server=("momentum", 0.3)),
    dataclasses.replace(_LIN_FULL, name="mlp-full-r30-lr1", hidden=(64, 32)),
    # server Adam (post-processing of the aggregate), linear model, one full-batch step per round
    dataclasses.replace(_ADAM, name="adam-lr0.02", server=("adam", 0.02)),
    dataclasses.replace(_ADAM, name="adam-lr0.1", server=("adam", 0.1)),
    dataclasses.replace(_ADAM, name="adam-lr0.2", server=("adam", 0.2)),
    dataclasses.replace(_ADAM, name="adam-r15", rounds=15),
    dataclasses.replace(_ADAM, name="adam-r60", rounds=60),
    dataclasses.replace(_ADAM, name="adam-clip0.3", max_grad_norm=0.3),
    dataclasses.replace(_ADAM, name="adam-clip3", max_grad_norm=3.0),
    dataclasses.replace(_ADAM, name="adam-b37", batch_size=37),
    dataclasses.replace(_ADAM, name="adam-mlp", hidden=(64, 32)),
    dataclasses.replace(_LIN_FULL, name="mom-lr1", server=("momentum", 1.0)),
    # the 10 "worst" features: fewer parameters, less noise; larger steps with smaller clipping
    Federated("worst-r40-c0.3", (), 40, 1, 128, 30.0, 0.3, features=WORST),
    Federated("worst-r40-c0.1", (), 40, 1, 128, 90.0, 0.1, features=WORST),
    Federated("worst-r40-c1", (), 40, 1, 128, 3.0, 1.0, features=WORST),
    Federated("worst-r30-c0.3", (), 30, 1, 128, 30.0, 0.3, features=WORST),
    Federated("worst-r40-adam", (), 40, 1, 128, 1.0, 0.3, ("adam", 0.27), tau=0.1, features=WORST),
    Federated("all-r40-c0.3", (), 40, 1, 128, 30.0, 0.3),
)

# Chosen on validation data with --tune (the dp_accuracy_tuning section of BENCHMARKS.md): the best
# non-private reference (ties broken towards the simpler model) and the best DP candidate.
CENTRAL = dataclasses.replace(next(s for s in CENTRAL_CANDIDATES if s.name == "c-worst-lin-lr0.1-e100"), name="central")
DP = dataclasses.replace(next(s for s in CANDIDATES if s.name == "worst-r40-c0.3"), name="dp-tuned")


INTERPRETATION = (
    "Why the goal is out of reach with these levers: every site protects its own ~91 records and adds its own "
    "noise, so the aggregate carries √5 times the noise that DP-SGD over the pooled data would need for the same "
    "ε; with the tuned schedule (40 full-batch steps per site) ε = 3 needs σ ≈ 8.8, i.e. noise of std σ·C/n ≈ 0.1·C "
    "per coordinate on a site's mean clipped gradient, of the order of the signal once most records are classified "
    "correctly, and a constant step size cannot average it away. What moved the gap, on validation data (section "
    "`dp_accuracy_tuning`, ε = 3): a linear model instead of the 30-64-32-2 MLP (fewer parameters to noise), one "
    "full-batch step per round (q = 1, so no loss from Poisson batches of ~16) with a larger step, the 10 'worst' "
    "features (22 parameters instead of 62), a smaller clipping bound (0.3) with a proportionally larger learning "
    "rate, and 40 rather than 30 rounds. Server Adam and server momentum (post-processing of the aggregate) did not "
    "beat FedAvg once its step size was tuned. Choosing the 'worst' features also made the non-private reference "
    "stronger (it is the best non-private candidate on validation), so the gap is measured against the best model "
    "we found, not the demo model."
)
TUNING_INTERPRETATION = (
    "All DP candidates here stay 3-10 pp below the best non-private candidates on these validation splits (sites "
    "hold ~73 records here, ~91 in the benchmark, so validation gaps are larger than test gaps). Ranked by "
    "validation accuracy, the levers: the linear model beats the MLP under DP (naive 89.6 → naive-lin 92.3 %); "
    "one full-batch step per round with a large local step (lin-full-r30-lr3, 93.8 %) beats 5-6 Poisson batches "
    "per round (naive-lin, lin-b32-r20); server Adam (best 93.9 %) and server momentum (93.6 %) are no better than "
    "tuned FedAvg; the 10 'worst' features help both the non-private models (98.2 % against 96.6 % with all 30) "
    "and DP (94.4-95.1 % against 92.0 % for the same schedule on all features); with them, clipping at 0.3 with "
    "lr 30 (95.1 %) edges out clip 1 / lr 3 (94.4 %) and clip 0.1 / lr 90 (94.6 %), and 40 rounds edge out 30 "
    "(94.7 %); differences below ~1 pp are within noise here (SE ≈ 0.6 pp per candidate). Chosen: "
    "`worst-r40-c0.3` (DP) and `c-worst-lin-lr0.1-e100` (non-private reference; it ties with "
    "`c-worst-h16-lr0.01-e100`, the linear model is simpler)."
)


# running ---------------------------------------------------------------------------------
def _quiet() -> None:
    logging.disable(logging.WARNING)  # ERROR and above only
    warnings.filterwarnings("ignore")


_CALIBRATIONS: list[tuple[tuple[Any, ...], float]] = []  # (calibrate_noise args, σ), every call


@functools.cache
def _memoise_calibration() -> None:
    """σ calibration, memoised in this process.

    Each site calibrates σ once per federation and caches it in its state folder; every
    run here has fresh folders, so the same calibration (seconds of PRV accounting) would
    be repeated for every run. ``calibrate_noise`` is a pure function: memoising it
    changes no result. Every call is also recorded in ``_CALIBRATIONS`` (which σ the
    sites used).
    """
    import fedshard.site.privacy as site_privacy

    memo: dict[tuple[Any, ...], float] = {}
    original = site_privacy.calibrate_noise

    def calibrate(*args: Any) -> float:
        if args not in memo:
            memo[args] = original(*args)
        _CALIBRATIONS.append((args, memo[args]))
        return memo[args]

    site_privacy.calibrate_noise = calibrate  # type: ignore[assignment]


def _task_options(
    hidden: Sequence[int], seed: int, fold: int, validation: bool, momentum: float, features: Sequence[int] | None
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "hidden": list(hidden),
        "sort_feature": 0,
        "folds": FOLDS,
        "fold": fold,
        "split_seed": seed,
        "momentum": momentum,
    }
    if validation:
        options["validation_fraction"] = VALIDATION_FRACTION
    if features is not None:
        options["features"] = list(features)
    return options


def dp_config(s: Federated, epsilon: float, seed: int, fold: int, validation: bool) -> Any:
    from fedshard.config import FederationConfig

    kind, server_lr = s.server
    return FederationConfig.model_validate(
        {
            "federation": {"name": "dp-accuracy", "seed": seed, "rounds": s.rounds, "min_sites": SITES},
            "task": {
                "target": TASK,
                "options": _task_options(s.hidden, seed, fold, validation, s.momentum, s.features),
            },
            "training": {
                "local_epochs": s.local_epochs,
                "batch_size": s.batch_size,
                "learning_rate": s.learning_rate,
                "server_optimizer": {
                    "kind": kind,
                    "learning_rate": server_lr,
                    "beta1": s.beta1,
                    "beta2": s.beta2,
                    "tau": s.tau,
                },
            },
            "privacy": {
                "record_level": {"enabled": True, "noise_multiplier": None, "max_grad_norm": s.max_grad_norm},
                "budget": {"epsilon": epsilon, "delta": DELTA},
            },
            "sharding": {"tile": [256, 256]},
            "zones": [{"name": "bench-zone", "region": "EU", "endpoint": "127.0.0.1:0"}],
            "sites": [{"id": f"site-{i}", "jurisdiction": "EU"} for i in range(SITES)],
        }
    )


def central_config(s: Central, seed: int, fold: int, validation: bool) -> Any:
    from fedshard.config import FederationConfig

    return FederationConfig.model_validate(
        {
            "federation": {"name": "dp-accuracy-central", "seed": seed, "rounds": s.epochs, "min_sites": SITES},
            "task": {
                "target": TASK,
                "options": _task_options(s.hidden, seed, fold, validation, s.momentum, s.features),
            },
            "training": {"local_epochs": 1, "batch_size": s.batch_size, "learning_rate": s.learning_rate},
            "zones": [{"name": "bench-zone", "region": "EU", "endpoint": "127.0.0.1:0"}],
            "sites": [{"id": f"site-{i}", "jurisdiction": "EU"} for i in range(SITES)],
        }
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One training run scored on one fold's test (or validation) data."""

    setting: str
    epsilon: float | None
    seed: int
    fold: int
    correct: int
    total: int
    epsilon_spent: float | None = None
    sigma: float | None = None
    steps: int | None = None
    seconds: float = 0.0

    @property
    def accuracy(self) -> float:
        return self.correct / self.total


def run_central(s: Central, seed: int, fold: int, validation: bool) -> Outcome:
    from fedshard.simulate.baseline import centralized_baseline

    _quiet()
    t0 = time.perf_counter()
    m = centralized_baseline(central_config(s, seed, fold, validation))
    assert m.accuracy is not None
    correct = round(m.accuracy * m.num_examples)
    return Outcome(s.name, None, seed, fold, correct, m.num_examples, seconds=time.perf_counter() - t0)


def run_federated(s: Federated, epsilon: float, seed: int, fold: int, validation: bool) -> Outcome:
    from fedshard.simulate.run import simulate

    _quiet()
    _memoise_calibration()
    config = dp_config(s, epsilon, seed, fold, validation)
    _CALIBRATIONS.clear()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dp-accuracy-") as out:
        summary = simulate(config, out)
    seconds = time.perf_counter() - t0
    if summary["rounds"] != s.rounds or any(site.get("status") == "refused" for site in summary["sites"]):
        raise RuntimeError(f"{s.name} ε={epsilon} seed {seed} fold {fold}: {summary['stopped_reason']}")
    total = _num_test(s.hidden, seed, fold, validation)
    correct = round(summary["final_accuracy"] * total)
    spent = max(site["epsilon_spent"] for site in summary["sites"])
    # (target ε, δ, q, steps, accountant) → σ, one call per site; sites differ by a record at most
    sigma = min(sg for _, sg in _CALIBRATIONS) if _CALIBRATIONS else None
    steps = max(args[3] for args, _ in _CALIBRATIONS) if _CALIBRATIONS else None
    return Outcome(s.name, epsilon, seed, fold, correct, total, spent, sigma, steps, seconds)


@functools.cache
def _num_test(hidden: tuple[int, ...], seed: int, fold: int, validation: bool) -> int:
    from fedshard.task import Partition, load_task

    task = load_task(TASK, _task_options(hidden, seed, fold, validation, 0.9, None))
    return task.load_data(Partition(None, SITES, seed)).num_test


Job = tuple[str, Any, float | None, int, int, bool]  # (kind, settings, ε, seed, fold, validation)


def execute(job: Job) -> Outcome:
    kind, setting, epsilon, seed, fold, validation = job
    if kind == "central":
        return run_central(setting, seed, fold, validation)
    assert epsilon is not None
    return run_federated(setting, epsilon, seed, fold, validation)


def run_jobs(jobs: Sequence[Job], processes: int, cache: Path | None = None) -> list[Outcome]:
    """Run ``jobs`` (in this process, or in ``processes`` worker processes), printing progress
    (and appending each outcome to ``cache`` as soon as it is known)."""
    t0 = time.perf_counter()
    outcomes: list[Outcome] = []

    def progress(o: Outcome) -> None:
        _save_cache(cache, [jobs[len(outcomes)]], [o])
        outcomes.append(o)
        eps = "central" if o.epsilon is None else f"ε={o.epsilon:g}"
        print(
            f"[{len(outcomes):>4}/{len(jobs)} {time.perf_counter() - t0:6.0f}s] {o.setting:<16} {eps:<8} "
            f"seed {o.seed:<3} fold {o.fold}  {o.correct}/{o.total} = {o.accuracy:.4f}  ({o.seconds:.1f}s)",
            flush=True,
        )

    if processes <= 1:
        for job in jobs:
            progress(execute(job))
        return outcomes
    import multiprocessing

    with ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        for o in pool.map(execute, jobs, chunksize=1):
            progress(o)
    return outcomes


def _job_key(job: Job) -> str:
    """The job, with its settings' non-default fields (so that a new field does not void the cache)."""
    kind, setting, epsilon, seed, fold, validation = job
    fields = {
        f.name: getattr(setting, f.name)
        for f in dataclasses.fields(setting)
        if f.default is dataclasses.MISSING or getattr(setting, f.name) != f.default
    }
    return repr((kind, type(setting).__name__, sorted(fields.items()), epsilon, seed, fold, validation))


def _load_cache(path: Path | None) -> dict[str, Outcome]:
    """Outcomes of earlier --tune runs (JSON lines), by job (the settings' full repr)."""
    import json

    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        out[entry["key"]] = Outcome(**entry["outcome"])
    return out


def _save_cache(path: Path | None, jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> None:
    import json

    if path is None:
        return
    with path.open("a") as f:
        for job, o in zip(jobs, outcomes, strict=True):
            f.write(json.dumps({"key": _job_key(job), "outcome": dataclasses.asdict(o)}) + "\n")


# statistics ------------------------------------------------------------------------------
def _by_fold(outcomes: Sequence[Outcome], name: str, epsilon: float | None) -> dict[tuple[int, int], Outcome]:
    return {(o.seed, o.fold): o for o in outcomes if o.setting == name and o.epsilon == epsilon}


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std / √n; 0 for one value)."""
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, se


def paired_gap(reference: dict[tuple[int, int], Outcome], other: dict[tuple[int, int], Outcome]) -> tuple[float, float]:
    """Mean ± SE of reference − other accuracy over the folds both have, in percentage points."""
    keys = sorted(set(reference) & set(other))
    return mean_se([100 * (reference[k].accuracy - other[k].accuracy) for k in keys])


def pct(m: float, se: float) -> str:
    return f"{100 * m:.2f} ± {100 * se:.2f}"


def pp(m: float, se: float) -> str:
    return f"{m:+.2f} ± {se:.2f}"


# modes --------------------------------------------------------------------------------------
def tune(args: argparse.Namespace, desc: dict[str, str]) -> int:
    """Score candidate settings on validation splits (never the test folds)."""
    names = set(args.tune.split(",")) if args.tune not in ("", "all") else None
    # the reference of the tuning table is the demo model trained centrally (the first candidate)
    reference = CENTRAL_CANDIDATES[0]
    centrals = [s for s in CENTRAL_CANDIDATES if names is None or s.name in names or s is reference]
    feds = [s for s in CANDIDATES if names is None or s.name in names]
    epsilon = args.tune_epsilon
    seeds = range(TUNE_SEED0, TUNE_SEED0 + args.tune_seeds)
    folds = range(FOLDS)
    jobs: list[Job] = []
    for seed in seeds:
        for fold in folds:
            jobs += [("central", s, None, seed, fold, True) for s in centrals]
            jobs += [("dp", s, epsilon, seed, fold, True) for s in feds]
    cached = _load_cache(args.tune_cache)
    todo = [j for j in jobs if _job_key(j) not in cached]
    print(
        f"tuning on validation splits ({VALIDATION_FRACTION:.0%} of each training part): seeds "
        f"{seeds.start}-{seeds.stop - 1} × {FOLDS} folds, ε={epsilon:g}; {len(jobs)} runs, "
        f"{len(jobs) - len(todo)} of them cached",
        flush=True,
    )
    fresh = run_jobs(todo, args.jobs, args.tune_cache)
    outcomes = [cached[_job_key(j)] for j in jobs if _job_key(j) in cached] + fresh
    ref = _by_fold(outcomes, reference.name, None)
    headers = [
        "candidate",
        "settings",
        "validation accuracy %",
        f"gap vs {reference.name} pp",
        "σ",
        "steps/site",
        "s/run",
    ]
    rows = []
    for s in centrals:
        runs = _by_fold(outcomes, s.name, None)
        accs = [o.accuracy for o in runs.values()]
        secs = statistics.fmean(o.seconds for o in runs.values())
        rows.append([s.name, s.describe(), pct(*mean_se(accs)), pp(*paired_gap(ref, runs)), "-", "-", f"{secs:.1f}"])
    for s in feds:
        runs = _by_fold(outcomes, s.name, epsilon)
        accs = [o.accuracy for o in runs.values()]
        any_run = next(iter(runs.values()))
        secs = statistics.fmean(o.seconds for o in runs.values())
        sigma = f"{any_run.sigma:.2f}" if any_run.sigma else "-"
        rows.append(
            [
                s.name,
                s.describe(),
                pct(*mean_se(accs)),
                pp(*paired_gap(ref, runs)),
                sigma,
                str(any_run.steps),
                f"{secs:.1f}",
            ]
        )
    c.print_table(f"validation, ε={epsilon:g} (δ={DELTA:g})", headers, rows)
    if args.output is not None or args.publish_tuning:
        folds_n = len(seeds) * FOLDS
        c.publish(
            args,
            TUNING_SECTION,
            "DP accuracy: choosing settings on validation data",
            f"{folds_n} validation splits per candidate (seeds {seeds.start}-{seeds.stop - 1} × {FOLDS} folds); "
            "mean ± standard error over splits",
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
            interpretation=TUNING_INTERPRETATION,
        )
    return 0


def benchmark(args: argparse.Namespace, desc: dict[str, str]) -> int:
    """Central vs DP federated on repeated stratified folds (the test folds)."""
    central, demo, dp, naive = CENTRAL, CENTRAL_DEMO, DP, NAIVE
    if args.quick:
        seeds, folds, epsilons = range(1), range(2), (GOAL_EPSILON,)
        central = dataclasses.replace(central, epochs=5)
        demo = dataclasses.replace(demo, epochs=5)
        dp = dataclasses.replace(dp, rounds=3)
        naive = dataclasses.replace(naive, rounds=3)
    else:
        seeds, folds, epsilons = range(args.seeds), range(FOLDS), EPSILONS
    jobs: list[Job] = []
    for seed in seeds:
        for fold in folds:
            jobs += [("central", central, None, seed, fold, False), ("central", demo, None, seed, fold, False)]
            jobs += [("dp", dp, eps, seed, fold, False) for eps in epsilons]
            jobs.append(("dp", naive, GOAL_EPSILON, seed, fold, False))
    n_folds = len(seeds) * len(folds)
    print(
        f"{len(seeds)} seed(s) × {len(folds)} fold(s) = {n_folds} test folds; {len(jobs)} runs "
        f"({'quick' if args.quick else 'full'})",
        flush=True,
    )
    if args.replay is not None:  # re-render a saved run (same settings), e.g. after a change of wording
        import json

        lines_in = args.replay.read_text().splitlines()
        meta = json.loads(lines_in[0])
        outcomes = [Outcome(**json.loads(line)) for line in lines_in[1:]]
        wall, sys.argv[1:] = meta["wall_s"], meta["argv"]
        keys = {(o.setting, o.epsilon, o.seed, o.fold) for o in outcomes}
        missing = [j for j in jobs if (j[1].name, j[2], j[3], j[4]) not in keys]
        if missing:
            raise SystemExit(f"{args.replay} lacks {len(missing)} of the runs this command needs")
    else:
        t0 = time.perf_counter()
        outcomes = run_jobs(jobs, args.jobs)
        wall = time.perf_counter() - t0
        if args.save is not None:
            import json

            with args.save.open("w") as f:
                f.write(json.dumps({"argv": sys.argv[1:], "wall_s": wall}) + "\n")
                f.writelines(json.dumps(dataclasses.asdict(o)) + "\n" for o in outcomes)

    ref = _by_fold(outcomes, central.name, None)
    ref_demo = _by_fold(outcomes, demo.name, None)
    lines: list[tuple[str, str, float | None]] = [
        (central.name, "non-private reference", None),
        (demo.name, "non-private, demo model", None),
    ]
    lines += [(dp.name, "DP federated", eps) for eps in epsilons]
    lines.append((naive.name, "DP federated", GOAL_EPSILON))
    headers = [
        "setting",
        "ε budget",
        "ε spent (max)",
        "σ",
        "steps/site",
        "folds",
        "test predictions",
        "accuracy % (mean ± SE)",
        f"gap vs {central.name} pp (mean ± SE)",
        f"gap vs {demo.name} pp (mean ± SE)",
    ]
    rows: list[list[str]] = []
    gaps: dict[tuple[str, float | None], tuple[float, float]] = {}
    demo_gaps: dict[tuple[str, float | None], tuple[float, float]] = {}
    accuracy: dict[tuple[str, float | None], tuple[float, float]] = {}
    spent_ok = True
    for name, what, eps in lines:
        runs = _by_fold(outcomes, name, eps)
        total = sum(o.total for o in runs.values())
        accuracy[(name, eps)] = mean_se([o.accuracy for o in runs.values()])
        gaps[(name, eps)] = paired_gap(ref, runs)
        demo_gaps[(name, eps)] = paired_gap(ref_demo, runs)
        row = [f"{name} ({what})"]
        if eps is None:
            row += ["∞", "-", "-", "-"]
        else:
            spent = max(o.epsilon_spent or 0.0 for o in runs.values())
            spent_ok &= spent <= eps
            sigmas = sorted({round(o.sigma, 2) for o in runs.values() if o.sigma is not None})
            steps = sorted({o.steps for o in runs.values() if o.steps is not None})
            row += [f"{eps:g}", f"{spent:.3f}", "/".join(f"{x:.2f}" for x in sigmas), "/".join(map(str, steps))]
        row += [str(len(runs)), f"{total:,}", pct(*accuracy[(name, eps)])]
        row += [pp(*gaps[(name, eps)]) if name != central.name else "0"]
        row += [pp(*demo_gaps[(name, eps)]) if name != demo.name else "0"]
        rows.append(row)
    c.print_table(f"accuracy, central vs DP federated ({SITES} non-IID sites, δ={DELTA:g})", headers, rows)
    print(f"wall time {wall / 60:.1f} min")

    goal_gap, goal_se = gaps[(dp.name, GOAL_EPSILON)]
    naive_gap, naive_se = gaps[(naive.name, GOAL_EPSILON)]
    naive_demo_gap, naive_demo_se = demo_gaps[(naive.name, GOAL_EPSILON)]
    dp_gaps = [gaps[(n, e)] for n, _, e in lines if e is not None]
    max_se = max(se for _, se in dp_gaps)
    met = goal_gap <= GOAL_GAP_PP
    per_eps = ", ".join(f"ε = {e:g}: {pp(*gaps[(dp.name, e)])} pp" for e in epsilons)
    verdict = (
        f"At ε = {GOAL_EPSILON:g} the tuned DP federation loses {goal_gap:.2f} ± {goal_se:.2f} pp against the "
        f"non-private central reference; the naive set-up loses {naive_gap:.2f} ± {naive_se:.2f} pp against the same "
        f"reference ({naive_demo_gap:.2f} ± {naive_demo_se:.2f} pp against the demo model trained centrally with the "
        f"naive settings, which is what `simulate` reports as `centralized_accuracy`). Goal ≤ {GOAL_GAP_PP} pp at "
        f"ε = {GOAL_EPSILON:g}: **{'met' if met else 'not met'}**"
        + ("" if met else f" ({(goal_gap - GOAL_GAP_PP) / max(goal_se, 1e-9):.0f} SE above it)")
        + f". Tuned gaps by budget: {per_eps}. Largest SE of a DP gap: {max_se:.2f} pp (goal ≤ {SE_GOAL_PP} pp: "
        f"{'met' if max_se <= SE_GOAL_PP else 'not met'}); every site spent at most its budget: "
        f"{'yes' if spent_ok else 'NO'}."
    )
    print("\n" + verdict)
    c.publish(
        args,
        SECTION,
        "DP accuracy: non-private central vs DP federated training (breast cancer, 5 non-IID sites)",
        f"{n_folds} test folds per setting ({len(seeds)} shuffles × {len(folds)}-fold stratified CV, seeds "
        f"{seeds.start}-{seeds.stop - 1}), every setting on every fold; mean ± standard error over folds, gaps "
        f"paired per fold (SE = std of the per-fold differences / √folds); {len(jobs)} runs in {wall / 60:.0f} min",
        desc,
        notes=[
            f"- Task: `{TASK}`, features scaled with the published ranges; the training part of each fold is sorted "
            f"by mean radius and cut into {SITES} contiguous sites (non-IID, ~91 records each); the model every site "
            "holds after the last round is scored on the whole test fold. Each DP run is a full `simulate` "
            "federation (gRPC zone on loopback, sites in process).",
            f"- DP: record-level DP-SGD (Opacus, Poisson sampling) at every site, per-site budget (ε, δ = {DELTA:g}), "
            "σ calibrated by each site to spend the budget over the planned rounds (PRV accountant; "
            "`noise_multiplier` empty). `ε spent` is the largest `epsilon_spent` of any site in any run "
            "(`summary.json`). DP noise comes from OS entropy, so DP runs are not bit-reproducible.",
            f"- `{central.name}`: {central.describe()}, trained on the union of the {SITES} sites' training data "
            "(`centralized_baseline`); the best of the non-private candidates on validation data.",
            f"- `{demo.name}`: {demo.describe()}, same data.",
            f"- `{dp.name}`: {dp.describe()} (batch 128 ≥ records per site: every step uses all of a site's "
            "records, q = 1). Same settings at every ε.",
            f"- `{naive.name}`: {naive.describe()} (the issue's naive set-up).",
            "- All settings were chosen on validation splits only (section `dp_accuracy_tuning`); the test folds "
            "were used once, for this table.",
        ],
        headers=headers,
        rows=rows,
        interpretation=verdict + " " + INTERPRETATION,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--seeds", type=int, default=9, help="shuffles of the 5-fold split (default 9: 45 test folds)")
    parser.add_argument("--jobs", type=int, default=1, choices=(1, 2), help="worker processes (default 1)")
    parser.add_argument(
        "--tune", nargs="?", const="all", default=None, help="score CANDIDATES (all, or NAME,…) on validation splits"
    )
    parser.add_argument("--tune-seeds", type=int, default=3, help="shuffles for --tune (default 3: 15 splits)")
    parser.add_argument("--tune-epsilon", type=float, default=GOAL_EPSILON)
    parser.add_argument(
        "--tune-cache", type=Path, default=None, help="JSON-lines file of --tune outcomes: reused, appended to"
    )
    parser.add_argument("--save", type=Path, default=None, help="write every run's outcome here (JSON lines)")
    parser.add_argument("--replay", type=Path, default=None, help="render the tables from a --save file, run nothing")
    parser.add_argument("--publish-tuning", action="store_true", help="write the tuning table to BENCHMARKS.md")
    args = parser.parse_args(argv)
    _quiet()
    desc = c.machine_description()
    import opacus
    import torch

    desc["python"] += f", torch {torch.__version__}, opacus {opacus.__version__}"
    if args.tune is not None:
        return tune(args, desc)
    return benchmark(args, desc)


if __name__ == "__main__":
    raise SystemExit(main())
