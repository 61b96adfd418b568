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
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import _common as c
import llm_stream
from _dp_runs import mean_se

SECTION = "llm_finetune"
DEMO = c.REPO / "configs" / "demo-llm.yaml"
DELTA = 1e-5
EPSILONS = (8.0, 3.0)
GAP_GOAL_PP, SHARE_GOAL = 0.3, 0.10
TEST_GOAL = 2000


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
def quiet() -> None:
    """Errors only from logging and no warnings (the bench prints its own progress)."""
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")


@contextlib.contextmanager
def no_central() -> Iterator[None]:
    """``simulate`` without its central baseline (a run whose reference is another run's)."""
    import fedshard.simulate.run as run
    from fedshard.task import Metrics

    original = vars(run)["centralized_baseline"]
    setattr(run, "centralized_baseline", lambda config, rounds=None: Metrics(num_examples=0, loss=0.0))  # noqa: B010
    try:
        yield
    finally:
        setattr(run, "centralized_baseline", original)  # noqa: B010


@dataclass
class TaskClock:
    """Wall-clock spans of every call of the LLM task's ``train`` and ``evaluate``, and the
    streamed bases made meanwhile (their wait counters)."""

    spans: list[tuple[str, float, float]] = field(default_factory=list)
    bases: list[Any] = field(default_factory=list)

    @contextlib.contextmanager
    def installed(self) -> Iterator[TaskClock]:
        from clients.tasks.llm import LlmTask
        from fedshard.store.streamed import StreamedBase

        originals = {name: getattr(LlmTask, name) for name in ("train", "evaluate")}
        base_init = StreamedBase.__init__

        def timed(name: str) -> Any:
            def call(task: Any, *a: Any, **k: Any) -> Any:
                t0 = time.time()
                try:
                    return originals[name](task, *a, **k)
                finally:
                    self.spans.append((name, t0, time.time()))

            return call

        def recording_init(base: Any, *a: Any, **k: Any) -> None:
            base_init(base, *a, **k)
            self.bases.append(base)

        for name in originals:
            setattr(LlmTask, name, timed(name))
        setattr(StreamedBase, "__init__", recording_init)  # noqa: B010
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(LlmTask, name, fn)
            setattr(StreamedBase, "__init__", base_init)  # noqa: B010

    def inside(self, start: float, end: float, kind: str | None = None) -> float:
        """Seconds of [start, end] some task call (of ``kind``) was running (their union)."""
        clipped = sorted(
            (max(a, start), min(b, end))
            for k, a, b in self.spans
            if (kind is None or k == kind) and b > start and a < end
        )
        total, reach = 0.0, start
        for a, b in clipped:
            if b > reach:
                total += b - max(a, reach)
                reach = b
        return total


@dataclass
class Run:
    """One simulation: its summary, seconds, and the bytes it released beyond the adapters."""

    kind: str
    seed: int
    summary: dict[str, Any]
    seconds: float
    adapter_bytes: int
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return float(self.summary["final_accuracy"])

    @property
    def extra_bytes(self) -> int:
        """bytes_up − participating sites × adapter bytes, over every round."""
        return sum(h["bytes_up"] - len(h["sites"]) * self.adapter_bytes for h in self.summary["history"])

    @property
    def bytes_per_site_round(self) -> list[float]:
        return [h["bytes_up"] / len(h["sites"]) for h in self.summary["history"] if h["sites"]]


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


@dataclass(frozen=True)
class Share:
    """fedshard's share of the share run's last round."""

    round_s: float
    train_s: float
    evaluate_s: float
    wait_s: float
    fetch_s: float
    rounds_s: list[float]
    shares: list[float]

    @property
    def share(self) -> float:
        return self.shares[-1]

    @property
    def wait_share(self) -> float:
        """The training thread's waits for streamed weights, of every round's wall time."""
        return self.wait_s / sum(self.rounds_s)


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
        wait_s=sum(b.stats.wait_s for b in bases),
        fetch_s=sum(b.stats.fetch_s for b in bases),
        rounds_s=[b - a for a, b in windows],
        shares=shares,
    )
    return run, share


