"""Deployed rounds across hosts on limited links: round time against the link floor and plain Flower.

The README's federation on separate hosts (``deploy/hosts/``, README "On separate hosts"):
the aggregator, three zones and four hospitals, each in its own network namespace with its
own address and name (``tests/netns.py``), the README's commands on each host
(``tests/hosts_helpers.py``). Links, each way, shaped with ``tc tbf``:

* **unshaped**: veth links with no limit (what one machine's loopback gives);
* **1 Gbit/s**: every host on 1 Gbit/s;
* **100 Mbit/s**: the aggregator and zones on 1 Gbit/s, each hospital on 100 Mbit/s.

Tasks, each a fresh deployment on those hosts (keys, zones, SuperLink, sites' SuperNodes warm):

* **demo**: the example as shipped (MLP 30-64-32-2, record-level DP-SGD, personal shards
  CKKS-encrypted, residency groups; the budget raised so no site runs out);
* **lora**: the tiny LLM (``clients.tasks.llm``, ``size: tiny``), LoRA adapters over a frozen
  base each site seals in its store and streams; plaintext;
* **full**: a full-parameter model, the demo's task with hidden layers of 2048 and 2048
  (4.3 M parameters, 17 MB float32) trained and federated whole; plaintext.

On the same SuperNodes, before fedshard's run, plain Flower FedAvg (``bench/flower_fedavg``:
the whole model through the SuperLink, no zones, no DP, no encryption) runs the demo's and
the full model's task (not the LoRA one: FedAvg would ship the frozen base too).

A round's wall time is the time between consecutive round ends the ServerApp records (fedshard:
its ``closed`` events, each round's train messages carrying the evaluation of the round before; the
first round dropped; medians). Bytes on each link are read from its interface counters,
sampled every 0.2 s, between the first and the last timed round end, per round. The link
floor of a round is the busiest link's bytes (both ways, in turn: fetch, then push) over its
rate: no round on those links can be shorter.

    sudo .venv/bin/python bench/wan.py [--rounds N] [--quick | --smoke] [--json] [--output FILE]

``--quick``: unshaped and 100 Mbit/s, demo and full, 3 rounds each; ``--smoke`` (``make
test-hosts``): 100 Mbit/s, demo, 2 rounds (Flower 1), two hospitals (one EU, one US).
Needs root and iproute2 (``make test-hosts`` installs it). ``--json`` prints
``round_s_100mbit``, ``link_floor_s_100mbit``, ``vs_link_floor_100mbit``,
``flower_round_s_100mbit``, ``vs_flower_100mbit`` and ``round_s_unshaped`` (each by task;
``null`` where not run) and ``wall_s``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import REPO, add_output_args, cpu_ticks, fmt, publish, steal_note

from tests.hosts_helpers import SITES, ZONE_HOSTS, Hosted, copy_configs, links, make_keys, start_sites, start_zones
from tests.netns import Hosts, can_make_hosts

SETTINGS: dict[str, tuple[str | None, str | None]] = {  # name → (cloud rate, hospital rate)
    "unshaped": (None, None),
    "1 Gbit/s": ("1gbit", "1gbit"),
    "100 Mbit/s": ("1gbit", "100mbit"),
}
TASKS = ("demo", "lora", "full")
FLOWER_TASKS = ("demo", "full")
WIDE = [2048, 2048]
SAMPLE_S = 0.2
_SMALL_TEST = {"test_fraction": 0.03}


def _edit(task: str, rounds: int, cache: Path, sites: tuple[str, ...] = SITES) -> Callable[[dict[str, Any]], None]:
    """The federation config of ``task`` for ``rounds`` rounds on ``sites``, every one in every round."""

    def edit(data: dict[str, Any]) -> None:
        data["sites"] = [s for s in data["sites"] if s["id"] in sites]
        data["federation"].update(rounds=rounds, min_sites=len(sites), round_timeout_s=600)
        data["deployment"]["wait_s"] = 600
        if task == "demo":
            data["privacy"]["budget"] = {"epsilon": 64.0, "delta": 1.0e-5}  # time, not utility, is measured here
        elif task == "full":
            data["task"]["options"]["hidden"] = WIDE
            data["sharding"] = {"tile": [256, 256]}
            data.pop("privacy", None)
            data["residency"] = {"encrypt": "none"}
        else:
            data["task"] = {"target": "clients.tasks.llm:task", "options": _lora_options(cache)}
            data["training"] = {"local_epochs": 1, "batch_size": 64, "learning_rate": 0.003}
            data["sharding"] = {"tile": [64, 64]}
            data["store"] = {"base": "int8"}
            data.pop("privacy", None)
            data.pop("residency", None)

    return edit


class LinkSampler:
    """Every host's link counters, every :data:`SAMPLE_S`, in a thread, while in a ``with`` block."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.samples: list[tuple[float, dict[str, tuple[int, int]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), {n: h.link_bytes() for n, h in self.hosts.hosts.items()}))
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> LinkSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, when: float) -> dict[str, tuple[int, int]]:
        """The counters of the last sample at or before ``when``."""
        return next(c for t, c in reversed(self.samples) if t <= when) if self.samples[0][0] <= when else {}

    def between(self, start: float, end: float) -> dict[str, tuple[int, int]]:
        """Bytes (received, sent) by each host between ``start`` and ``end``."""
        a, b = self.at(start), self.at(end)
        return {n: (b[n][0] - a[n][0], b[n][1] - a[n][1]) for n in b if n in a}


