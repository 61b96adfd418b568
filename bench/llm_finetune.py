"""Federated LoRA fine-tuning over a frozen, sealed, low-precision base: issue 15's goals.

Accuracy (``--size``, default ``small``: the 2.9 M-parameter base; ``--quick``: ``tiny``).
Every run is fedshard's own in-process simulation (``fedshard.simulate.run.simulate``:
real gRPC zones on loopback, sites in this process) of ``configs/demo-llm.yaml`` (6 sites,
2 zones, FFA-LoRA r=8, label-skewed Dirichlet(1.0) private splits), with
``store.base: int8``: every site seals the frozen base in its store and trains through
it, streamed and dequantised a few layers ahead, as the product does. Per seed
(``federation.seed``: the LoRA initialisation, the sites' Dirichlet partition and the
shuffling follow it):

* **federated**: the run's final accuracy on the whole test set (5,586 tweets; the
  sites' test slices partition it, and the coordinator weighs their accuracies by
  examples);
* **central**: the summary's ``centralized_accuracy``: the same LoRA on the pooled
  private data, ``rounds × local_epochs`` epochs, the same seed and training settings
  but its own learning rate (``--central-lr``), the fp32 base resident
  (``fedshard.simulate.baseline``);
* **DP ε=8**, **DP ε=3**: the federated run with record-level DP-SGD (Opacus on the
  adapters) at every site, budget ε per site over the whole run, δ = 1e-5, σ calibrated
  by each site to spend it (``noise_multiplier`` empty), clipping ``--dp-clip``, the same
  training settings. Its central reference is the same seed's non-private central run
  (the DP runs do not train their own: ``centralized_baseline`` is skipped there).
* **regional**: the demo's residency as it is: 3 EU sites, whose ``personal`` adapters
  are averaged into an EU regional model, and 3 US sites, averaged into a global one.
  The federated and DP runs put all six sites in the EU, so one model averages every
  site's adapters: the federated LoRA that the goal compares with the central one. The
  regional runs show what splitting the federation by residency costs on top (each
  model learns from half of the data).

Gaps are federated − central per seed, in percentage points: mean ± standard error
(stdev of the paired differences / √seeds; 0 for one seed). Goal: fed_vs_central_pp ≥
−0.3 pp, on ≥ 2,000 test predictions. The first run pretrains the base (the vendor's
step, cached under ``--cache-dir``, default ``runs/llm-base`` like the demo; about a
minute for ``small``).

System figures, for the 118 M base (``SIZES["large"]``; ``--quick``: ``small``):

* ``streamed_step_ratio``, ``base_memory_fraction``: ``bench/llm_stream.py``'s
  measurement (its ``--quick`` mode with ``--quick``), int8: a training step streamed
  from the sealed int8 store over the step with the fp32 base resident (goal ≤ 1.15),
  and the base's memory during training over its fp32 size (goal ≤ 0.30); see that
  bench for how each is measured;
* ``fedshard_share``: a short simulation of the 118 M task (2 sites of the demo, one EU
  and one US, ``--share-rounds`` rounds, ``--share-examples`` private examples,
  ``store.base: int8``, a test set of ``--share-test-fraction`` of the corpus so that
  evaluating does not swamp the round). The base is *not* pretrained
  (``pretrain_epochs: 0``): a system figure needs the base's size, not its accuracy.
  The event log records only when each round ends (``at`` of the start and round
  events), not the sites' training time, so the bench times the task itself: every
  call of the task's ``train`` and ``evaluate`` (wall clock, the sites run one at a
  time). Share = (round wall time − time inside those calls) / round wall time, for
  the last round; the round's window runs from the previous event (the start event
  for round 1) to the round's event. What the task calls hold: forward, backward, Adam,
  batching, *and* the base's streaming, which runs inside forward and backward (its
  cost is ``streamed_step_ratio``; the time the training thread waited for a weight is
  shown too). What the share holds: opening and closing the round at the zones, the
  site's catch-up (fetching and applying the aggregates, decrypting and verifying its
  adapter shards from its store, committing them), computing, signing and pushing the
  update, the coordinator's work, and any other process's load on the machine. The
  run's central baseline is skipped (it is no part of a round). Goal ≤ 0.10.
* ``base_bytes_released``: what the zones received (``bytes_up`` of every round of
  every run above) minus the participating sites × the adapter bytes (the float bytes
  of the model's ``trained_state``, the only tensors of the shard plan). Goal: 0. The
  adapter bytes per site per round are shown for each size.

    nice -n 19 .venv/bin/python bench/llm_finetune.py [--quick] [--json] [--seeds N] [--rounds R]
        [--local-epochs E] [--private-examples N] [--lr LR] [--central-lr LR] [--batch B] [--size S] [--no-dp]
        [--output FILE]

The learning rates are chosen on validation data by ``bench/llm_lr_sweep.py`` (its picks are the defaults).

Full mode (5 seeds × federated + central + DP ε=8 + DP ε=3 at ``small``, 3 rounds, 8,000 private
examples; the 118 M share run; llm_stream's full run): about 35 minutes on a quiet 2-core machine (a
``small`` round of 6 sites: ~25 s, with or without DP; ~2 minutes more the first time, to pretrain the
``small`` base and write the 118 M one). ``--quick``: about 3 minutes, half of it llm_stream's quick run.
``--smoke`` (the test suite's): the same paths on 300 private examples, a 2 % test set and a
32-example share run.

``--json`` prints one JSON object last: ``fed_vs_central_pp``, ``fed_vs_central_se_pp``,
``test_predictions``, ``base_memory_fraction``, ``streamed_step_ratio``, ``fedshard_share``,
``base_bytes_released``, ``dp_eps8_vs_central_pp`` / ``_se_pp``, ``dp_eps3_vs_central_pp`` /
``_se_pp`` (null when not run: ``--quick`` runs ε = 8 only, ``--no-dp`` neither), the per-seed
accuracies (``seeds``, ``federated_accuracy``, ``central_accuracy``, ``dp_eps8_accuracy``,
``dp_eps3_accuracy``), ``size``, ``adapter_bytes_per_site_round`` (accuracy runs' size) and
``share_adapter_bytes_per_site_round`` (the share run's size).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import _common as c
import _llm_finetune_report as parts
import llm_stream
from _llm_finetune_runs import DELTA, EPSILONS, Run, Share, TaskClock, no_central, quiet

SECTION = "llm_finetune"
DEMO = c.REPO / "configs" / "demo-llm.yaml"


# configurations ---------------------------------------------------------------------------------------
def demo_data() -> dict[str, Any]:
    """configs/demo-llm.yaml, as plain data."""
    from fedshard.config.loader import load_federation

    return load_federation(DEMO).model_dump(mode="json")


def accuracy_config(args: argparse.Namespace, seed: int, epsilon: float | None, *, pooled: bool = True) -> Any:
    """The demo federation at ``args``' size and training settings, ``seed``, the base sealed int8;
    record-level DP at ``epsilon`` per site when given. ``pooled``: every site in the EU, so
    the adapters of all six are averaged into one model (else the demo's 3 EU + 3 US sites:
    an EU regional model and a global one)."""
    from fedshard.config import FederationConfig

    data = demo_data()
    if pooled:
        for site in data["sites"]:
            site["jurisdiction"] = "EU"
    data["federation"].update(seed=seed, rounds=args.rounds, round_timeout_s=3600.0)
    data["task"]["options"].update(size=args.size, cache_dir=str(args.cache_dir))
    if args.private_examples is not None:
        data["task"]["options"]["private_examples"] = args.private_examples
    if getattr(args, "test_fraction", None):
        data["task"]["options"]["test_fraction"] = args.test_fraction
    data["training"].update(local_epochs=args.local_epochs, learning_rate=args.lr, batch_size=args.batch)
    data["store"]["base"] = "int8"
    if epsilon is not None:
        data["privacy"] = {
            "record_level": {
                "enabled": True,
                "noise_multiplier": None,
                "max_grad_norm": args.dp_clip,
            },
            "budget": {"epsilon": epsilon, "delta": DELTA},
        }
    return FederationConfig.model_validate(data)


def share_config(args: argparse.Namespace) -> Any:
    """Two of the demo's sites (one EU, one US) on the 118 M task, the base not pretrained, sealed int8."""
    from fedshard.config import FederationConfig

    data = demo_data()
    eu = next(s for s in data["sites"] if s["jurisdiction"] == "EU")
    us = next(s for s in data["sites"] if s["jurisdiction"] == "US")
    data["sites"] = [eu, us]
    data["federation"].update(seed=0, rounds=args.share_rounds, min_sites=2, round_timeout_s=3600.0)
    data["task"]["options"].update(
        size=args.share_size,
        cache_dir=str(args.cache_dir),
        pretrain_epochs=0,
        private_examples=args.share_examples,
        test_fraction=args.share_test_fraction,
    )
    data["training"].update(local_epochs=1, batch_size=args.batch)
    data["store"]["base"] = "int8"
    return FederationConfig.model_validate(data)


