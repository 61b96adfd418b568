"""What one site message costs besides training: time, model builds and memory.

For each model (the demo's breast-cancer MLP, and the 118 M-parameter transformer of
``clients/tasks/large_transformer.py``) a fresh Python process plays one site: a real
:class:`~fedshard.coordinator.coordinator.Coordinator` drives rounds against a zone
gRPC server in another process on loopback (``bench/_common.py``'s
``ZoneServerProcess``), and every message reaches the site the way Flower's ClientApp
reaches it (``fedshard.transports.flower.client_app``), through its JSON encoding.

Training is a no-op, so a train message of round r ≥ 2 is pure overhead: load the
model from the site's sealed store, fetch round r−1's aggregate, apply it, save the
store, split the update, route, sign and push it. The benchmark skips the evaluate
messages (it answers them itself) so that each train message does all of that.

Per message it records the wall time, the model builds (the task's ``build_model``
calls, counted by a wrapper) and the peak RSS of the process (``VmHWM`` after resetting
it through ``/proc/self/clear_refs``; sampled every millisecond where that is not
allowed). "Extra" memory is that peak minus the RSS before the first message and minus
the model's size: what a message needs beyond holding the model once.

    .venv/bin/python bench/site_overhead.py [--quick] [--json] [--rounds N] [--output FILE]

``--quick`` uses a 2.7 M-parameter transformer instead of the 118 M one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

SECTION = "site_overhead"
SITE = "bench-site"
WARM_MODULES = (
    "fedshard.transports.flower.client_app",
    "fedshard.transports.flower.records",
    "fedshard.site.site",
    "fedshard.assembly.routing",
    "fedshard.store.sealed_store",
    "fedshard.store.model_io",
    "fedshard.zone.rpc.client",
    "fedshard.crypto.signing",
)
QUICK_TRANSFORMER = {"vocab": 4096, "d_model": 256, "heads": 4, "layers": 2, "ffn": 1024, "max_len": 128}


# the task: a real model, no data, no training; counts its model builds -----------------------
class BenchTask:
    """A task around the demo MLP or the large transformer whose training does nothing.

    ``builds`` counts calls of :meth:`build_model` in this process.
    """

    builds = 0

    def __init__(self, model: str = "demo", transformer: dict[str, int] | None = None) -> None:
        self.model = model
        self.transformer = transformer

    def build_model(self) -> Any:
        """The model, with its initial values."""
        BenchTask.builds += 1
        return _fresh_model(self.model, self.transformer)

    def load_data(self, partition: Any) -> Any:
        """No data: the benchmark never trains."""
        from fedshard.task import TaskData

        return TaskData(train=None, test=None, num_train=1, num_test=1)

    def train(self, model: Any, data: Any, settings: Any) -> Any:
        """No training: the update is zero, every other step of a message still runs."""
        from fedshard.task import Metrics

        return Metrics(num_examples=1, loss=0.0)

    def evaluate(self, model: Any, data: Any) -> Any:
        """Not called (the benchmark skips evaluation)."""
        from fedshard.task import Metrics

        return Metrics(num_examples=1, loss=0.0, accuracy=0.0)


def _fresh_model(model: str, transformer: dict[str, int] | None) -> Any:
    if model == "demo":
        from clients.tasks.breast_cancer import BreastCancerTask

        return BreastCancerTask(hidden=[64, 32]).build_model()
    from clients.tasks.large_transformer import TransformerConfig, materialise

    return materialise(TransformerConfig(**(transformer or {})), seed=0)


def _model_bytes(model: str, transformer: dict[str, int] | None) -> int:
    if model == "demo":
        return sum(t.numel() * t.element_size() for t in _fresh_model(model, None).state_dict().values())
    from clients.tasks.large_transformer import TransformerConfig, shard_plan

    return shard_plan(TransformerConfig(**(transformer or {}))).nbytes


# memory -----------------------------------------------------------------------------------------
def _status_kb(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) << 10
    return 0


class PeakRss:
    """Peak RSS of this process over a ``with`` block (bytes, in ``peak``)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hwm = False

    def __enter__(self) -> PeakRss:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self._hwm = True
        except OSError:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self.peak = _status_kb("VmRSS")
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _status_kb("VmRSS"))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, _status_kb("VmHWM") if self._hwm else 0, _status_kb("VmRSS"))


# one site process ---------------------------------------------------------------------------------
@dataclass
class MessageRecord:
    """One message the site handled."""

    kind: str
    round: int
    seconds: float
    builds: int
    peak_rss: int
    instruction_bytes: int