@dataclass
class Run:
    """One system's rounds on one setting and task."""

    setting: str
    task: str
    system: str  # fedshard or Flower FedAvg
    times: list[float]
    per_round: dict[str, tuple[float, float]]  # host → (bytes received, sent) per timed round
    floor_s: float | None
    accuracy: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        """Median wall time of the timed rounds."""
        return statistics.median(self.times)


def _runs_of(
    marks: dict[str, Any], sampler: LinkSampler, setting: str, task: str, rates: dict[str, float | None]
) -> list[Run]:
    """The runs the aggregator recorded, with their bytes per link and round and their floor."""
    out = []
    for system, run in marks.items():
        m = run["marks"]
        timed = [b - a for a, b in itertools.pairwise(m[1:])] or [m[1] - m[0]]  # the first round dropped
        start = m[1] if len(m) > 2 else m[0]
        moved = sampler.between(start, m[-1])
        per_round = {h: (rx / len(timed), tx / len(timed)) for h, (rx, tx) in moved.items()}
        floors = [(rx + tx) / rates[h] for h, (rx, tx) in per_round.items() if rates[h]]  # type: ignore[operator]
        name = "fedshard" if system == "fedshard" else "Flower FedAvg"
        out.append(Run(setting, task, name, timed, per_round, max(floors) if floors else None, run["accuracy"]))
    return out


def deploy(
    hosts: Hosts, folder: Path, task: str, rounds: int, flower_rounds: int, cache: Path, sites: tuple[str, ...] = SITES
) -> dict[str, Any]:
    """One deployment of ``task`` on ``hosts``: Flower (``flower_rounds``; 0: none), then fedshard;
    their round marks."""
    hosted = Hosted(hosts, copy_configs(folder, _edit(task, rounds, cache, sites)))
    for file in (folder / "deploy" / "hosts" / "sites").glob("*.yaml"):  # the sites' own caps follow the budget
        file.write_text(file.read_text().replace("epsilon: 8.0", "epsilon: 64.0"))
    marks = folder / "marks.json"
    try:
        make_keys(hosted)
        start_zones(hosted, ZONE_HOSTS)
        start_sites(hosted, sites)
        command = (
            f"python {REPO / 'bench' / '_wan_aggregator.py'} --config deploy/hosts/federation.yaml "
            f"--out {marks} --flower-rounds {flower_rounds}"
        )
        done = hosted.run(command, "aggregator", timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"{task}: the aggregator failed:\n{done.stderr[-3000:]}\n{hosted.tails()}")
    finally:
        hosted.stop()
    return json.loads(marks.read_text())  # type: ignore[no-any-return]