def adapter_bytes(config: Any) -> int:
    """Bytes of one site's released tensors: the float tensors of the model's ``trained_state``
    (built on the meta device: no values, no pretraining)."""
    import torch

    from clients.tasks.llm.data import CLASSES
    from clients.tasks.llm.model import add_lora, build_classifier
    from fedshard.task import load_task, trained_state

    task: Any = load_task(config.task.target, dict(config.task.options))
    with torch.device("meta"):
        model = add_lora(build_classifier(task.cfg, len(CLASSES)), task.rank, task.lora_alpha, task.scheme)
    return sum(t.numel() * t.element_size() for t in trained_state(model).values() if t.is_floating_point())


def test_predictions(config: Any) -> int:
    """Examples the federated and the central model are scored on (the whole test set)."""
    from fedshard.task import Partition, load_task

    task = load_task(config.task.target, dict(config.task.options))
    return task.load_data(Partition(None, config.num_partitions, config.federation.seed)).num_test


# running ---------------------------------------------------------------------------------------------


def simulate_run(kind: str, seed: int, config: Any, central: bool = True) -> Run:
    """Simulate ``config`` in a scratch folder; check it ran every round."""
    from fedshard.simulate.run import simulate

    nbytes = adapter_bytes(config)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedshard-bench-llm-") as out:
        with contextlib.nullcontext() if central else no_central():
            summary = simulate(config, out)
        events = [json.loads(line) for line in (Path(out) / "events.jsonl").read_text().splitlines() if line]
    seconds = time.perf_counter() - t0
    if summary["rounds"] != config.federation.rounds or summary["stopped_reason"]:
        raise SystemExit(f"{kind} seed {seed}: {summary['rounds']} rounds; stopped: {summary['stopped_reason']}")
    return Run(kind, seed, summary, seconds, nbytes, events)