@dataclass
class ModelRun:
    """What one site process measured for one model."""

    model: str
    params: int
    model_bytes: int
    base_rss: int
    messages: list[MessageRecord] = field(default_factory=list)


class MeasuredGateway:
    """A SiteGateway to one site, reached per message as Flower's ClientApp reaches it."""

    def __init__(self, settings: dict[str, str], run: ModelRun) -> None:
        self._settings = settings
        self._context = SimpleNamespace(node_config={"partition-id": 0}, run_config={})
        self.run = run

    def nodes(self) -> list[str]:
        """The one site."""
        return ["1"]

    def send(self, kind: Any, messages: Any, timeout: float) -> dict[str, Any]:
        """Handle each message in this process; evaluation is answered as skipped."""
        from fedshard.protocol.messages import MessageKind, SiteFailure

        if kind is MessageKind.EVALUATE:
            return {node: SiteFailure(reason="skipped by the benchmark") for node in messages}
        return {node: self._handle(kind, message) for node, message in messages.items()}

    def _handle(self, kind: Any, message: Any) -> Any:
        from fedshard.protocol.messages import decode, encode
        from fedshard.transports.flower import client_app
        from fedshard.transports.flower.records import REQUESTS

        payload = encode(message)
        builds = BenchTask.builds
        with PeakRss() as rss:
            t0 = time.perf_counter()
            site = client_app._site(self._context, self._settings)  # what the ClientApp does per message
            reply = site.handle(kind, decode(REQUESTS[kind], payload))
            reply = decode(type(reply), encode(reply))
            seconds = time.perf_counter() - t0
            del site
        record = MessageRecord(
            kind.value, getattr(message, "round", 0), seconds, BenchTask.builds - builds, rss.peak, len(payload)
        )
        self.run.messages.append(record)
        if getattr(reply, "ok", True) is False:
            raise RuntimeError(f"the site refused round {record.round}: {reply.reason}")
        return reply


def _config(model: str, transformer: dict[str, int] | None, rounds: int, endpoint: str) -> dict[str, Any]:
    tile = [32, 32] if model == "demo" else [256, 256]
    options: dict[str, Any] = {"model": model, "transformer": transformer}
    return {
        "federation": {"name": "site-overhead", "seed": 7, "rounds": rounds, "min_sites": 1, "round_timeout_s": 3600},
        "task": {"target": f"{__name__}:BenchTask", "options": options},
        "sharding": {"tile": tile},
        # every shard public and global: the bench zone runs without a policy
        "residency": {"detectors": False, "rules": [{"class": "*", "allow_regions": "*", "serve_to": "*"}]},
        "zones": [{"name": "bench-zone", "region": "EU", "endpoint": endpoint}],
        "reducing_zone": "bench-zone",
        "sites": [{"id": SITE, "jurisdiction": "EU"}],
    }


def _warm_imports() -> None:
    """Import what a message uses, so that the baseline RSS already holds the code."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)


def run_site(model: str, transformer: dict[str, int] | None, rounds: int) -> ModelRun:
    """Run ``rounds`` rounds of one site on ``model``; every message measured."""
    import yaml

    from fedshard.assembly import grpc_connector
    from fedshard.config import load_federation
    from fedshard.coordinator.coordinator import Coordinator

    _warm_imports()

    logging.getLogger("fedshard").setLevel(logging.ERROR)
    model_bytes = _model_bytes(model, transformer)
    with (
        tempfile.TemporaryDirectory(prefix="site-overhead-") as tmp,
        c.ZoneServerProcess(staging_bytes=2 * model_bytes + (64 << 20)) as zone,
    ):
        path = Path(tmp) / "federation.yaml"
        path.write_text(yaml.safe_dump(_config(model, transformer, rounds, zone.endpoint)))
        config = load_federation(path)
        settings = {"config": str(path), "state-root": str(Path(tmp) / "sites")}
        run = ModelRun(model, model_bytes // 4, model_bytes, _status_kb("VmRSS"))
        gateway = MeasuredGateway(settings, run)
        zones = {"bench-zone": grpc_connector("bench-zone", zone.endpoint)}
        try:
            result = Coordinator(config, gateway, zones, {"bench-zone": zone.endpoint}).run()
        finally:
            zones["bench-zone"].close()
        if result.stopped_reason or len(result.rounds) != rounds:
            raise RuntimeError(f"the federation stopped: {result.stopped_reason}")
    return run


# summary and report ---------------------------------------------------------------------------------
def summarise(run: ModelRun) -> dict[str, Any]:
    """Headline figures of one model's run."""
    steady = [m for m in run.messages if m.kind == "train" and m.round >= 2]
    later = run.messages[1:]
    extra = max(m.peak_rss - run.base_rss - run.model_bytes for m in later)
    trains = [m for m in run.messages if m.kind == "train"]
    return {
        "params": run.params,
        "model_mb": run.model_bytes / 1e6,
        "message_s": statistics.median(m.seconds for m in steady),
        "first_message_s": run.messages[0].seconds,
        "builds_first": run.messages[0].builds,
        "builds_after_first": sum(m.builds for m in later),
        "messages": len(run.messages),
        "peak_extra_mb": extra / 1e6,
        "peak_extra_over_model": extra / run.model_bytes,
        "instruction_bytes_first": steady[0].instruction_bytes,
        "instruction_bytes_last": steady[-1].instruction_bytes,
        "rounds": len(trains),
    }