def measure(
    settings: list[str], tasks: list[str], rounds: int, flower_rounds: int = 0, sites: tuple[str, ...] = SITES
) -> list[Run]:
    """Every setting × task (and Flower, ``flower_rounds`` or else ``rounds``, where it runs);
    deployments under a temporary folder."""
    tmp = Path(tempfile.mkdtemp(prefix="fedshard-wan-"))
    cache = tmp / "llm-base"
    if "lora" in tasks:  # pretrained once, read by every site (each hospital's copy of the base)
        from fedshard.task import load_task

        load_task("clients.tasks.llm:task", _lora_options(cache)).base()  # type: ignore[attr-defined]
    runs: list[Run] = []
    for setting in settings:
        cloud, hospital = SETTINGS[setting]
        with Hosts(links(cloud, hospital), tag="fsw") as hosts:
            rates = {n: h.bytes_per_second for n, h in hosts.hosts.items()}
            for task in tasks:
                flower = (flower_rounds or rounds) if task in FLOWER_TASKS else 0
                folder = tmp / setting.replace(" ", "").replace("/", "") / task
                folder.mkdir(parents=True)
                with LinkSampler(hosts) as sampler:
                    marks = deploy(hosts, folder, task, rounds, flower, cache, sites)
                made = _runs_of(marks, sampler, setting, task, rates)
                print(f"{setting:>10} {task:>5}: " + ", ".join(f"{r.system} {r.median_s:.2f} s" for r in made))
                runs += made
    shutil.rmtree(tmp)  # kept when a run fails, for its logs
    return runs


def _lora_options(cache: Path) -> dict[str, Any]:
    """The tiny LLM of the test suite: its base pretrained one epoch into ``cache``, a few hundred examples."""
    return {
        "size": "tiny",
        "cache_dir": str(cache),
        "pretrain_epochs": 1,
        "private_examples": 600,
        "test_fraction": 0.03,
    }


def _mb(per_round: dict[str, tuple[float, float]], hosts: tuple[str, ...]) -> str:
    """The busiest of ``hosts``' links: MB received / sent per round."""
    name = max(hosts, key=lambda h: sum(per_round.get(h, (0.0, 0.0))))
    rx, tx = per_round.get(name, (0.0, 0.0))
    return f"{rx / 1e6:.2f} / {tx / 1e6:.2f}"


def _flower_of(runs: list[Run], run: Run) -> Run | None:
    return next((r for r in runs if (r.setting, r.task, r.system) == (run.setting, run.task, "Flower FedAvg")), None)


HEADERS = [
    "links",
    "task",
    "system",
    "rounds timed",
    "median s/round",
    "busiest hospital link MB/round (in / out)",
    "busiest cloud link MB/round (in / out)",
    "link floor s/round",
    "round / floor",
    "fedshard / Flower",
    "final accuracy",
]
CLOUD_HOSTS = ("aggregator", *ZONE_HOSTS.values())


def table(runs: list[Run]) -> list[list[str]]:
    """One row per setting, task and system."""
    rows = []
    for run in runs:
        flower = _flower_of(runs, run)
        versus = f"{run.median_s / flower.median_s:.2f}×" if flower is not None and run.system == "fedshard" else "—"
        floor = "—" if run.floor_s is None else fmt(run.floor_s, 3)
        ratio = "—" if run.floor_s is None else f"{run.median_s / run.floor_s:.1f}×"
        rows.append(
            [
                run.setting,
                run.task,
                run.system,
                str(len(run.times)),
                fmt(run.median_s, 2),
                _mb(run.per_round, SITES),
                _mb(run.per_round, CLOUD_HOSTS),
                floor,
                ratio,
                versus,
                f"{run.accuracy:.4f}",
            ]
        )
    return rows


def _pick(runs: list[Run], setting: str, system: str = "fedshard") -> dict[str, Run]:
    return {r.task: r for r in runs if r.setting == setting and r.system == system}