def accuracy_runs(args: argparse.Namespace) -> list[Run]:
    """Per seed: the non-private federation (with its central baseline), the DP federations, then
    the demo's regional federation (unless ``--no-regional``)."""
    runs = []
    t0 = time.perf_counter()
    kinds: list[tuple[str, float | None, bool]] = [("federated", None, True)]
    kinds += [(f"dp_eps{eps:g}", eps, True) for eps in args.epsilons]
    kinds += [] if args.no_regional else [("regional", None, False)]
    for seed in args.seed_values:
        for kind, eps, pooled in kinds:
            config = accuracy_config(args, seed, eps, pooled=pooled)
            own_central = kind == "federated" and args.central_lr == args.lr
            run = simulate_run(kind, seed, config, central=own_central)
            if kind == "federated" and not own_central:
                run.summary["centralized_accuracy"] = central_accuracy(config, args.central_lr)
            runs.append(run)
            s = run.summary
            extra = f"  central {s['centralized_accuracy']:.4f}" if kind == "federated" else ""
            if eps is not None:
                extra = f"  ε spent ≤ {max(site['epsilon_spent'] for site in s['sites']):.2f}"
            print(
                f"[{time.perf_counter() - t0:6.0f}s] seed {seed} {run.kind:<10} accuracy {run.accuracy:.4f}{extra}"
                f"  ({run.seconds:.0f} s)",
                flush=True,
            )
    return runs