def _child(model: str, transformer: dict[str, int] | None, rounds: int) -> dict[str, Any]:
    """Run one model in a fresh process (its own site process); its summary and messages."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", model, "--rounds", str(rounds)]
    if transformer is not None:
        argv += ["--transformer", json.dumps(transformer)]
    env = dict(os.environ, GRPC_VERBOSITY="ERROR", FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=c.REPO, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"site process for {model} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, desc: dict[str, str]) -> dict[str, Any]:
    """Print the table (and write the BENCHMARKS.md section); the headline JSON."""
    headers = ["model", "params", "message (s)", "first message (s)", "builds: first / after", "peak extra / model"]
    rows = [
        [
            name,
            f"{r['params'] / 1e6:.2f} M",
            c.fmt(r["message_s"], 3),
            c.fmt(r["first_message_s"], 3),
            f"{r['builds_first']} / {r['builds_after_first']}",
            f"{r['peak_extra_over_model']:.2f}× ({c.fmt(r['peak_extra_mb'])} MB)",
        ]
        for name, r in results.items()
    ]
    c.print_table("one site message, no training", headers, rows)
    for name, r in results.items():
        for m in r["records"]:
            print(
                f"  {name:12s} {m['kind']:8s} r{m['round']:<3d} {m['seconds']:8.3f} s  builds {m['builds']}  "
                f"rss {m['peak_rss'] / 1e6:8.1f} MB  instruction {m['instruction_bytes']} B"
            )
    big = results["transformer"]
    headline = {
        "demo_message_s": results["demo"]["message_s"],
        "transformer_message_s": big["message_s"],
        "transformer_params": big["params"],
        "model_builds_after_first": sum(r["builds_after_first"] for r in results.values()),
        "peak_extra_over_model": big["peak_extra_over_model"],
        "instruction_bytes_growth": results["demo"]["instruction_bytes_last"]
        - results["demo"]["instruction_bytes_first"],
    }
    notes = [
        "- A train message of round r ≥ 2 with no-op training: load from the sealed store, fetch and apply "
        "round r−1's aggregate, save, split, route, sign, push to a zone gRPC server in another process.",
        f"- Message time is the median over rounds 2…{big['rounds']}; extra memory is the largest peak RSS of any "
        "message after the first, minus the RSS before the first message and the model's size.",
        f"- Train instruction (demo): {results['demo']['instruction_bytes_first']} bytes in round 2, "
        f"{results['demo']['instruction_bytes_last']} in round {results['demo']['rounds']}.",
    ]
    interpretation = (
        "Goals: no model build after a site process's first message, and a message needing at most twice the "
        "model's size beyond the model itself."
    )
    runs = f"{big['rounds']} rounds (transformer), {results['demo']['rounds']} rounds (demo)"
    headline = {"mode": "quick" if args.quick else "full", **headline}
    c.publish(
        args, SECTION, "Site message overhead", runs, desc, notes, headers, rows, interpretation, headline=headline
    )
    return headline


def main(argv: list[str] | None = None) -> int:
    """Measure both models (each in its own process), print, publish, and print the headline JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--rounds", type=int, default=None, help="rounds per model (default: 4 demo / 3 transformer)")
    parser.add_argument("--child", choices=["demo", "transformer"], help=argparse.SUPPRESS)
    parser.add_argument("--transformer", type=json.loads, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run = run_site(args.child, args.transformer, args.rounds)
        print(json.dumps({**summarise(run), "records": [asdict(m) for m in run.messages]}))
        return 0
    desc = c.machine_description()
    transformer = QUICK_TRANSFORMER if args.quick else None
    results = {
        "demo": _child("demo", None, args.rounds or (4 if args.quick else 8)),
        "transformer": _child("transformer", transformer, args.rounds or 3),
    }
    report(results, args, desc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
