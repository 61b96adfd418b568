"""What ``bench/dp_accuracy.py`` trains (not a benchmark itself): settings, candidates, configs.

* :class:`Central` (non-private training on the pooled data) and :class:`Federated` (DP
  federated training) settings; the candidates ``--tune`` scores on validation data, and
  the settings chosen from them (:data:`CENTRAL`, :data:`DP`), next to the issue's naive
  set-up (:data:`NAIVE`, :data:`CENTRAL_DEMO`);
* the ``FederationConfig`` of each run (:func:`dp_config`, :func:`central_config`);
* the fixed parts of the published interpretations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CANDIDATES",
    "CENTRAL",
    "CENTRAL_CANDIDATES",
    "CENTRAL_DP",
    "CENTRAL_DEMO",
    "DELTA",
    "DP",
    "ELOW",
    "ELOW_GAP_PP",
    "EPSILONS",
    "FOLDS",
    "GOAL_EPSILON",
    "GOAL_GAP_PP",
    "INTERPRETATION",
    "LOCAL",
    "NAIVE",
    "SE_GOAL_PP",
    "SITES",
    "TASK",
    "TUNE_SEED0",
    "TUNING_INTERPRETATIONS",
    "VALIDATION_FRACTION",
    "Central",
    "Federated",
    "central_config",
    "dp_config",
    "task_options",
]

SITES = 5
FOLDS = 5
DELTA = 1e-5
EPSILONS = (1.0, 3.0, 8.0)
GOAL_EPSILON = 3.0
GOAL_GAP_PP = 0.3
ELOW, ELOW_GAP_PP = 1.0, 1.5  # the second goal: ≤ 1.5 pp at ε = 1
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
        """The settings in words."""
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
    distributed: bool = False  # record-level noise shared by all sites under CKKS (distributed_over = sites)
    sites: int = SITES  # 1: one site holds the pooled data (central DP-SGD, a trusted curator)

    def describe(self) -> str:
        """The settings in words."""
        kind, lr = self.server
        if kind == "avg":
            server = "FedAvg" if lr == 1.0 else f"FedAvg, server lr {lr:g}"
        elif kind == "momentum":
            server = f"server momentum β={self.beta1:g}, lr {lr:g}"
        else:
            server = f"server Adam lr {lr:g}, β=({self.beta1:g}, {self.beta2:g}), τ={self.tau:g}"
        where = (
            f", noise shared by the {self.sites} sites under CKKS (distributed_over {self.sites})"
            if self.distributed
            else (", one site with the pooled data (central DP-SGD)" if self.sites == 1 else "")
        )
        return (
            f"MLP {_arch(self.hidden, self.features)}, {self.rounds} rounds × {self.local_epochs} "
            "local epoch(s), batch "
            f"{self.batch_size}, local SGD lr {self.learning_rate:g} momentum {self.momentum:g}, clip "
            f"{self.max_grad_norm:g}, {server}{where}"
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
_DIST = Federated("dist-r40-lr30", (), 40, 1, 128, 1.0, 0.3, ("avg", 30.0), features=WORST, distributed=True)
_DISTRIBUTED: tuple[Federated, ...] = (
    _DIST,
    dataclasses.replace(_DIST, name="dist-r40-lr60", server=("avg", 60.0)),
    dataclasses.replace(_DIST, name="dist-r20-lr60", rounds=20, server=("avg", 60.0)),
    dataclasses.replace(_DIST, name="dist-c1-lr10", max_grad_norm=1.0, server=("avg", 10.0)),
    dataclasses.replace(_DIST, name="dist-mom-lr3", server=("momentum", 3.0)),
    dataclasses.replace(_DIST, name="dist-all-lr30", features=None),
    # fewer, larger steps (less noise per step: σ grows about as √rounds)
    dataclasses.replace(_DIST, name="dist-r10-lr120", rounds=10, server=("avg", 120.0)),
    dataclasses.replace(_DIST, name="dist-r15-lr80", rounds=15, server=("avg", 80.0)),
    dataclasses.replace(_DIST, name="dist-r20-lr90", rounds=20, server=("avg", 90.0)),
    dataclasses.replace(_DIST, name="dist-r20-lr30", rounds=20, server=("avg", 30.0)),
    dataclasses.replace(_DIST, name="dist-r30-lr45", rounds=30, server=("avg", 45.0)),
    dataclasses.replace(_DIST, name="dist-r20-mom-lr6", rounds=20, server=("momentum", 6.0)),
    dataclasses.replace(_DIST, name="dist-r20-c1-lr20", rounds=20, max_grad_norm=1.0, server=("avg", 20.0)),
)
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
    # distributed record-level noise under CKKS: the same one full-batch step per round, each site adding
    # σ/√(n−1); local lr 1 with the step size on the server keeps the encrypted values within he.value_range
    *_DISTRIBUTED,
)


# Chosen on validation data with --tune (the dp_accuracy_tuning section of BENCHMARKS.md): the best
# non-private reference (ties broken towards the simpler model) and the best DP candidate.
def _named(settings: Sequence[Any], name: str) -> Any:
    return next(s for s in settings if s.name == name)


CENTRAL = dataclasses.replace(_named(CENTRAL_CANDIDATES, "c-worst-lin-lr0.1-e100"), name="central")
DP = dataclasses.replace(_named(CANDIDATES, "dist-r20-lr60"), name="dp-tuned")
# the best setting with each site adding all of its noise (the earlier choice), for comparison
LOCAL = dataclasses.replace(_named(CANDIDATES, "worst-r40-c0.3"), name="dp-local")
# the floor of this schedule: the same DP-SGD run by one trusted curator on the pooled data (q = 1)
CENTRAL_DP = dataclasses.replace(DP, name="central-dp", sites=1, distributed=False, batch_size=512)


INTERPRETATION = (
    "Where the gap comes from, and what moved it. Sharing the noise under CKKS (each of the 5 sites adds σ/√4; any "
    "one site's view of the aggregate carries σ) takes the noise in the aggregate from √5·σ (each site adding all "
    "of its own) to √(5/4)·σ, within 12 % of what one trusted curator of the pooled data adds (`central-dp`): the "
    "federation now sits at the floor of DP-SGD itself, and what remains is what DP-SGD costs on ~455 records at "
    "this ε. At ε = 3 with 20 full-batch steps σ ≈ 6.25: noise of std σ·C/N ≈ 0.004 per coordinate on the mean "
    "clipped gradient of the pooled data, against a signal that shrinks to that size as the model converges, so "
    "the records near the boundary stay misclassified. Tried on validation data (sections `dp_accuracy_tuning` "
    "and `dp_accuracy_tuning_distributed`): fewer, larger steps (20 rounds beat 10, 15, 30 and 40), server steps "
    "of 15-120, server momentum and Adam (post-processing; no better than tuned FedAvg), clipping bounds 0.1-1 "
    "(flat, so adaptive quantile-based clipping has little to gain over the tuned bound), all 30 features and the "
    "MLP (worse: more noisy coordinates). Explored outside the benchmark in a numpy replica of the same DP-GD (not "
    "in the repository): averaging the last half of the iterates or decaying the server step (post-processing, "
    "free in ε) gained at most 0.4 pp on validation; a linear discriminant from noisy sufficient statistics lost "
    "5 pp more. The settings were tuned at ε = 3 and kept at every ε: at ε = 8 the 20-round schedule is limited by "
    "its few steps rather than by noise (the earlier 40-round schedule did better there), at ε = 1 by noise. What "
    "would move the floor: more records under one budget (the noise on the mean gradient falls as 1/N), a public "
    "pretrained starting point (as the large-model task has), or a larger ε. The `dp-local` line is the setting "
    "published before distributed noise (1.80 ± 0.27 pp then: another run of its noise, on another machine)."
)
_TUNING_INTERPRETATION = (
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


def task_options(
    hidden: Sequence[int], seed: int, fold: int, validation: bool, momentum: float, features: Sequence[int] | None
) -> dict[str, Any]:
    """The breast-cancer task's options for one fold (and its validation split)."""
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
    """The ``FederationConfig`` of a DP federation with settings ``s`` at budget ``epsilon``."""
    from fedshard.config import FederationConfig

    kind, server_lr = s.server
    record: dict[str, Any] = {"enabled": True, "noise_multiplier": None, "max_grad_norm": s.max_grad_norm}
    extra: dict[str, Any] = {}
    if s.distributed:
        record["distributed_over"] = s.sites
        extra["residency"] = {"encrypt": "all"}  # simulate makes the run's CKKS keys
    return FederationConfig.model_validate(
        {
            **extra,
            "federation": {"name": "dp-accuracy", "seed": seed, "rounds": s.rounds, "min_sites": s.sites},
            "task": {
                "target": TASK,
                "options": task_options(s.hidden, seed, fold, validation, s.momentum, s.features),
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
            "privacy": {"record_level": record, "budget": {"epsilon": epsilon, "delta": DELTA}},
            "sharding": {"tile": [256, 256]},
            "zones": [{"name": "bench-zone", "region": "EU", "endpoint": "127.0.0.1:0"}],
            "sites": [{"id": f"site-{i}", "jurisdiction": "EU"} for i in range(s.sites)],
        }
    )


def central_config(s: Central, seed: int, fold: int, validation: bool) -> Any:
    """The ``FederationConfig`` whose centralised baseline trains ``s`` on the pooled data."""
    from fedshard.config import FederationConfig

    return FederationConfig.model_validate(
        {
            "federation": {"name": "dp-accuracy-central", "seed": seed, "rounds": s.epochs, "min_sites": SITES},
            "task": {
                "target": TASK,
                "options": task_options(s.hidden, seed, fold, validation, s.momentum, s.features),
            },
            "training": {"local_epochs": 1, "batch_size": s.batch_size, "learning_rate": s.learning_rate},
            "zones": [{"name": "bench-zone", "region": "EU", "endpoint": "127.0.0.1:0"}],
            "sites": [{"id": f"site-{i}", "jurisdiction": "EU"} for i in range(SITES)],
        }
    )


_DISTRIBUTED_TUNING_INTERPRETATION = (
    "Sharing the noise is the lever. The earlier pick with each site adding all of its noise (`worst-r40-c0.3`, "
    "94.48 %) becomes 95.58 % with the same schedule and the noise shared by the 5 sites under CKKS "
    "(`dist-r40-lr30`: the step size lr 30 moves to the server, the sites take a plain lr-1 step, so their "
    "encrypted values stay within ±1): +1.1 pp. The best candidate takes 20 rounds with a server step of 60 "
    "(`dist-r20-lr60`, 96.13 %): fewer rounds need less noise per round for the same ε (σ 6.25 against 8.83). "
    "Around it: 10 or 15 rounds (92.87 %, 95.10 %) lose accuracy to too few steps; server steps of 30 or 90 "
    "(95.47 %, 95.00 %), 30 or 40 rounds (95.58 %), server momentum (95.65 %, 95.32 %), clipping at 1 "
    "(95.47 %, 94.70 %) and all 30 features (94.70 %) are no better; differences below ~1 pp are within noise "
    "(SE ≈ 0.5 pp per candidate over 30 splits; the first 15 splits had `dist-r20-lr60` at 96.78 %, the next "
    "15 pulled it back). Chosen: `dist-r20-lr60` (`configs/demo-dp-he.yaml` until the cross-table defaults). "
    "It is still 1.35 pp below the "
    "best non-private candidate on these splits (`c-worst-lin-lr0.1-e100`, 97.48 %)."
)
TUNING_INTERPRETATIONS = {
    "dp_accuracy_tuning": _TUNING_INTERPRETATION,
    "dp_accuracy_tuning_distributed": _DISTRIBUTED_TUNING_INTERPRETATION,
}