def stream_figures(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """bench/llm_stream.py's measurement (its --quick with --quick) and headline; the size it used."""
    stream_args = llm_stream.parse_args(["--quick"] if args.quick else [])
    size = "small" if args.quick else "large"
    m = llm_stream.measure(stream_args, size)
    runs = m["runs"]
    figs = {v: llm_stream.derive(runs["resident"], runs[v]) for v in ("int8", "fp8")}
    return llm_stream._headline(runs, figs, m["fetch_ns"]), size


# the report --------------------------------------------------------------------------------------------
def gaps(runs: list[Run], kind: str, central: dict[int, float]) -> tuple[list[float], float | None, float | None]:
    """Per-seed accuracies of ``kind``, and the mean and SE of their gap to the central run, in pp."""
    mine = {r.seed: r.accuracy for r in runs if r.kind == kind}
    if not mine:
        return [], None, None
    m, se = mean_se([100 * (mine[s] - central[s]) for s in sorted(mine)])
    return [mine[s] for s in sorted(mine)], m, se


def pp(m: float | None, se: float | None) -> str:
    return "not run" if m is None or se is None else f"{m:+.2f} ± {se:.2f} pp"


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
        args.private_examples = 2000 if args.quick else 8000
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
    fed, fed_m, fed_se = gaps(runs, "federated", central)
    assert fed_m is not None and fed_se is not None
    dp = {eps: gaps(runs, f"dp_eps{eps:g}", central) for eps in EPSILONS}
    regional = gaps(runs, "regional", central)
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

    rows = _goal_rows(args, (fed_m, fed_se), dp, regional, n_test, (stream, stream_size), share, released)
    notes = _notes(
        args, runs, central, dp, regional, shared, share, stream, stream_size, (accuracy_s, share_s, stream_s)
    )
    notes.append(c.steal_note(ticks0))
    dp_runs = (", DP ε = " + " and ".join(f"{e:g}" for e in args.epsilons)) if args.epsilons else ""
    interpretation = _interpretation(args, fed_m, fed_se, dp, regional, share, stream, released, adapters, shared)
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


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _goal_rows(
    args: argparse.Namespace,
    gap: tuple[float, float],
    dp: dict[float, tuple[list[float], float | None, float | None]],
    regional: tuple[list[float], float | None, float | None],
    n_test: int,
    streamed: tuple[dict[str, Any], str],
    share: Share,
    released: int,
) -> list[list[str]]:
    """The report's table: each goal, what was measured, the target, whether it is met."""
    fed_m, fed_se = gap
    stream, stream_size = streamed
    rows = [
        [
            f"federated − central accuracy ({args.size}, {args.seeds} seed{'s' * (args.seeds > 1)})",
            pp(fed_m, fed_se),
            f"≥ −{GAP_GOAL_PP} pp",
            _met(fed_m >= -GAP_GOAL_PP),
        ],
        *[
            [f"DP ε={eps:g} federated − non-private central", pp(m, se), "(reported)", "–"]
            for eps, (_, m, se) in dp.items()
        ],
        ["regional adapters (3 EU + 3 US sites) − central", pp(regional[1], regional[2]), "(reported)", "–"],
        ["test predictions per model", f"{n_test:,}", f"≥ {TEST_GOAL:,}", _met(n_test >= TEST_GOAL)],
        [
            f"base memory while training, int8 ({stream_size})",
            f"{100 * stream['base_memory_fraction']:.1f} % of fp32",
            "≤ 30 %",
            _met(stream["base_memory_fraction"] <= llm_stream.MEMORY_GOAL),
        ],
        [
            f"streamed int8 step / resident fp32 step ({stream_size})",
            f"{stream['streamed_step_ratio']:.2f}×",
            f"≤ {llm_stream.STEP_GOAL}×",
            _met(stream["streamed_step_ratio"] <= llm_stream.STEP_GOAL),
        ],
        [
            f"fedshard's share of a round ({args.share_size})",
            f"{100 * share.share:.1f} %",
            f"≤ {100 * SHARE_GOAL:.0f} %",
            _met(share.share <= SHARE_GOAL),
        ],
        [
            "base bytes released (every round of every run)",
            f"{released:,} B",
            "0",
            _met(released == 0),
        ],
    ]
    return rows


def _notes(
    args: argparse.Namespace,
    runs: list[Run],
    central: dict[int, float],
    dp: dict[float, tuple[list[float], float | None, float | None]],
    regional: tuple[list[float], float | None, float | None],
    shared: Run,
    share: Share,
    stream: dict[str, Any],
    stream_size: str,
    seconds: tuple[float, float, float],
) -> list[str]:
    accuracy_s, share_s, stream_s = seconds
    notes = [
        f"- accuracy runs: `configs/demo-llm.yaml` (6 sites, 2 zones, FFA-LoRA r=8, Dirichlet(1.0) label skew) with "
        "every site in the EU, so all six sites' adapters are averaged into one model, at "
        f"size `{args.size}`, {args.rounds} round(s) × {args.local_epochs} local epoch(s), batch {args.batch}, Adam lr "
        f"{args.lr:g}, {args.private_examples:,} private examples, `store.base: int8`; central: the same LoRA on the "
        f"pooled private data, {args.rounds * args.local_epochs} epoch(s), Adam lr {args.central_lr:g}, fp32 base; "
        f"DP: record-level DP-SGD, δ = {DELTA:g}, σ calibrated per site, clip {args.dp_clip:g}",
        "- per seed (accuracy on the whole test set):",
    ]
    for i, seed in enumerate(args.seed_values):
        fed = next(r for r in runs if r.kind == "federated" and r.seed == seed)
        parts = [f"federated {fed.accuracy:.4f}", f"central {central[seed]:.4f}"]
        parts += [f"DP ε={eps:g} {accs[i]:.4f}" for eps, (accs, _, _) in dp.items() if accs]
        parts += [f"regional {regional[0][i]:.4f}"] if regional[0] else []
        secs = [f"{r.kind} {r.seconds:.0f} s" for r in runs if r.seed == seed]
        notes.append(f"  - seed {seed}: {', '.join(parts)} ({', '.join(secs)})")
    for r in runs:
        if r.kind.startswith("dp_"):
            spent = max(site["epsilon_spent"] for site in r.summary["sites"])
            notes.append(f"  - {r.kind} seed {r.seed}: largest ε spent by a site {spent:.3f}")
    notes += [
        f"- fedshard_share: {len(shared.summary['sites'])} sites, {args.share_rounds} round(s), `{args.share_size}` "
        f"base (not pretrained), {args.share_examples} private examples, test fraction {args.share_test_fraction:g}, "
        f"`store.base: int8`. Last round {share.round_s:.2f} s wall: the task's train {share.train_s:.2f} s and "
        f"evaluate {share.evaluate_s:.2f} s (every site, one after the other), the rest "
        f"{share.round_s - share.train_s - share.evaluate_s:.2f} s is fedshard's (and the machine's other load). "
        f"Over all {len(share.rounds_s)} round(s) ({sum(share.rounds_s):.2f} s), inside the task's calls, the "
        f"training thread waited {share.wait_s:.2f} s for streamed weights (fetching took {share.fetch_s:.2f} s, "
        f"mostly in the background): counted as fedshard's too, that is {100 * share.wait_share:.1f} % more. "
        f"Rounds: {', '.join(f'{s:.1f} s' for s in share.rounds_s)}; "
        f"shares {', '.join(f'{100 * x:.1f} %' for x in share.shares)}",
        f"- released per site per round: {runs[0].adapter_bytes:,} adapter bytes at `{args.size}`, "
        f"{shared.adapter_bytes:,} at `{args.share_size}`; measured bytes_up per site per round: "
        + ", ".join(sorted({f"{b:,.0f}" for r in [*runs, shared] for b in r.bytes_per_site_round})),
        f"- streamed base (`bench/llm_stream.py`, `{stream_size}`): int8 step {stream['int8_step_s']:.3f} s vs "
        f"resident {stream['resident_step_s']:.3f} s; fp8 {stream['fp8_step_ratio']:.2f}×, "
        f"{100 * stream['fp8_base_memory_fraction']:.1f} % of fp32; floor of the step ratio on 2 cores "
        f"{stream['step_ratio_floor_2_cores']:.2f}",
        "- regional: the demo's residency as it is (3 EU + 3 US sites): EU sites' adapters are averaged into an EU "
        "regional model, the US sites' into a global one, each from half the data; every site is scored with its "
        "own model on its test slice (non-private; the same seed's central run)",
        f"- wall time: accuracy runs {accuracy_s:.0f} s, share run {share_s:.0f} s, llm_stream {stream_s:.0f} s",
    ]
    return notes


def _interpretation(
    args: argparse.Namespace,
    fed_m: float,
    fed_se: float,
    dp: dict[float, tuple[list[float], float | None, float | None]],
    regional: tuple[list[float], float | None, float | None],
    share: Share,
    stream: dict[str, Any],
    released: int,
    adapters: int,
    shared: Run,
) -> str:
    dp_text = "; ".join(f"with DP at ε = {eps:g}: {pp(m, se)}" for eps, (_, m, se) in dp.items() if m is not None)
    if regional[1] is not None:
        dp_text += f"; with the demo's EU-regional and global adapters: {pp(regional[1], regional[2])}"
    return (
        f"Federated LoRA over the sealed int8 base is {pp(fed_m, fed_se)} from the same LoRA trained centrally on "
        f"the pooled data (size `{args.size}`, {args.seeds} seed(s); goal ≥ −{GAP_GOAL_PP} pp)"
        + (f"; {dp_text}" if dp_text else "")
        + f". The {'118 M' if not args.quick else args.share_size} base streamed from the sealed int8 store takes "
        f"{stream['streamed_step_ratio']:.2f}× the resident step and holds "
        f"{100 * stream['base_memory_fraction']:.1f} % of its fp32 size; fedshard's share of a round is "
        f"{100 * share.share:.1f} %; the sites released {released:,} bytes beyond their adapters "
        f"({adapters:,} B per site per round at `{args.size}`, {shared.adapter_bytes:,} B at `{args.share_size}`)."
        + (
            " --quick: one seed (SE 0), the tiny model, one round and the small base for the system figures; these "
            "are a smoke test, not the goals' figures."
            if args.quick
            else ""
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
