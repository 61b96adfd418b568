"""The central DP floor at fixed clips: the most an adaptive clip could gain over fedshard's defaults.

Issue 38 asks for adaptive clipping (a private quantile of the gradient norms) if it wins across
tables. An adaptive clip follows the norms instead of a number chosen in advance; at best it
lands where the best fixed clip of each table is. This bench runs the defaults' schedule by one
trusted curator of the pooled data (``central-dp`` of ``bench/dp_tables.py``: the floor the
federation sits at) with the clip set to each of ``--clips``, on the same tables and folds, and
reports each table's best clip against the defaults' own. The best clip is chosen on the test
folds themselves (an oracle no real method has), so the gain it shows is an upper bound on what
any clip rule, adaptive or tuned, could add to the defaults on these tables.

    .venv/bin/python bench/dp_clips.py [--quick] [--json] [--clips 0.5,1,2,4] [--tables gbsg2,aids]

Full mode: 6 tables × 4 clips × 20 folds (4 shuffles × 5 folds) at ε = 3: 480 one-site runs,
about 10 minutes on 2 cores (``--processes 2``; ``--cache``, default ``runs/dp-clips/cache.json``:
a rerun runs only what is missing). ``--quick``: one shuffle (5 folds). ``--smoke`` (the test
suite's): the smallest table, one fold, clips 1 and 2, 2 rounds.

``--json`` prints ``defaults_clip``, ``clips``, ``floor_pct`` (per table, per clip),
``best_clip`` and ``best_clip_gain_pp`` (per table: the best clip's paired gain over the
defaults' clip), ``mean_best_clip_gain_pp``, ``largest_best_clip_gain_pp``, ``folds`` and ``tables``.
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import _common as c
import _dp_table_runs as runs
import yaml
from _dp_runs import mean_se, memoise_calibration, pp
from _tables import TABLES, add_fold_args, chosen_tables, write_table

SECTION = "dp_clips"
EPSILON = 3.0

Job = tuple[str, float, int, int]  # (table, clip, repeat, fold)


def _execute(job: Job, data: Path, folds: int, rounds: int | None, config: Path) -> runs.Outcome:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    memoise_calibration()
    table, _, repeat, index = job
    return runs.run_federated("central-dp", runs.Fold(data, table, repeat, index, folds), EPSILON, rounds, config)


def clip_configs(clips: list[float], folder: Path) -> dict[float, Path]:
    """The defaults' config with the clip set to each of ``clips``, written under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    configs = {}
    for clip in clips:
        data = yaml.safe_load(runs.DEMO.read_text())
        data["privacy"]["record_level"]["max_grad_norm"] = clip
        path = folder / f"demo-dp-he-clip-{clip:g}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        configs[clip] = path
    return configs


def run_all(args: argparse.Namespace, paths: dict[str, Path], configs: dict[float, Path]) -> dict[Job, runs.Outcome]:
    """Every (table, clip, fold)'s outcome, cached ones read back."""
    jobs = [
        (table, clip, repeat, fold)
        for table in args.tables
        for repeat in range(args.repeats)
        for fold in range(args.fold_count)
        for clip in args.clips
    ]
    cache: dict[str, dict[str, Any]] = (
        json.loads(args.cache.read_text()) if args.cache is not None and args.cache.exists() else {}
    )
    digests = {clip: runs.settings_digest(path) for clip, path in configs.items()}

    def key(job: Job) -> str:
        table, clip, repeat, fold = job
        return f"{table}|{clip:g}|{repeat}|{fold}|{args.rounds}|{digests[clip]}"

    todo = [job for job in jobs if key(job) not in cache]
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} cached", flush=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.processes) as pool:
        futures = {
            pool.submit(_execute, job, paths[job[0]], args.folds, args.rounds, configs[job[1]]): job for job in todo
        }
        for future in as_completed(futures):
            job, outcome = futures[future], future.result()
            cache[key(job)] = asdict(outcome)
            if args.cache is not None:
                c.save_json(args.cache, cache)
            print(f"[{time.perf_counter() - t0:5.0f}s] {job}: {outcome.accuracy:.4f}", flush=True)
    return {job: runs.Outcome(**cache[key(job)]) for job in jobs}