def central_accuracy(config: Any, learning_rate: float) -> float:
    """The central LoRA of ``config`` (``simulate``'s baseline) trained at ``learning_rate`` instead."""
    from fedshard.simulate.baseline import centralized_baseline

    training = config.training.model_copy(update={"learning_rate": learning_rate})
    metrics = centralized_baseline(config.model_copy(update={"training": training}))
    assert metrics.accuracy is not None
    return float(metrics.accuracy)


def share_run(args: argparse.Namespace) -> tuple[Run, Share]:
    """The short 118 M simulation, the task's calls timed."""
    config = share_config(args)
    clock = TaskClock()
    with clock.installed():
        run = simulate_run("share", 0, config, central=False)
    marks = [e["at"] for e in run.events if e["event"] in ("start", "round")]
    windows = list(itertools.pairwise(marks))
    shares = [(b - a - clock.inside(a, b)) / (b - a) for a, b in windows]
    start, end = windows[-1]
    bases = clock.bases
    share = Share(
        round_s=end - start,
        train_s=clock.inside(start, end, "train"),
        evaluate_s=clock.inside(start, end, "evaluate"),
        # held codes are dequantised in the training thread: all of it is waiting
        wait_s=sum(b.held_stats.seconds if b.held_bytes else b.stats.wait_s for b in bases),
        fetch_s=sum(b.held_stats.seconds if b.held_bytes else b.stats.fetch_s for b in bases),
        rounds_s=[b - a for a, b in windows],
        shares=shares,
    )
    return run, share


