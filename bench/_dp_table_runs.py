"""The runs of ``bench/dp_tables.py`` (not a benchmark itself): four ways to train on one fold of a
table, each scored on the whole test fold by this bench.

* ``central``: non-private logistic regression on the pooled training data (SGD lr 0.1,
  momentum 0.9, batch 32, 100 epochs: textbook settings);
* ``central-dp``: the floor: the DP-SGD schedule of fedshard's defaults run by one trusted
  curator on the pooled data (one site, σ calibrated to ε over the schedule);
* ``defaults``: ``configs/demo-dp-he.yaml`` (or the config ``--defaults`` names) with the
  table swapped in and nothing else changed (five EU sites with label skew, record-level
  noise shared under CKKS): fedshard's recommended private setting, as a user would take it;
* ``per-site``: plain per-site DP-SGD with textbook settings: an MLP (64-32), batch 64, local
  SGD lr 0.05, clip 1, 20 rounds of one local epoch, FedAvg, each site adding all of its noise
  with σ calibrated to its budget.

Every DP run's ledgers are read back: the largest ε any site spent is part of the outcome.
The federation's model is read from a site's store (every site holds the one averaged model)
and scored on the whole test fold, so each record counts once.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c

DEMO = c.REPO / "configs" / "demo-dp-he.yaml"
DELTA = 1e-5
METHODS = ("central", "central-dp", "defaults", "per-site")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One method trained on one fold of one table, scored on the whole test fold."""

    method: str
    table: str
    epsilon: float | None
    repeat: int
    fold: int
    correct: int
    total: int
    epsilon_spent: float = 0.0
    seconds: float = 0.0
    aborted: int = 0
    """Rounds the federation aborted (a zone's bound on update norms: a site of a few records adds
    noise far above the others' in its first round, before the zones hold a norm reference)."""

    @property
    def accuracy(self) -> float:
        """Fraction of the test fold classified correctly."""
        return self.correct / self.total


@dataclasses.dataclass(frozen=True)
class Fold:
    """One test fold of one table: fold ``index`` of ``count`` in shuffle ``repeat``."""

    data: Path
    table: str
    repeat: int
    index: int
    count: int

    @property
    def seed(self) -> int:
        """The federation's seed on this fold."""
        return self.repeat * self.count + self.index


def task_options(data: Path, repeat: int, fold: int, folds: int, **extra: Any) -> dict[str, Any]:
    """The tabular task over ``data`` for one fold of repeat ``repeat``."""
    return {
        "data": str(data),
        "label_column": "outcome",
        "labels": ["0", "1"],
        "folds": folds,
        "fold": fold,
        "split_seed": repeat,
        **extra,
    }


def _options(fold: Fold, **extra: Any) -> dict[str, Any]:
    return task_options(fold.data, fold.repeat, fold.index, fold.count, **extra)


def _loaded(path: Path) -> dict[str, Any]:
    from fedshard.config.loader import load_federation

    return load_federation(path).model_dump(mode="json")


def config(method: str, fold: Fold, epsilon: float, rounds: int | None, defaults: Path = DEMO) -> Any:
    """The federation of ``method`` (``central-dp``, ``defaults`` or ``per-site``) on ``fold``;
    ``defaults``: the config whose private settings ``defaults`` and ``central-dp`` take."""
    from fedshard.config import FederationConfig

    cfg = _loaded(DEMO if method == "per-site" else defaults)
    cfg["federation"].update(seed=fold.seed, name=f"dp-tables-{method}")
    if rounds is not None:
        cfg["federation"]["rounds"] = rounds
    cfg["task"] = {"target": "fedshard.tasks.tabular:classification", "options": _options(fold)}
    cfg["privacy"]["budget"]["epsilon"] = epsilon
    if method == "central-dp":  # one curator: no distribution, no encryption needed
        cfg["sites"] = cfg["sites"][:1]
        cfg["federation"]["min_sites"] = 1
        cfg["privacy"]["record_level"]["distributed_over"] = None
        cfg.pop("residency", None)
    elif method == "per-site":
        cfg["task"]["options"]["hidden"] = [64, 32]
        cfg["training"] = {"local_epochs": 1, "batch_size": 64, "learning_rate": 0.05}
        cfg["privacy"]["record_level"].update(distributed_over=None, max_grad_norm=1.0)
        cfg.pop("residency", None)
    return FederationConfig.model_validate(cfg)


