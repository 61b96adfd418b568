"""Running the trainings of ``bench/dp_accuracy.py`` (not a benchmark itself), and their statistics.

* :class:`Outcome`: one training run scored on one fold;
* :func:`run_jobs`: central baselines and DP federations, in this process or in worker
  processes, with an optional cache of earlier outcomes (``--tune-cache``);
* paired gaps between settings over the folds both ran on, mean ± standard error.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from _dp_settings import SITES, TASK, Central, Federated, central_config, dp_config, task_options

__all__ = [
    "Job",
    "Outcome",
    "by_fold",
    "execute",
    "job_key",
    "load_cache",
    "mean_se",
    "memoise_calibration",
    "paired_gap",
    "pct",
    "pp",
    "quiet",
    "run_central",
    "run_federated",
    "run_jobs",
    "save_cache",
]


def quiet() -> None:
    """Only errors from logging, no warnings (the runs print their own progress)."""
    logging.disable(logging.WARNING)  # ERROR and above only
    warnings.filterwarnings("ignore")


_CALIBRATIONS: list[tuple[tuple[Any, ...], float]] = []  # (calibrate_noise args, σ), every call


@functools.cache
def memoise_calibration() -> None:
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
        """Fraction of the scored records classified correctly."""
        return self.correct / self.total


def run_central(s: Central, seed: int, fold: int, validation: bool) -> Outcome:
    """Train ``s`` on the pooled data of one fold and score it on the fold's test (or validation) data."""
    from fedshard.simulate.baseline import centralized_baseline

    quiet()
    t0 = time.perf_counter()
    m = centralized_baseline(central_config(s, seed, fold, validation))
    assert m.accuracy is not None
    correct = round(m.accuracy * m.num_examples)
    return Outcome(s.name, None, seed, fold, correct, m.num_examples, seconds=time.perf_counter() - t0)


def run_federated(s: Federated, epsilon: float, seed: int, fold: int, validation: bool) -> Outcome:
    """Run a DP federation with settings ``s`` at budget ``epsilon`` on one fold; score its final model."""
    from fedshard.protocol.messages import PrivacyStatus
    from fedshard.simulate.run import simulate

    quiet()
    memoise_calibration()
    config = dp_config(s, epsilon, seed, fold, validation)
    _CALIBRATIONS.clear()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dp-accuracy-") as out:
        summary = simulate(config, out)
    seconds = time.perf_counter() - t0
    if summary["rounds"] != s.rounds or any(site.get("status") == PrivacyStatus.REFUSED for site in summary["sites"]):
        raise RuntimeError(f"{s.name} ε={epsilon} seed {seed} fold {fold}: {summary['stopped_reason']}")
    total = num_test(s.hidden, seed, fold, validation)
    correct = round(summary["final_accuracy"] * total)
    spent = max(site["epsilon_spent"] for site in summary["sites"])
    # (target ε, δ, q, steps, accountant) → σ, one call per site; sites differ by a record at most
    sigma = min(sg for _, sg in _CALIBRATIONS) if _CALIBRATIONS else None
    steps = max(args[3] for args, _ in _CALIBRATIONS) if _CALIBRATIONS else None
    return Outcome(s.name, epsilon, seed, fold, correct, total, spent, sigma, steps, seconds)


@functools.cache
def num_test(hidden: tuple[int, ...], seed: int, fold: int, validation: bool) -> int:
    """Records a run on this fold is scored on."""
    from fedshard.task import Partition, load_task

    task = load_task(TASK, task_options(hidden, seed, fold, validation, 0.9, None))
    return task.load_data(Partition(None, SITES, seed)).num_test


Job = tuple[str, Any, float | None, int, int, bool]  # (kind, settings, ε, seed, fold, validation)


def execute(job: Job) -> Outcome:
    """Run one job (in this process or in a worker)."""
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
        save_cache(cache, [jobs[len(outcomes)]], [o])
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


def job_key(job: Job) -> str:
    """The job, with its settings' non-default fields (so that a new field does not void the cache)."""
    kind, setting, epsilon, seed, fold, validation = job
    fields = {
        f.name: getattr(setting, f.name)
        for f in dataclasses.fields(setting)
        if f.default is dataclasses.MISSING or getattr(setting, f.name) != f.default
    }
    return repr((kind, type(setting).__name__, sorted(fields.items()), epsilon, seed, fold, validation))


def load_cache(path: Path | None) -> dict[str, Outcome]:
    """Outcomes of earlier --tune runs (JSON lines), by job (the settings' full repr)."""
    import json

    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        out[entry["key"]] = Outcome(**entry["outcome"])
    return out


def save_cache(path: Path | None, jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> None:
    """Append the outcomes of ``jobs`` to ``path`` (JSON lines; nothing without a path)."""
    import json

    if path is None:
        return
    with path.open("a") as f:
        for job, o in zip(jobs, outcomes, strict=True):
            f.write(json.dumps({"key": job_key(job), "outcome": dataclasses.asdict(o)}) + "\n")


# statistics ------------------------------------------------------------------------------
def by_fold(outcomes: Sequence[Outcome], name: str, epsilon: float | None) -> dict[tuple[int, int], Outcome]:
    """The outcomes of setting ``name`` at ``epsilon``, by (seed, fold)."""
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
    """A fraction ± its SE, in percent."""
    return f"{100 * m:.2f} ± {100 * se:.2f}"


def pp(m: float, se: float) -> str:
    """A gap ± its SE, in percentage points."""
    return f"{m:+.2f} ± {se:.2f}"