def stream_figures(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """bench/llm_stream.py's measurement (its --quick with --quick) and headline; the size it used."""
    stream_args = llm_stream.parse_args(["--smoke"] if args.smoke else ["--quick"] if args.quick else [])
    size = "small" if args.quick else "large"
    m = llm_stream.measure(stream_args, size)
    runs = m["runs"]
    figs = {v: llm_stream.derive(runs["resident"], runs[v]) for v in llm_stream.STREAMED}
    return llm_stream._headline(runs, figs, m["fetch_ns"]), size


# the report --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--seeds", type=int, default=None, help="federation seeds 0..N-1 (default 5; --quick 1)")
    parser.add_argument("--size", default=None, help="accuracy runs' model: tiny, small (default; --quick tiny)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3, the demo's; --quick 1)")
    parser.add_argument("--local-epochs", type=int, default=1, help="local epochs per round (default 1)")
    parser.add_argument(
        "--private-examples", type=int, default=None, help="private pool (default 8000, the demo's; --quick 2000)"
    )
    parser.add_argument(
        "--lr", type=float, default=5e-3, help="federated Adam learning rate (default 5e-3: bench/llm_lr_sweep)"
    )
    parser.add_argument(
        "--central-lr",
        type=float,
        default=2e-3,
        help="the central LoRA's Adam learning rate (default 2e-3, its validation pick in bench/llm_lr_sweep)",
    )
    parser.add_argument("--batch", type=int, default=64, help="batch size (default 64, the demo's)")
    parser.add_argument("--dp-clip", type=float, default=1.0, help="DP-SGD clipping bound (default 1.0)")
    parser.add_argument("--no-dp", action="store_true", help="skip the DP runs")
    parser.add_argument(
        "--no-regional", action="store_true", help="skip the runs with the demo's EU/US regional adapters"
    )
    parser.add_argument("--cache-dir", type=Path, default=c.REPO / "runs" / "llm-base", help="pretrained bases")
    parser.add_argument("--share-rounds", type=int, default=1, help="rounds of the fedshard_share run (default 1)")
    parser.add_argument("--share-examples", type=int, default=256, help="its private examples (default 256)")
    parser.add_argument(
        "--share-test-fraction", type=float, default=0.01, help="its test set, of the corpus (default 0.01)"
    )
    args = parser.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 5)
    args.seed_values = list(range(args.seeds))
    args.size = args.size or ("tiny" if args.quick else "small")
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.private_examples is None:
        args.private_examples = 300 if args.smoke else 2000 if args.quick else 8000
    if args.smoke:  # every code path, on a few hundred examples
        args.share_examples, args.test_fraction = 32, 0.02
    args.epsilons = () if args.no_dp else ((EPSILONS[0],) if args.quick else EPSILONS)
    args.no_regional = args.no_regional or args.quick
    args.share_size = "small" if args.quick else "large"
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
    quiet()
    ticks0 = c.cpu_ticks()
    started = time.perf_counter()
    runs = accuracy_runs(args)
    accuracy_s = time.perf_counter() - started
    t0 = time.perf_counter()
    shared, share = share_run(args)
    share_s = time.perf_counter() - t0
    print(
        f"share run ({args.share_size}): round {share.round_s:.1f} s, train {share.train_s:.1f} s, evaluate "
        f"{share.evaluate_s:.1f} s: share {share.share:.3f}  ({share_s:.0f} s)",
        flush=True,
    )
    t0 = time.perf_counter()
    stream, stream_size = stream_figures(args)
    stream_s = time.perf_counter() - t0

    central = {r.seed: float(r.summary["centralized_accuracy"]) for r in runs if r.kind == "federated"}
    fed, fed_m, fed_se = parts.gaps(runs, "federated", central)
    assert fed_m is not None and fed_se is not None
    dp = {eps: parts.gaps(runs, f"dp_eps{eps:g}", central) for eps in EPSILONS}
    regional = parts.gaps(runs, "regional", central)
    n_test = test_predictions(accuracy_config(args, 0, None))
    all_runs = [*runs, shared]
    released = sum(r.extra_bytes for r in all_runs)
    adapters = runs[0].adapter_bytes
    headline: dict[str, Any] = {
        "fed_vs_central_pp": round(fed_m, 4),
        "fed_vs_central_se_pp": round(fed_se, 4),
        "test_predictions": n_test,
        "base_memory_fraction": stream["base_memory_fraction"],
        "streamed_step_ratio": stream["streamed_step_ratio"],
        "fedshard_share": round(share.share, 4),
        "base_bytes_released": released,
        **{
            f"dp_eps{eps:g}_vs_central_{what}": None if v is None else round(v, 4)
            for eps, (_, m, se) in dp.items()
            for what, v in (("pp", m), ("se_pp", se))
        },
        "regional_vs_central_pp": None if regional[1] is None else round(regional[1], 4),
        "regional_vs_central_se_pp": None if regional[2] is None else round(regional[2], 4),
        "seeds": args.seed_values,
        "federated_accuracy": fed,
        "regional_accuracy": regional[0],
        "central_accuracy": [central[s] for s in args.seed_values],
        **{f"dp_eps{eps:g}_accuracy": accs for eps, (accs, _, _) in dp.items()},
        "size": args.size,
        "adapter_bytes_per_site_round": adapters,
        "share_adapter_bytes_per_site_round": shared.adapter_bytes,
    }

    rows = parts.goal_rows(args, (fed_m, fed_se), dp, regional, n_test, (stream, stream_size), share, released)
    notes = parts.notes(
        args, runs, central, dp, regional, shared, share, stream, stream_size, (accuracy_s, share_s, stream_s)
    )
    notes.append(c.steal_note(ticks0))
    dp_runs = (", DP ε = " + " and ".join(f"{e:g}" for e in args.epsilons)) if args.epsilons else ""
    interpretation = parts.interpretation(args, fed_m, fed_se, dp, regional, share, stream, released, adapters, shared)
    c.publish(
        args,
        SECTION,
        "Federated LoRA fine-tuning over a sealed low-precision base (issue 15)",
        f"{args.seeds} seed(s) × (federated, central{dp_runs}); one short {args.share_size} federation; "
        "llm_stream's step and memory runs",
        None,
        notes=notes,
        headers=["goal", "measured", "target", "met"],
        rows=rows,
        interpretation=interpretation,
        headline=headline,
        console_title="LoRA fine-tuning",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
