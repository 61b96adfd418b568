"""Per-round wall time of a deployed federation: plain Flower FedAvg vs fedshard's warm SuperNodes.

One loopback deployment, the shipped example layout (``configs/aggregator.yaml``: four
hospitals, three zones, TLS and SuperNode authentication on) on free ports; the same
task and model (breast cancer, MLP 30-64-32-2), the same local training (epochs, batch
size, learning rate), every site training and evaluating every round. On one SuperLink,
its sites' SuperNodes (``fedshard site up``) first run Flower's stock executor, then
are restarted with fedshard's warm executor (``deployment.executor: warm``, the default):

* **Flower FedAvg, stock SuperNodes**: ``bench/flower_fedavg`` (Flower's ``FedAvg``
  strategy; weights travel through the SuperLink) on SuperNodes as Flower ships them
  (``site up --executor flower``: a fresh ``flwr-clientapp`` process per message);
* **fedshard plaintext, stock SuperNodes** (not in ``--quick``): the fedshard app on
  those same SuperNodes (the fallback path);
* **fedshard plaintext**: the fedshard app once the SuperNodes run warm (privacy off, no
  encryption; shards to the three zones by residency policy, signed manifests, version
  chain);
* **Flower FedAvg, warm SuperNodes** (not in ``--quick``): Flower's app on the warm
  SuperNodes, to show what the executor alone gives it;
* **fedshard DP + HE + residency**: ``configs/aggregator.yaml`` as shipped (record-level
  DP-SGD with Opacus, personal shards HE-encrypted, regional aggregates), on a fresh
  warm deployment (the sites' federation config differs); the privacy budget is raised
  so that no site runs out during the benchmark.

A round's wall time is the time between consecutive round ends as the ServerApp records
them (Flower: its ``evaluate_fn`` hook after each round's train + evaluate; fedshard: the
``closed`` events, a round's train messages carrying the evaluation of the round before, the
run's last evaluation alone after them). The first round (app installation, first imports) is dropped; medians of
the others. ``--quick``: 2 rounds of Flower (1 timed), 3 of each fedshard system (2 timed);
``--smoke`` (the test suite's): 1 Flower round (timed: its only one), 2 of fedshard.

    .venv/bin/python bench/deploy_overhead.py [--rounds N] [--quick | --smoke] [--json] [--output FILE]

``--json`` prints ``flower_round_s``, ``fedshard_round_s`` and ``private_round_s`` (DP + HE +
residency; medians, ``null`` for a system not run), ``speedup_vs_flower`` (Flower's median over
fedshard plaintext's), ``fedshard_vs_flower`` and ``private_vs_flower`` (the inverse ratios),
``stock_round_s`` (fedshard on stock SuperNodes; ``null`` in ``--quick``),
``client_process_start_s`` (a fresh interpreter's Flower + torch imports, what each stock
message pays) and ``wall_s`` (the whole benchmark).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, add_output_args, cpu_ticks, fmt, publish, steal_note
from _deployed_runs import fedshard_rounds, flower_rounds

from fedshard.config import load_federation
from fedshard.deploy.aggregator_host import AggregatorHost
from fedshard.deploy.keys import provision
from fedshard.deploy.loopback import write_loopback_layout

SITES = ["charite-berlin", "ap-hp-paris", "mayo-rochester", "sgh-singapore"]
FLOWER, FLOWER_WARM = "Flower FedAvg, stock SuperNodes", "Flower FedAvg, warm SuperNodes"
STOCK, PLAIN, PRIVATE = "fedshard plaintext, stock SuperNodes", "fedshard plaintext", "fedshard DP + HE + residency"
SITE_UP = [sys.executable, "-m", "fedshard.cli.main", "site", "up"]
SITE_IMPORTS = "+ fedshard site (torch, opacus, tenseal, grpc)"
Results = dict[str, tuple[list[float], float]]  # system -> (per-round wall times, final accuracy)


def _plaintext(rounds: int) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["federation"]["rounds"] = rounds
        data["privacy"] = {}
        data["residency"] = {"encrypt": "none"}

    return edit


def _full(rounds: int) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["federation"]["rounds"] = rounds
        data["privacy"]["budget"] = {"epsilon": 16.0, "delta": 1.0e-5}  # time, not utility, is measured here

    return edit


class Deployment:
    """An aggregator host and four site SuperNodes (``fedshard site up --executor executor``) under
    ``root``. One aggregator runs one fedshard run (its zones hold that run's rounds)."""

    def __init__(self, root: Path, edit: Callable[[dict[str, Any]], None], executor: str = "warm") -> None:
        self.root = root
        self.executor = executor
        self.paths = write_loopback_layout(REPO / "configs", root, edit=edit)
        for site in SITES:  # the sites' own caps follow the raised budget
            text = self.paths[site].read_text().replace("epsilon: 8.0", "epsilon: 16.0")
            self.paths[site].write_text(text)
        self.config = load_federation(self.paths["aggregator"])
        provision(self.config, root / "keys")
        self.host = AggregatorHost(self.config)
        self.sites: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Deployment:
        self.start_sites(self.executor)
        if not self.host.start():
            raise RuntimeError("stopped while waiting for the sites")
        self.wait_online(len(SITES))
        return self

    def start_sites(self, executor: str) -> None:
        """Start every site's ``fedshard site up`` with ``--executor executor``."""
        env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
        for site in SITES:
            log = (self.root / f"{site}.log").open("ab")
            self.sites.append(
                subprocess.Popen(
                    [*SITE_UP, "--config", str(self.paths[site]), "--executor", executor],
                    cwd=self.root,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def stop_sites(self) -> None:
        """Stop every site (SIGTERM: each stops its SuperNode and executor)."""
        for proc in self.sites:
            proc.send_signal(signal.SIGTERM)
        for proc in self.sites:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.sites = []

    def restart_sites(self, executor: str) -> None:
        """The same sites on the same SuperLink, their SuperNodes now with ``executor``."""
        self.stop_sites()
        self.wait_online(0, exact=True, timeout=60)
        self.start_sites(executor)
        self.wait_online(len(SITES))

    def wait_online(self, n: int, *, exact: bool = False, timeout: float = 300) -> None:
        """Wait until ``n`` SuperNodes are online (exactly ``n`` with ``exact``)."""
        deadline = time.monotonic() + timeout
        while not (self.host.poll_nodes() == n if exact else self.host.poll_nodes() >= n):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.host.poll_nodes()} SuperNodes online after {timeout:.0f}s, expected {n}")
            time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        self.host.stop_children()
        self.stop_sites()

    def flower_round_times(self, rounds: int, tag: str) -> tuple[list[float], float]:
        """Run plain Flower FedAvg for ``rounds`` on this deployment; per-round wall times and final accuracy."""
        run = flower_rounds(self.host, self.paths["aggregator"], self.root, rounds, tag)
        return run.times, run.accuracy

    def fedshard_round_times(self) -> tuple[list[float], float]:
        """Run fedshard on this deployment; per-round wall times and final accuracy."""
        run = fedshard_rounds(self.host)
        return run.times, run.accuracy


def _import_seconds(statement: str, runs: int) -> float:
    """Median wall time of a fresh interpreter running ``statement`` (what each ClientApp process pays)."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per system (the first is not timed)")
    parser.add_argument(
        "--systems",
        nargs="+",
        default=None,
        choices=["plain", "full"],
        help="deployments to run (default both; --quick: plain only, within 3 minutes)",
    )
    parser.add_argument("--note", action="append", default=[], help="a line to add to the published notes")
    add_output_args(parser)
    args = parser.parse_args(argv)
    args.systems = args.systems or (["plain"] if args.quick else ["plain", "full"])
    return args


def measure(systems: list[str], rounds: int, flower_rounds: int, quick: bool) -> Results:
    """Per-round wall times and final accuracy of each system (deployments under a temporary folder)."""
    results: Results = {}
    tmp = Path(tempfile.mkdtemp(prefix="fedshard-deploy-bench-"))
    if "plain" in systems:
        with Deployment(tmp / "plain", _plaintext(rounds), executor="flower") as plain:
            results[FLOWER] = plain.flower_round_times(flower_rounds, "stock")
            plain.restart_sites("warm")
            results[PLAIN] = plain.fedshard_round_times()
            if not quick:
                results[FLOWER_WARM] = plain.flower_round_times(flower_rounds, "warm")
    if "full" in systems:
        with Deployment(tmp / "full", _full(rounds)) as full:
            results[PRIVATE] = full.fedshard_round_times()
    if "plain" in systems and not quick:  # the fallback path: fedshard on stock SuperNodes (a fresh aggregator)
        with Deployment(tmp / "stock", _plaintext(rounds), executor="flower") as stock:
            results[STOCK] = stock.fedshard_round_times()
    shutil.rmtree(tmp)  # kept when a run fails, for its logs
    return results


def import_costs(runs: int) -> dict[str, float]:
    """Seconds of a fresh interpreter that imports what a ClientApp process of each kind imports
    (what every message pays on a stock SuperNode, and a warm executor pays once)."""
    return {
        "python": _import_seconds("pass", runs),
        "flwr ClientApp": _import_seconds("import flwr.clientapp", runs),
        "+ torch": _import_seconds("import flwr.clientapp, torch", runs),
        SITE_IMPORTS: _import_seconds(
            "import clients.client_app; from fedshard.assembly import make_deployed_site; import opacus, tenseal, grpc",
            runs,
        ),
    }


HEADERS = ["system", "rounds timed", "median s/round", "min", "max", "vs Flower (stock)", "final accuracy"]


def timed(times: list[float]) -> list[float]:
    """The rounds that count: all but the first (app installation, first imports), unless it is the
    only one (``--smoke`` runs Flower's stock round once: each of its messages starts a process)."""
    return times[1:] or times


def medians(results: Results) -> dict[str, float]:
    """Median seconds per round of each system, the first round dropped (:func:`timed`)."""
    return {name: statistics.median(timed(times)) for name, (times, _) in results.items()}


def ratios(results: Results) -> dict[str, float]:
    """Each system's median per round over plain Flower's on stock SuperNodes (NaN without that run)."""
    med = medians(results)
    base = med.get(FLOWER, float("nan"))
    return {name: m / base for name, m in med.items()}


def table(results: Results) -> list[list[str]]:
    """One row per system."""
    med, ratio = medians(results), ratios(results)
    rows = []
    for name, (times, accuracy) in results.items():
        kept = timed(times)
        rows.append(
            [
                name,
                str(len(kept)),
                fmt(med[name], 2),
                fmt(min(kept), 2),
                fmt(max(kept), 2),
                f"{ratio[name]:.2f}×",
                f"{accuracy:.4f}",
            ]
        )
    return rows


def interpretation(results: Results, imports: dict[str, float]) -> str:
    """What the figures say, in words."""
    med = medians(results)
    nan = float("nan")
    flower, plain, private = med.get(FLOWER, nan), med.get(PLAIN, nan), med.get(PRIVATE, nan)
    speedup = flower / plain
    dp = (
        f"{private:.2f} s with DP-SGD, HE-encrypted personal shards and residency groups (goal ≤ 5 s: "
        f"{'met' if private <= 5 else 'not met'})"
        if PRIVATE in med
        else "DP + HE + residency not run (`--systems plain full`)"
    )
    text = (
        "One message per site and round: a round's train message carries the evaluation of the round before. "
        f"A fedshard round on warm SuperNodes takes {plain:.2f} s (goal ≤ 3 s: {'met' if plain <= 3 else 'not met'}), "
        f"{dp}; plain Flower FedAvg on the same SuperLink with Flower's stock "
        f"SuperNodes takes {flower:.2f} s, {speedup:.1f}× longer (goal ≥ 8×: {'met' if speedup >= 8 else 'not met'}). "
        "On a stock SuperNode every message starts a fresh ClientApp process that pays the interpreter, Flower "
        f"and torch imports ({imports['+ torch']:.1f} s here) before any work, and the SuperNode sleeps 3 s whenever "
        "a pull finds no message. The warm executor pays the imports once and forks each message's process "
        "(Flower's own `run_clientapp`, the task's own token), and the SuperNode's idle wait is 0.2 s "
        "(`deployment.poll_s`)."
    )
    if FLOWER_WARM in med:
        text += (
            f" Flower's own FedAvg app on the warm SuperNodes takes {med[FLOWER_WARM]:.2f} s: the executor helps any "
            "Flower app; what remains there is Flower's `send_and_receive`, which sleeps 3 s between pulls."
        )
    if STOCK in med:
        text += f" fedshard on stock SuperNodes (the fallback when Flower's internals differ): {med[STOCK]:.2f} s."
    return text


def headline(results: Results, imports: dict[str, float], wall_s: float) -> dict[str, Any]:
    """The ``--json`` figures (medians of the timed rounds; ``None`` for a system not run)."""
    med, ratio = medians(results), ratios(results)
    flower, plain = med.get(FLOWER), med.get(PLAIN)
    return {
        "flower_round_s": flower,
        "fedshard_round_s": plain,
        "private_round_s": med.get(PRIVATE),
        "stock_round_s": med.get(STOCK),
        "speedup_vs_flower": None if flower is None or plain is None else flower / plain,
        "fedshard_vs_flower": ratio.get(PLAIN),
        "private_vs_flower": ratio.get(PRIVATE),
        "client_process_start_s": imports["+ torch"],
        "wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
    started = time.perf_counter()
    rounds = 2 if args.smoke else 3 if args.quick else args.rounds
    flower_rounds = 1 if args.smoke else 2 if args.quick else args.rounds
    ticks = cpu_ticks()
    results = measure(args.systems, rounds, flower_rounds, args.quick)
    imports = import_costs(1 if args.quick else 3)
    print({k: round(v, 2) for k, v in imports.items()})
    notes = [
        steal_note(ticks),
        *(f"- {note}" for note in args.note),
        "",
        "Fresh-interpreter start-up that every message pays on a stock SuperNode (Flower starts one ClientApp "
        "process per message; Flower's FedAvg sends two messages per site and round, fedshard one: a round's "
        "train message carries the evaluation of the round before) and a warm executor pays once: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in imports.items())
        + ".",
    ]
    runs = (
        f"Flower {flower_rounds} rounds, each fedshard system {rounds}, the first dropped (kept when it is the "
        "only one); medians of the rest; "
        "Flower (stock SuperNodes) and fedshard plaintext (the same sites restarted warm) on one SuperLink, back to "
        "back"
        + ("; a second deployment for DP + HE + residency" if "full" in args.systems else "")
        + ("" if args.quick else ", a third for fedshard on stock SuperNodes")
    )
    publish(
        args,
        "deploy_overhead",
        "Deployment: per-round wall time, plain Flower vs fedshard (issues 6, 17)",
        runs,
        None,
        notes,
        HEADERS,
        table(results),
        interpretation(results, imports),
        headline=headline(results, imports, time.perf_counter() - started),
        console_title="Per-round wall time on one loopback deployment",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