def summarise(args: argparse.Namespace, outcomes: dict[Job, runs.Outcome]) -> tuple[list[list[str]], dict[str, Any]]:
    """The published rows (a table each) and the headline figures."""
    folds = [(r, f) for r in range(args.repeats) for f in range(args.fold_count)]
    rows, floor, best, gain = [], {}, {}, {}
    for table in args.tables:
        accuracy = {clip: [outcomes[(table, clip, r, f)].accuracy for r, f in folds] for clip in args.clips}
        floor[table] = {f"{clip:g}": 100 * statistics.fmean(accuracy[clip]) for clip in args.clips}
        top = max(args.clips, key=lambda clip: (statistics.fmean(accuracy[clip]), clip == args.defaults_clip))
        gap = mean_se([100 * (x - y) for x, y in zip(accuracy[top], accuracy[args.defaults_clip], strict=True)])
        best[table], gain[table] = top, gap[0]
        rows.append(
            [
                table,
                *(f"{100 * m:.2f} ± {100 * se:.2f}" for m, se in (mean_se(accuracy[clip]) for clip in args.clips)),
                f"{top:g}",
                pp(*gap),
            ]
        )
    headline = {
        "defaults_clip": args.defaults_clip,
        "clips": args.clips,
        "floor_pct": floor,
        "best_clip": best,
        "best_clip_gain_pp": gain,
        "mean_best_clip_gain_pp": statistics.fmean(gain.values()),
        "largest_best_clip_gain_pp": max(gain.values()),
        "folds": len(folds),
        "tables": len(args.tables),
    }
    return rows, headline


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    add_fold_args(parser)
    parser.add_argument("--clips", default=None, help="the clips to try (default 0.5,1,2,4; --smoke 1,2)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--cache", type=Path, default=None, help="finished runs (default runs/dp-clips/cache.json)")
    args = parser.parse_args(argv)
    args.tables = chosen_tables(parser, args.tables, args.smoke)
    args.defaults_clip = float(yaml.safe_load(runs.DEMO.read_text())["privacy"]["record_level"]["max_grad_norm"])
    args.clips = sorted({float(x) for x in (args.clips or ("1,2" if args.smoke else "0.5,1,2,4")).split(",")})
    if args.defaults_clip not in args.clips:
        args.clips = sorted({*args.clips, args.defaults_clip})  # every gain is against the defaults' own clip
    if any(clip <= 0 for clip in args.clips):
        parser.error("--clips: every clip must be above 0")
    args.repeats = args.repeats or (1 if args.quick else 4)
    args.fold_count = 1 if args.smoke else args.folds
    args.rounds = 2 if args.smoke else None
    if args.cache is None and not args.quick:
        args.cache = c.REPO / "runs" / "dp-clips" / "cache.json"
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the floor at every clip on every fold of every table, publish each table's best clip."""
    args = parse_args(argv)
    folder = c.REPO / "runs" / "dp-clips"
    paths = {t.name: write_table(t, folder / "tables")[0] for t in TABLES if t.name in args.tables}
    outcomes = run_all(args, paths, clip_configs(args.clips, folder / "configs"))
    rows, headline = summarise(args, outcomes)
    mean, largest = headline["mean_best_clip_gain_pp"], headline["largest_best_clip_gain_pp"]
    c.publish(
        args,
        SECTION,
        "DP clipping: the central DP floor at fixed clips (what an adaptive clip could gain at most)",
        f"{headline['folds']} test fold(s) per table and clip, paired; {len(outcomes)} runs at ε = {EPSILON:g}",
        c.machine_description(),
        notes=[
            f"- `central-dp` of `bench/dp_tables.py` (the defaults' schedule by one curator of the pooled data: "
            f"{runs.describe(runs.DEMO)}, σ calibrated to ε = {EPSILON:g}, δ = {runs.DELTA:g}) with the clip set to "
            "each value; the same tables, folds and scoring as `dp_tables`.",
            "- *best clip*: the clip with the highest mean accuracy on the test folds (an oracle); *gain*: its paired "
            f"difference to the defaults' clip {args.defaults_clip:g}, mean ± standard error.",
        ],
        headers=["table", *(f"clip {clip:g} %" for clip in args.clips), "best clip", "gain over the defaults' pp"],
        rows=rows,
        interpretation=(
            f"Each table's best clip, chosen on its test folds, beats the defaults' clip {args.defaults_clip:g} by "
            f"{mean:+.2f} pp on the mean over the tables (largest {largest:+.2f} pp). A clip rule that settles on one "
            "clip per table (a private quantile of the norms) gains at most that, and pays for its noisy quantile "
            "with more noise on every step; a rule that moves the clip from round to round is not bounded by this."
        ),
        headline=headline,
        console_title="DP clipping: the floor at fixed clips",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
