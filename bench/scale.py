"""Scale: seconds per round, set-up seconds and peak memory from 10 to 10,000 sites.

The task is ``clients/tasks/synthetic.py`` (a seeded synthetic table, 7 features, 6
training and 2 test examples per site, each site's inputs shifted: non-IID), the model
an MLP 7 → 16 → 2; four zones in four regions (EU, US, SG, UK), sites spread over them
in turn, the default residency policy (EU personal shards aggregated in the EU).

Each measurement is a fresh Python process (so its peak RSS is its own):

* **in-process engine** (``fedshard simulate``'s default): sites are objects in the
  process, zones real ZoneAggregators with their gRPC servers (the coordinator talks to
  them over gRPC); the sites reach them by direct calls (``DataPlane.DIRECT``), and at
  100 sites also over loopback gRPC (``DataPlane.GRPC``) for the comparison;
* **Flower engine** (``--engine flower``): sites are ClientApps on Flower's simulation
  engine (Ray), the coordinator its ServerApp, pushes and fetches over gRPC;
* **plain Flower**: Flower's own ``FedAvg`` on the same task, model and sites in
  ``run_simulation`` (no shards, zones, residency, integrity or DP).

Every fedshard run keeps its guarantees: record-level DP-SGD at every site (σ = 3,
RDP accountant, budget ε = 10, δ = 1e-5, one ledger per site), signed manifests, sealed
stores, residency; the run's summary is checked for 0 residency refusals and every
site within its budget. The 1000-site in-process figure is also measured without DP
("plain"), to show what the privacy ledger costs per site.

``setup_s``: from ``simulate()`` until the coordinator has every site's answer and opens
round 1 (keys, zones, sites, each site's genesis model and ledger), without the
interpreter's imports (``import_s``). ``round_s``: the median of the rounds' wall
times (train + evaluate of every site). ``peak_rss_mb``: the process's peak resident
memory (the Flower engine's Ray workers not included).

    .venv/bin/python bench/scale.py [--quick] [--json] [--output FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _publish import REPO, add_output_args, machine_description, publish

SECTION = "scale"
REGIONS = (("eu-central", "EU"), ("us-east", "US"), ("sg-central", "SG"), ("uk-south", "UK"))
ROUNDS = 3
FULL = (
    ("inprocess", 10),
    ("inprocess", 100),
    ("inprocess_grpc", 100),
    ("inprocess", 1000),
    ("inprocess_plain", 1000),
    ("inprocess", 10000),  # 2 rounds (the goal: it completes them)
    ("flower", 1000),
    ("plain_flower", 1000),
    ("plain_flower_onepass", 1000),
)
QUICK = (("inprocess", 10), ("inprocess", 100), ("flower", 10), ("plain_flower", 10))


def federation(sites: int, rounds: int, *, private: bool = True) -> dict[str, Any]:
    """The benchmark's federation config (as a dict)."""
    data: dict[str, Any] = {
        "federation": {
            "name": f"scale-{sites}",
            "seed": 7,
            "rounds": rounds,
            "min_sites": max(1, sites // 2),
            "round_timeout_s": 3600,
        },
        "task": {"target": "clients.tasks.synthetic:task", "options": {}},
        "training": {"local_epochs": 1, "batch_size": 8, "learning_rate": 0.5},
        "zones": [{"name": z, "region": r, "endpoint": "127.0.0.1:0"} for z, r in REGIONS],
        "reducing_zone": REGIONS[0][0],
        "sites": [{"id": f"site-{i:05d}", "jurisdiction": REGIONS[i % len(REGIONS)][1]} for i in range(sites)],
    }
    if private:
        data["privacy"] = {
            "record_level": {"enabled": True, "noise_multiplier": 3.0, "accountant": "rdp"},
            "budget": {"epsilon": 10.0, "delta": 1e-5},
        }
    return data


# one measurement, in its own process ----------------------------------------------------------
def _child(kind: str, sites: int, rounds: int, out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    if kind in ("plain_flower", "plain_flower_onepass"):
        return _plain_flower(sites, rounds, started, onepass=kind == "plain_flower_onepass")
    from fedshard.config import FederationConfig
    from fedshard.simulate.run import DataPlane, Engine, simulate

    imported = time.perf_counter()
    config = FederationConfig.model_validate(federation(sites, rounds, private=kind != "inprocess_plain"))
    marks: list[float] = []

    class Clock:
        def on_start(self, *args: Any) -> None:
            marks.append(time.perf_counter())

        def on_round(self, result: Any) -> None:
            marks.append(time.perf_counter())

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    engine = Engine.FLOWER if kind == "flower" else Engine.INPROCESS
    plane = DataPlane.GRPC if kind == "inprocess_grpc" else DataPlane.DIRECT
    summary = simulate(config, out, engine, Clock(), data_plane=plane)
    residency = ("residency", "not-served")
    refusals = sum(1 for h in summary["history"] for code in h["refusal_codes"].values() if code in residency)
    refusals += sum(1 for z in summary["zones"] for r in z.get("refusals", []) if r.get("code") in residency)
    over = [s["id"] for s in summary["sites"] if s.get("epsilon_spent", 0.0) > s.get("epsilon_budget", 1e9) + 1e-9]
    return {
        "setup_s": marks[0] - imported,
        "import_s": imported - started,
        "round_s": statistics.median(b - a for a, b in itertools.pairwise(marks)),
        "rounds": summary["rounds"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "accuracy": summary["final_accuracy"],
        "residency_refusals": refusals,
        "sites_over_budget": len(over),
        "stopped_reason": summary["stopped_reason"],
    }


def _plain_flower(sites: int, rounds: int, started: float, *, onepass: bool = False) -> dict[str, Any]:
    """Flower's own FedAvg over the same task, model and sites in its simulation engine (with
    ``onepass``: with the one-pass delivery fedshard installs in it, for the comparison)."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from fedshard.config import FederationConfig
    from fedshard.task import Partition, TrainSettings, build_initial_model, load_task

    if onepass:
        from fedshard.transports.flower.compat.delivery import install

        install()
    imported = time.perf_counter()
    config = FederationConfig.model_validate(federation(sites, rounds, private=False))
    task = load_task(config.task.target, dict(config.task.options))
    marks: list[float] = []
    metrics: dict[str, Any] = {}
    client, server = ClientApp(), ServerApp()

    def local(context: Context) -> tuple[Any, Any]:
        index = int(context.node_config["partition-id"])
        data = task.load_data(Partition(index, sites, config.federation.seed))
        return build_initial_model(task, config.federation.seed), data

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        model, data = local(context)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        t = config.training
        result = task.train(model, data, TrainSettings(t.local_epochs, t.batch_size, t.learning_rate, seed=0))
        record = MetricRecord({"train_loss": result.loss, "num-examples": data.num_train})
        return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": record}), reply_to=msg)

    @client.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        model, data = local(context)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        result = task.evaluate(model, data)
        record = MetricRecord({"accuracy": result.accuracy or 0.0, "num-examples": max(data.num_test, 1)})
        return Message(content=RecordDict({"metrics": record}), reply_to=msg)

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(min_train_nodes=sites, min_evaluate_nodes=sites, min_available_nodes=sites)
        initial = ArrayRecord(build_initial_model(task, config.federation.seed).state_dict())
        result = strategy.start(
            grid, initial, num_rounds=rounds, evaluate_fn=lambda r, arrays: marks.append(time.perf_counter())
        )
        last = result.evaluate_metrics_clientapp.get(rounds, {})
        metrics["accuracy"] = last.get("accuracy")

    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=sites,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    return {
        "setup_s": marks[0] - imported,
        "import_s": imported - started,
        "round_s": statistics.median(b - a for a, b in itertools.pairwise(marks)),
        "rounds": len(marks) - 1,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "accuracy": metrics.get("accuracy"),
    }


def measure(kind: str, sites: int, rounds: int) -> dict[str, Any]:
    """One measurement in a fresh process (its figures, or ``{"error": …}``)."""
    with tempfile.TemporaryDirectory(prefix="fedshard-scale-") as tmp:
        cmd = [sys.executable, __file__, "--child", kind, str(sites), str(rounds), str(Path(tmp) / "run")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        env.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", RAY_DEDUP_LOGS="0")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
        shutil.rmtree(Path(tmp) / "run", ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {_cause(proc.stderr or proc.stdout)}"}
    return dict(json.loads(lines[-1]))


def _cause(output: str) -> str:
    """The lines of a failed run that say why: its last error lines, not Ray's or gRPC's chatter after them."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line or line.startswith("fedshard:")]
    return " | ".join((errors or lines)[-3:])[:600]


def measure_once_more(kind: str, sites: int, rounds: int) -> dict[str, Any]:
    """:func:`measure`, run a second time if the first failed (a Ray runtime that did not come up on a
    loaded machine); the first failure stays in the figures (``first_error``), a second one is reported."""
    result = measure(kind, sites, rounds)
    if "error" not in result:
        return result
    print(f"  failed ({result['error']}); once more", flush=True)
    return {**measure(kind, sites, rounds), "first_error": result["error"]}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark (or, with ``--child``, one measurement)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds per run (default {ROUNDS}; quick 2)")
    parser.add_argument("--child", nargs=4, metavar=("KIND", "SITES", "ROUNDS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, sites, rounds, out = args.child
        print(json.dumps(_child(kind, int(sites), int(rounds), Path(out))))
        return
    rounds = args.rounds or (2 if args.quick else ROUNDS)
    plan = QUICK if args.quick else FULL
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for kind, sites in plan:
        print(f"{kind} with {sites} sites …", flush=True)
        results.setdefault(kind, {})[str(sites)] = measure_once_more(
            kind, sites, min(rounds, 2) if sites >= 10000 else rounds
        )
        print(f"  {results[kind][str(sites)]}", flush=True)
    _report(args, results, rounds)


def _report(args: argparse.Namespace, results: dict[str, dict[str, dict[str, Any]]], rounds: int) -> None:
    def fig(kind: str, sites: int, key: str) -> float | None:
        value = results.get(kind, {}).get(str(sites), {}).get(key)
        return float(value) if isinstance(value, int | float) else None

    rows = []
    for kind, by_sites in results.items():
        for sites, r in by_sites.items():
            if "error" in r:
                rows.append([kind, sites, "failed", "", "", "", r["error"][:80]])
                continue
            checks = (
                f"{r.get('residency_refusals', '–')} refusals, {r.get('sites_over_budget', '–')} over budget"
                if not kind.startswith("plain_flower")
                else "(no residency, no DP)"
            ) + (f"; second try (the first: {r['first_error'][:60]})" if "first_error" in r else "")
            rows.append(
                [
                    kind,
                    sites,
                    f"{r['round_s']:.2f}",
                    f"{r['setup_s']:.1f}",
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['accuracy']:.3f}" if r.get("accuracy") is not None else "–",
                    checks,
                ]
            )
    n = 10 if args.quick else 1000
    inproc, flower = fig("inprocess", n, "round_s"), fig("flower", n, "round_s")
    plain, onepass = fig("plain_flower", n, "round_s"), fig("plain_flower_onepass", n, "round_s")
    headline: dict[str, Any] = {
        kind: {
            sites: {k: r.get(k) for k in ("round_s", "setup_s", "peak_rss_mb", "error", "first_error") if k in r}
            for sites, r in by_sites.items()
        }
        for kind, by_sites in results.items()
    }
    headline["flower_vs_inprocess"] = flower / inproc if flower and inproc else None
    headline["flower_vs_plain_flower"] = flower / plain if flower and plain else None
    interpretation = (
        f"At {n} sites fedshard's in-process engine takes {inproc or float('nan'):.2f} s per round, its Flower "
        f"engine {flower or float('nan'):.2f} s ({headline['flower_vs_inprocess'] or float('nan'):.1f}× the "
        f"in-process figure) and plain Flower's own FedAvg simulation {plain or float('nan'):.2f} s"
        + (f" ({onepass:.2f} s with fedshard's one-pass delivery installed in it)." if onepass else ".")
    )
    publish(
        args,
        SECTION,
        "Scale: 10 to 10,000 sites",
        f"{rounds} rounds per run, median round; one process per run",
        machine_description(),
        [
            "Task `clients/tasks/synthetic.py` (6 train + 2 test "
            "examples per site), MLP 7→16→2, 4 zones in 4 regions; fedshard runs with record-level DP-SGD "
            "(σ 3, RDP, ε budget 10 per site), signed manifests, sealed stores, residency; `inprocess_plain`: "
            "the same without DP; `inprocess_grpc`: sites push and fetch over loopback gRPC. fedshard's Flower "
            "engine delivers messages to its actors in one pass per tick "
            "(`fedshard/transports/flower/compat/delivery.py`; "
            "Flower's own loop scans every stored message for every node); `plain_flower` is Flower's stock "
            "engine, `plain_flower_onepass` the same with that delivery installed.",
        ],
        ["engine", "sites", "round s", "set-up s", "peak RSS MB", "accuracy", "guarantees"],
        rows,
        interpretation,
        headline=headline,
        console_title="Scale",
    )


if __name__ == "__main__":
    main()