def headline(runs: list[Run], wall_s: float) -> dict[str, Any]:
    """The ``--json`` figures, by task (``None`` where not run)."""
    slow, flower, open_ = _pick(runs, "100 Mbit/s"), _pick(runs, "100 Mbit/s", "Flower FedAvg"), _pick(runs, "unshaped")

    def by_task(f: Callable[[str], float | None]) -> dict[str, float | None]:
        return {task: f(task) for task in TASKS}

    return {
        "round_s_100mbit": by_task(lambda t: slow[t].median_s if t in slow else None),
        "link_floor_s_100mbit": by_task(lambda t: slow[t].floor_s if t in slow else None),
        "vs_link_floor_100mbit": by_task(
            lambda t: slow[t].median_s / slow[t].floor_s if t in slow and slow[t].floor_s else None
        ),
        "flower_round_s_100mbit": by_task(lambda t: flower[t].median_s if t in flower else None),
        "vs_flower_100mbit": by_task(
            lambda t: slow[t].median_s / flower[t].median_s if t in slow and t in flower else None
        ),
        "round_s_unshaped": by_task(lambda t: open_[t].median_s if t in open_ else None),
        "wall_s": wall_s,
    }


def interpretation(runs: list[Run]) -> str:
    """What the figures say, in words."""
    slow, flower, open_ = _pick(runs, "100 Mbit/s"), _pick(runs, "100 Mbit/s", "Flower FedAvg"), _pick(runs, "unshaped")
    parts = []
    for task, run in slow.items():
        text = f"{task}: {run.median_s:.2f} s per round at 100 Mbit/s per hospital"
        if run.floor_s:
            text += f", {run.median_s / run.floor_s:.1f}× its link floor ({run.floor_s:.3f} s)"
        if task in open_:
            text += f", {open_[task].median_s:.2f} s unshaped"
        if task in flower:
            text += f"; plain Flower FedAvg {flower[task].median_s:.2f} s ({run.median_s / flower[task].median_s:.2f}×)"
        parts.append(text)
    summary = "; ".join(parts) if parts else "no 100 Mbit/s run (`--quick` and the full run include one)"
    return (
        f"{summary}. Where a round's bytes are small (the demo's 4 K-parameter MLP, LoRA adapters) the round is "
        "compute: DP-SGD, CKKS and training on 2 cores shared by eight hosts' processes, and the link floor is a "
        "small fraction of it. The full-parameter model moves its 17 MB each way per hospital: fedshard sends it "
        "as shards straight to the zones of its residency group (the SuperLink carries only small messages), "
        "Flower through the SuperLink, twice per round (train and evaluate messages carry the model)."
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per system (the first is not timed)")
    parser.add_argument("--note", action="append", default=[], help="a line to add to the published notes")
    add_output_args(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
    why = can_make_hosts()
    if why is not None:
        print(f"error: bench/wan.py needs network namespaces: {why}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    sites = SITES
    if args.smoke:
        settings, tasks, rounds, flower_rounds = ["100 Mbit/s"], ["demo"], 2, 1
        sites = SITES[:1] + SITES[2:3]  # one EU and one US hospital: every code path, half the processes
    elif args.quick:
        settings, tasks, rounds, flower_rounds = ["unshaped", "100 Mbit/s"], ["demo", "full"], 3, 3
    else:
        settings, tasks, rounds, flower_rounds = list(SETTINGS), list(TASKS), args.rounds, args.rounds
    ticks = cpu_ticks()
    runs = measure(settings, tasks, rounds, flower_rounds, sites)
    notes = [
        steal_note(ticks),
        *(f"- {note}" for note in args.note),
        "",
        "Hosts: the aggregator, zone-eu-central, zone-us-east, zone-sg-central and four hospitals, each a network "
        "namespace on one bridge (one 2-core machine runs them all: the CPU is shared, the links are not). "
        "Links shaped each way with `tc tbf` (burst 10 ms of the rate, 100 ms of queue); no added latency "
        "(netem is not available here). Sites run fedshard's warm executor; Flower's app runs on the same "
        "SuperNodes.",
    ]
    publish(
        args,
        "wan",
        "Deployed rounds across hosts on limited links (issue 36)",
        f"{rounds} rounds per system and deployment, the first dropped; medians of the rest; bytes from each "
        "link's counters between the first and last timed round end",
        None,
        notes,
        HEADERS,
        table(runs),
        interpretation(runs),
        headline=headline(runs, time.perf_counter() - started),
        console_title="Deployed rounds across namespaced hosts",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