def run_federated(method: str, fold: Fold, epsilon: float, rounds: int | None, defaults: Path = DEMO) -> Outcome:
    """Simulate ``method``'s federation on ``fold``; score the model a site holds on the test fold."""
    from fedshard.assembly.sites import STORE_KEYS_DIR, site_model
    from fedshard.simulate.run import simulate

    cfg = config(method, fold, epsilon, rounds, defaults)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dp-tables-") as scratch:
        out = Path(scratch) / "run"
        summary = simulate(cfg, out)
        aborted = len(summary["aborted_rounds"])
        if summary["stopped_reason"] or summary["rounds"] + aborted != cfg.federation.rounds:
            where = f"{method} {fold.table} ε={epsilon:g} fold {fold.repeat}.{fold.index}"
            raise RuntimeError(f"{where}: {summary['rounds']} rounds: {summary['stopped_reason']}")
        site = cfg.sites[0].id
        model, _ = site_model(cfg, out / "sites" / site, out / STORE_KEYS_DIR / f"{site}.kek")
    spent = max(float(s.get("epsilon_spent") or 0.0) for s in summary["sites"])
    correct, total = _score(model, fold)
    seconds = time.perf_counter() - t0
    return Outcome(method, fold.table, epsilon, fold.repeat, fold.index, correct, total, spent, seconds, aborted)


def run_central(fold: Fold, epochs: int = 100) -> Outcome:
    """The non-private reference on the pooled training data of ``fold``."""
    import torch

    from fedshard.task import Partition, TrainSettings
    from fedshard.tasks.tabular.task import Classification

    t0 = time.perf_counter()
    task = Classification(**_options(fold, momentum=0.9))
    pooled = task.load_data(Partition(None, 5, fold.repeat))
    torch.manual_seed(fold.seed)
    model = task.build_model()
    task.train(model, pooled, TrainSettings(epochs, 32, 0.1, fold.seed))
    correct, total = _score(model, fold)
    seconds = time.perf_counter() - t0
    return Outcome("central", fold.table, None, fold.repeat, fold.index, correct, total, 0.0, seconds)


def _score(model: Any, fold: Fold) -> tuple[int, int]:
    """(correct, records) of ``model`` on the whole test fold."""
    from fedshard.task import Partition
    from fedshard.tasks.tabular.task import Classification

    task = Classification(**_options(fold))
    metrics = task.evaluate(model, task.load_data(Partition(None, 5, fold.repeat)))
    assert metrics.accuracy is not None
    return round(metrics.accuracy * metrics.num_examples), metrics.num_examples


def majority_rate(data: Path) -> float:
    """The share of the table's records in its most common class (what always guessing it scores)."""
    import numpy as np

    from fedshard.tasks.tabular.task import Classification

    labels = Classification(**task_options(data, 0, 0, 5)).records.y
    return float(np.bincount(labels).max() / len(labels))


RUN_FREE_SECTIONS = ("store", "deployment")
"""Sections of a config that no run of this bench reads: how a site's store keeps shards at rest
and its base (a tabular model has none to stream), and where deployed parts run."""


def settings_digest(defaults: Path) -> str:
    """What identifies the config ``defaults`` in the cache: a digest of its loaded settings (its
    comments and layout do not count), less :data:`RUN_FREE_SECTIONS`, so that a new field there
    (a store option) does not make every cached run look new."""
    import hashlib
    import json

    settings = {k: v for k, v in _loaded(defaults).items() if k not in RUN_FREE_SECTIONS}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def describe(defaults: Path) -> str:
    """The private settings of the config ``defaults``, in words."""
    cfg = _loaded(defaults)
    t, record = cfg["training"], cfg["privacy"]["record_level"]
    server = t["server_optimizer"]
    step = (
        f"server step {server['learning_rate']:g}"
        if server["kind"] == "avg"
        else f"server {server['kind']} lr {server['learning_rate']:g}"
    )
    batch = "full batch" if t["batch_size"] == "all" else f"batch {t['batch_size']}"
    return (
        f"{batch}, local lr {t['learning_rate']:g}, clip {record['max_grad_norm']:g}, {step}, "
        f"{cfg['federation']['rounds']} rounds"
    )
