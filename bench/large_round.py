"""A large full-parameter round: the data plane of 4 sites sending the 118 M-parameter transformer.

Four sites (two in the EU, two in the US) each send one full-parameter update of the
transformer of ``clients/tasks/large_transformer.py`` through the real data plane:

* the federation's real :class:`~fedshard.coordinator.coordinator.Coordinator` drives the
  rounds, in this process, over gRPC to the zones;
* two zones (``eu-central`` reducing, ``us-east``) are real gRPC servers on loopback,
  each assembled as ``fedshard simulate`` assembles it (``make_zone`` with the
  federation's residency policy and the sites' signing keys, ``serve``), each in its
  own process so that its peak RSS is its own;
* each site is a real :class:`~fedshard.site.site.Site` (``make_site``: sealed store,
  signing key, shared routing, CKKS codec when encrypting) in its own process; the
  coordinator reaches it through a pipe with each message JSON-encoded, as Flower
  would, one site after the other (the in-process engine's default);
* training is replaced by a synthetic update (every parameter scaled by 1 + 10⁻³, in
  place): everything else a round does is the real code.

A round is then: site load (sealed store → model) → split (the pre-training copy) →
synthetic training → update (trained − base) → [CKKS encryption] → digest (the
manifest) → sign → push (gRPC; the zone validates and folds as the frames arrive) →
close (zones fold up, forward partial sums to the reducing zone, publish) → the
evaluate message: load → fetch (gRPC) → verify (digests and Merkle root) →
[decrypt] → apply (server optimiser, in place) → save (sealed store).

Phases are timed by wrapping the library's own functions in the site and zone
processes (nothing in the library is changed); a wrapper whose target no longer exists
is reported, not fatal. Peak RSS is each process's ``VmHWM``, reset before each
message (sites) and read at the end of the run (zones).

The copy floor is the time NumPy's ``np.copyto`` takes to copy every byte the round
moves (each site's push and each site's fetch), measured in the same run.

    .venv/bin/python bench/large_round.py [--quick] [--json] [--rounds N] [--tile RxC] [--output FILE]

``--tile``: the federation's shard tile (default 1024x1024, 4 MiB shards, as the README
advises for a large model: fewer shards mean fewer store files, digests and frames).

``--quick``: the 2.7 M-parameter transformer (2 blocks, d_model 256) in plaintext and a
0.3 M-parameter one (1 block, d_model 128) with every shard CKKS-encrypted, 2 rounds
each; the same processes and phases, so a smoke test of the whole path, but its
figures say little (the processes' fixed allocations dwarf the model, the copy floor
runs in cache); the CKKS bytes are the 2.7 M model's, from its plan. Full mode: the
118 M model in plaintext (3 rounds); with every shard CKKS-encrypted a real round of a
17 M-parameter subset of it (one block, vocab 4,096; 2 rounds), and the exact
ciphertext bytes of the 118 M model from its shard plan (ciphertext size depends only
on a shard's value count).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

SECTION = "large_round"
QUICK_TRANSFORMER = {"vocab": 4096, "d_model": 256, "heads": 4, "layers": 2, "ffn": 1024, "max_len": 128}
QUICK_CKKS = {"vocab": 1024, "d_model": 128, "heads": 4, "layers": 1, "ffn": 512, "max_len": 64}
CKKS_SUBSET = {"vocab": 4096, "layers": 1}
SITES = (("site-eu-1", "EU"), ("site-eu-2", "EU"), ("site-us-1", "US"), ("site-us-2", "US"))
ZONES = (("eu-central", "EU"), ("us-east", "US"))
REDUCER = "eu-central"
TILE = (1024, 1024)  # the shard tile (--tile): 4 MiB shards, as for a large model (README, "Sizing tiles")
SCALE = 1e-3  # the synthetic update: every parameter p becomes p · (1 + SCALE)

# (module, attribute path, phase): the library calls timed in a site process
SITE_PHASES = (
    ("fedshard.site.site", "Site._open", "load"),
    ("fedshard.site.model", "HeldModel.split", "split"),
    ("fedshard.site.site", "update_over", "update"),
    ("fedshard.site.site", "encrypt_shards", "encrypt"),
    ("fedshard.site.release", "build_manifest", "digest"),
    ("fedshard.integrity", "Manifest.signed", "sign"),
    ("fedshard.zone.rpc.client", "GrpcZoneClient.push", "push"),
    ("fedshard.zone.rpc.client", "GrpcZoneClient.fetch", "fetch"),
    ("fedshard.site.apply", "RoundShards.digests", "verify"),
    ("fedshard.site.site", "decrypt_aggregate", "decrypt"),
    ("fedshard.aggregation", "ServerOptimizer.apply", "apply"),
    ("fedshard.site.site", "Site._save", "save"),
)
# the library calls timed in a zone process
ZONE_PHASES = (
    ("fedshard.zone.rpc.service", "ZoneService.Push", "zone push (receive, validate, fold)"),
    ("fedshard.zone.rpc.service", "ZoneService.Forward", "zone forward in (receive, fold)"),
    ("fedshard.zone.aggregator", "ZoneAggregator.close_round", "zone close (forward out, publish)"),
    ("fedshard.zone.aggregator", "ZoneAggregator.fetch", "zone fetch (prepare)"),
)
SITE_ORDER = ("load", "split", "train", "update", "encrypt", "digest", "sign", "push")
EVAL_ORDER = ("load", "fetch", "verify", "decrypt", "apply", "save")


# the task: the real model, a synthetic update instead of training ---------------------------------
class SyntheticUpdateTask:
    """The large transformer whose "training" scales every parameter by ``1 + SCALE`` in place."""

    def __init__(self, transformer: dict[str, int] | None = None) -> None:
        self.transformer = transformer

    def build_model(self) -> Any:
        """The transformer with its deterministic initial values."""
        from clients.tasks.large_transformer import TransformerConfig, materialise

        return materialise(TransformerConfig(**(self.transformer or {})), seed=0)

    def load_data(self, partition: Any) -> Any:
        """No data."""
        from fedshard.task import TaskData

        return TaskData(train=None, test=None, num_train=1, num_test=1)

    def train(self, model: Any, data: Any, settings: Any) -> Any:
        """The synthetic update: no new memory, every value changes."""
        import torch

        from fedshard.task import Metrics

        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + SCALE)
        return Metrics(num_examples=1, loss=0.0)

    def evaluate(self, model: Any, data: Any) -> Any:
        """Nothing to evaluate on (the message still fetches, verifies, applies and saves)."""
        from fedshard.task import Metrics

        return Metrics(num_examples=1, loss=0.0, accuracy=0.0)


def _config(transformer: dict[str, int] | None, rounds: int, encrypt: bool, keys: Path | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "federation": {"name": "large-round", "seed": 7, "rounds": rounds, "min_sites": 4, "round_timeout_s": 7200},
        "task": {"target": "__main__:SyntheticUpdateTask", "options": {"transformer": transformer}},
        "sharding": {"tile": list(TILE)},
        # every shard public and global: all of the model is reduced in eu-central from the zones' partial sums
        "residency": {
            "detectors": False,
            "rules": [{"class": "*", "allow_regions": "*", "serve_to": "*"}],
            "encrypt": "all" if encrypt else "none",
        },
        # a push is staged whole until it commits: a budget of one update (+ 64 MiB) keeps it in reused buffers
        "zones": [
            {"name": n, "region": r, "endpoint": "127.0.0.1:0", "staging_mb": (_model_bytes(transformer) >> 20) + 64}
            for n, r in ZONES
        ],
        "reducing_zone": REDUCER,
        "sites": [{"id": s, "jurisdiction": j} for s, j in SITES],
    }
    if keys is not None:
        data["he"] = {"keys": str(keys)}
    return data


def _model_bytes(transformer: dict[str, int] | None) -> int:
    from clients.tasks.large_transformer import TransformerConfig, shard_plan

    return int(shard_plan(TransformerConfig(**(transformer or {}))).nbytes)


# timing the library's calls in a child process ------------------------------------------------------
class Phases:
    """Seconds per phase since the last :meth:`take`: the wall time during which at least one
    call of the phase was running (nested calls and calls in parallel threads, such as a
    site's pushes to several zones, count once)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.missing: list[str] = []
        self._running: Counter[str] = Counter()
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()

    def _enter(self, phase: str) -> None:
        with self._lock:
            if self._running[phase] == 0:
                self._since[phase] = time.perf_counter()
            self._running[phase] += 1

    def _leave(self, phase: str) -> None:
        with self._lock:
            self._running[phase] -= 1
            if self._running[phase] == 0:
                self.seconds[phase] += time.perf_counter() - self._since.pop(phase)

    def wrap(self, module: str, path: str, phase: str) -> None:
        """Time every call of ``module.path`` as ``phase`` (a missing target is noted, not fatal)."""
        import functools
        import importlib

        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
        target = getattr(owner, name, None) if owner is not None else None
        if target is None:
            self.missing.append(f"{module}.{path}")
            return

        @functools.wraps(target)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._enter(phase)
            try:
                return target(*args, **kwargs)
            finally:
                self._leave(phase)

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        """The seconds so far, reset (between messages: no call is running)."""
        with self._lock:
            out = dict(self.seconds)
            self.seconds.clear()
        return out


def _reset_peak() -> None:
    # VmHWM back to the current RSS; where that is refused the peak is the process's so far (an upper bound)
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


# a site process --------------------------------------------------------------------------------------
def site_child(site_id: str, config_path: Path, state_root: Path) -> None:
    """Serve one site's messages from stdin (one JSON line each) until stdin closes."""
    from fedshard.assembly import make_site
    from fedshard.config import load_federation
    from fedshard.protocol.messages import MessageKind, decode, encode
    from fedshard.routing import FederationRouting
    from fedshard.transports.flower.records import REQUESTS

    logging.getLogger("fedshard").setLevel(logging.ERROR)
    phases = Phases()
    for module, path, phase in SITE_PHASES:
        phases.wrap(module, path, phase)
    phases.wrap(__name__, "SyntheticUpdateTask.train", "train")
    fetched = [0]
    from fedshard.zone.rpc import client as client_module

    fetch = client_module.GrpcZoneClient.fetch

    def counting_fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        aggregate = fetch(self, *args, **kwargs)
        fetched[0] += sum(int(a.nbytes) for a in aggregate.means.values())
        fetched[0] += sum(len(b) for b in aggregate.ciphertexts.values())
        return aggregate

    client_module.GrpcZoneClient.fetch = counting_fetch  # type: ignore[method-assign]
    config = load_federation(config_path)
    site = make_site(config, site_id, state_root, FederationRouting(config))
    import torch  # the first message imports it anyway: its fixed cost is not the message's

    torch.zeros(1).add_(1)  # and its allocator warmed up
    # before any message: Python, torch, gRPC and fedshard imported, the site assembled, no model yet
    print(json.dumps({"ready": site_id, "missing": phases.missing, "rss": c.status_bytes("VmRSS")}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        kind = MessageKind(request["kind"])
        message = decode(REQUESTS[kind], request["message"])
        phases.take()
        fetched[0] = 0
        _reset_peak()
        t0 = time.perf_counter()
        reply = site.handle(kind, message)
        seconds = time.perf_counter() - t0
        out = {
            "reply": encode(reply).decode(),
            "seconds": seconds,
            "phases": phases.take(),
            "peak_rss": c.status_bytes("VmHWM"),
            "fetched_bytes": fetched[0],
        }
        print(json.dumps(out), flush=True)


def _child_env() -> dict[str, str]:
    return dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONUNBUFFERED="1", PYTHONPATH=str(c.REPO))


class SiteProcess:
    """One site in its own process, reached through its stdin/stdout."""

    def __init__(self, site_id: str, config_path: Path, state_root: Path) -> None:
        self.site_id = site_id
        argv = [sys.executable, __file__, "--site-child", site_id, "--config", str(config_path)]
        argv += ["--state-root", str(state_root)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=c.REPO, env=_child_env()
        )
        self.missing: list[str] = []
        self.base_rss = 0  # its RSS once assembled, before any message

    def ready(self) -> None:
        """Wait for the site to be assembled."""
        ready = self._read()
        self.missing, self.base_rss = ready["missing"], int(ready["rss"])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"site process {self.site_id} ended (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def call(self, kind: str, message: bytes) -> dict[str, Any]:
        """Send one message, return what the site process measured (and its reply)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"kind": kind, "message": message.decode()}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """Close its stdin; wait for it."""
        _end(self.proc)


def _end(proc: subprocess.Popen[str]) -> None:
    """Close a child's stdin (it exits then); wait for it, killing it after a minute."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ProcessSiteGateway:
    """A SiteGateway over site processes, one message at a time (records what each measured)."""

    def __init__(self, sites: Mapping[str, SiteProcess]) -> None:
        self.sites = dict(sites)
        self.records: list[dict[str, Any]] = []

    def nodes(self) -> list[str]:
        """The site ids."""
        return list(self.sites)

    def send(self, kind: Any, messages: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Each message to its site, in turn."""
        from fedshard.protocol.messages import SiteFailure, decode, encode
        from fedshard.transports.flower.records import REPLIES

        out: dict[str, Any] = {}
        for node, message in messages.items():
            measured = self.sites[node].call(kind.value, encode(message))
            reply = decode(REPLIES[kind], measured.pop("reply"))
            if getattr(reply, "ok", True) is False:
                out[node] = SiteFailure(reason=str(reply.reason))
                continue
            pushed = sum(p.nbytes for p in getattr(reply, "pushes", []))
            self.records.append(
                {"kind": kind.value, "round": getattr(message, "round", 0), "site": node, "pushed_bytes": pushed}
                | measured
            )
            out[node] = reply
        return out


# a zone process --------------------------------------------------------------------------------------
def zone_child(name: str, config_path: Path, store_root: Path, keys_file: Path) -> None:
    """Serve one zone over gRPC on loopback; on each stdin line print its phase seconds; exit when stdin closes."""
    from fedshard.assembly import make_zone, streaming_parties
    from fedshard.config import load_federation
    from fedshard.routing import FederationRouting
    from fedshard.zone.rpc.service import serve

    logging.getLogger("fedshard").setLevel(logging.ERROR)
    phases = Phases()
    for module, path, phase in ZONE_PHASES:
        phases.wrap(module, path, phase)
    config = load_federation(config_path)
    zc = next(z for z in config.zones if z.name == name)
    site_keys = {k: bytes.fromhex(v) for k, v in json.loads(keys_file.read_text()).items()}
    routing = FederationRouting(config)
    routing.check()
    zone = make_zone(zc, store_root, routing=routing, site_keys=site_keys)
    server, port = serve(zone, zc.endpoint, limits=zc.limits, parties=streaming_parties(config))
    print(json.dumps({"port": port, "missing": phases.missing, "staging_bytes": zc.staging_mb << 20}), flush=True)
    for _ in sys.stdin:
        print(json.dumps({"phases": phases.take()}), flush=True)
    server.stop(grace=1.0).wait()
    zone.close()


class ZoneProcess:
    """One zone in its own process."""

    def __init__(self, name: str, config_path: Path, store_root: Path, keys_file: Path) -> None:
        self.name = name
        argv = [sys.executable, __file__, "--zone-child", name, "--config", str(config_path)]
        argv += ["--state-root", str(store_root), "--site-keys", str(keys_file)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=c.REPO, env=_child_env()
        )
        started = self._read()
        self.endpoint = f"127.0.0.1:{started['port']}"
        self.missing: list[str] = started["missing"]
        self.staging_bytes = int(started["staging_bytes"])
        self.base_rss = c.status_bytes("VmRSS", self.proc.pid)

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"zone process {self.name} ended (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def phases(self) -> dict[str, float]:
        """Its phase seconds since the last call."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return dict(self._read()["phases"])

    def peak_rss(self) -> int:
        """Its peak RSS so far (bytes)."""
        return c.status_bytes("VmHWM", self.proc.pid)

    def close(self) -> None:
        """Close its stdin; wait for it."""
        _end(self.proc)


# one federation run ---------------------------------------------------------------------------------
class RoundClock:
    """A RoundObserver: the wall time of each round, and each zone's phases in it."""

    def __init__(self, zones: Mapping[str, ZoneProcess]) -> None:
        self.zones = zones
        self.rounds: list[dict[str, Any]] = []
        self._t = 0.0

    def on_start(self, sites: Any, rounds: int, genesis_version: str) -> None:
        """The clock starts when discovery ends."""
        for z in self.zones.values():
            z.phases()
        self._t = time.perf_counter()

    def on_round(self, result: Any) -> None:
        """Record the round that just ended."""
        now = time.perf_counter()
        zone: dict[str, float] = defaultdict(float)
        for z in self.zones.values():
            for phase, s in z.phases().items():
                zone[phase] += s
        self.rounds.append({"round": result.round, "seconds": now - self._t, "zone": dict(zone)})
        self._t = time.perf_counter()


@contextlib.contextmanager
def _federation(transformer: dict[str, int] | None, rounds: int, encrypt: bool) -> Iterator[dict[str, Any]]:
    """Run ``rounds`` rounds; yields what was measured."""
    import yaml

    from fedshard.assembly import SIGNING_KEY_FILE, grpc_connector
    from fedshard.config import load_federation
    from fedshard.coordinator.coordinator import Coordinator
    from fedshard.crypto.signing import generate_signing_key

    with tempfile.TemporaryDirectory(prefix="large-round-") as tmp:
        root = Path(tmp)
        keys = None
        if encrypt:
            from fedshard.crypto.he import he_init

            he_init(root / "keys")
            keys = (root / "keys").resolve()
        config_path = root / "federation.yaml"
        config_path.write_text(yaml.safe_dump(_config(transformer, rounds, encrypt, keys), sort_keys=False))
        config = load_federation(config_path)
        sites_root = root / "sites"
        public = {}
        for site_id, _ in SITES:
            (sites_root / site_id).mkdir(parents=True)
            public[site_id] = generate_signing_key(sites_root / site_id / SIGNING_KEY_FILE).hex()
        keys_file = root / "site-keys.json"
        keys_file.write_text(json.dumps(public))
        zones: dict[str, ZoneProcess] = {}
        sites: dict[str, SiteProcess] = {}
        clients: dict[str, Any] = {}
        try:
            for name, _ in ZONES:
                zones[name] = ZoneProcess(name, config_path, root / "zones", keys_file)
            sites = {s: SiteProcess(s, config_path, sites_root) for s, _ in SITES}
            for s in sites.values():
                s.ready()
            endpoints = {name: z.endpoint for name, z in zones.items()}
            clients = {name: grpc_connector(name, ep) for name, ep in endpoints.items()}
            gateway = ProcessSiteGateway(sites)
            clock = RoundClock(zones)
            result = Coordinator(config, gateway, clients, endpoints, clock).run()
            if result.stopped_reason or len(result.rounds) != rounds:
                raise RuntimeError(f"the federation stopped: {result.stopped_reason}")
            yield {
                "rounds": clock.rounds,
                "records": gateway.records,
                "zone_peak_rss": {n: z.peak_rss() for n, z in zones.items()},
                "zone_base_rss": {n: z.base_rss for n, z in zones.items()},
                "site_base_rss": {n: s.base_rss for n, s in sites.items()},
                "staging_bytes": max(z.staging_bytes for z in zones.values()),
                "missing": sorted({m for p in [*zones.values(), *sites.values()] for m in p.missing}),
            }
        finally:
            for client in clients.values():
                client.close()
            for s in sites.values():
                s.close()
            for z in zones.values():
                z.close()


def _round_figures(run: dict[str, Any], rnd: int) -> dict[str, Any]:
    """One round's phases (summed over sites), bytes and data-plane time."""
    clock = next(r for r in run["rounds"] if r["round"] == rnd)
    records = [r for r in run["records"] if r["round"] == rnd]
    train = [r for r in records if r["kind"] == "train"]
    evaluate = [r for r in records if r["kind"] == "evaluate"]
    phases: dict[str, float] = {}
    for prefix, group, order in (("train msg: ", train, SITE_ORDER), ("evaluate msg: ", evaluate, EVAL_ORDER)):
        for phase in order:
            phases[prefix + phase] = sum(r["phases"].get(phase, 0.0) for r in group)
        phases[prefix + "whole message"] = sum(r["seconds"] for r in group)
    phases.update(clock["zone"])
    training = phases["train msg: train"]
    return {
        "round_s": clock["seconds"],
        "data_plane_s": clock["seconds"] - training,
        "phases": phases,
        "pushed": sum(r["pushed_bytes"] for r in train),
        "fetched": sum(r["fetched_bytes"] for r in evaluate),
        "site_peak_rss": max(r["peak_rss"] for r in records),
    }


def copy_seconds_per_byte(nbytes: int, runs: int = 3) -> float:
    """Median seconds per byte of ``np.copyto`` of ``nbytes`` (float32), source and target already touched."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    stat = c.median_of(lambda: np.copyto(dst, src), runs=runs, warmup=1)
    return stat.median / src.nbytes


def measure(transformer: dict[str, int] | None, rounds: int, encrypt: bool) -> dict[str, Any]:
    """Run one variant; the median figures of its steady rounds (round 1 pays first use)."""
    model_bytes = _model_bytes(transformer)
    with _federation(transformer, rounds, encrypt) as run:
        steady = [_round_figures(run, r) for r in range(2, rounds + 1)]
        first = _round_figures(run, 1)
    per_byte = copy_seconds_per_byte(model_bytes)
    med = statistics.median
    moved = [f["pushed"] + f["fetched"] for f in steady]
    return {
        "model_bytes": model_bytes,
        "values": model_bytes // 4,
        "rounds": rounds,
        "round_s": med(f["round_s"] for f in steady),
        "first_round_s": first["round_s"],
        "data_plane_s": med(f["data_plane_s"] for f in steady),
        "phases": {k: med(f["phases"].get(k, 0.0) for f in steady) for k in steady[0]["phases"]},
        "pushed": med(f["pushed"] for f in steady),
        "fetched": med(f["fetched"] for f in steady),
        "moved": med(moved),
        "copy_floor_s": med(moved) * per_byte,
        "copy_gb_s": 1 / per_byte / 1e9,
        "site_peak_rss": med(f["site_peak_rss"] for f in steady),  # each round's largest message peak
        "zone_peak_rss": max(run["zone_peak_rss"].values()),
        "zone_base_rss": max(run["zone_base_rss"].values()),
        "site_base_rss": max(run["site_base_rss"].values()),
        "staging_bytes": run["staging_bytes"],
        "missing": run["missing"],
    }


def ckks_bytes_of_plan(transformer: dict[str, int] | None) -> tuple[int, int]:
    """(ciphertext bytes, values) of one site's fully encrypted update of ``transformer``'s model.

    Packed as a site packs it when every shard goes to one zone, group and class (this
    bench's routing): :func:`~fedshard.crypto.he.pack_layout` in plan order; a
    ciphertext's size depends only on its slot count, so
    :func:`~fedshard.crypto.he.encrypted_nbytes` gives the exact bytes.
    """
    from clients.tasks.large_transformer import TransformerConfig, shard_plan
    from fedshard.crypto.he import encrypted_nbytes, pack_layout

    plan = shard_plan(TransformerConfig(**(transformer or {})), TILE)
    sizes = [(sid, int(plan.shard(sid).size), "all") for sid in plan.shard_ids]
    packs = pack_layout(sizes)
    return encrypted_nbytes([p.count for p in packs]), sum(n for _, n, _ in sizes)


# report ------------------------------------------------------------------------------------------
def _gb_s(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f}" if seconds >= 1e-3 and nbytes else "–"  # not for a call that did nothing


_BYTE_PHASES = {
    "train msg: push": ("pushed", "pushed"),
    "zone push (receive, validate, fold)": ("pushed", "pushed"),
    "evaluate msg: fetch": ("fetched", "fetched"),
    "train msg: digest": ("model", "pushed"),
    "train msg: split": ("model", "model"),
    "evaluate msg: verify": ("model", "fetched"),
    "evaluate msg: apply": ("model", "model"),
    "evaluate msg: save": ("model", "model"),
    "evaluate msg: load": ("model", "model"),
    "train msg: load": ("model", "model"),
    "train msg: update": ("model", "model"),
    "train msg: encrypt": ("model", "model"),
    "evaluate msg: decrypt": ("model", "model"),
}
"""Which bytes a phase's GB/s is taken over: (plaintext, CKKS), each ``model`` (every site's
model), ``pushed`` or ``fetched``."""
_MB = 1e6


def _rows(plain: dict[str, Any], ckks: dict[str, Any]) -> list[list[str]]:
    """The table: one row per phase, then the round, the data plane and the copy floor."""

    def nbytes(run: dict[str, Any], what: str) -> float:
        return len(SITES) * run["model_bytes"] if what == "model" else run[what]

    rows = []
    for phase in plain["phases"]:
        p, k = plain["phases"][phase], ckks["phases"].get(phase, 0.0)
        which = _BYTE_PHASES.get(phase)
        rows.append(
            [
                phase,
                c.fmt(p, 3),
                _gb_s(nbytes(plain, which[0]), p) if which else "–",
                c.fmt(k, 3),
                _gb_s(nbytes(ckks, which[1]), k) if which else "–",
            ]
        )
    rows.append(["round (wall)", c.fmt(plain["round_s"], 3), "–", c.fmt(ckks["round_s"], 3), "–"])
    rows.append(
        [
            "data plane (round − training)",
            c.fmt(plain["data_plane_s"], 3),
            _gb_s(plain["moved"], plain["data_plane_s"]),
            c.fmt(ckks["data_plane_s"], 3),
            _gb_s(ckks["moved"], ckks["data_plane_s"]),
        ]
    )
    rows.append(
        [
            "copy floor (np.copyto of the bytes moved)",
            c.fmt(plain["copy_floor_s"], 3),
            f"{plain['copy_gb_s']:.2f}",
            c.fmt(ckks["copy_floor_s"], 3),
            f"{ckks['copy_gb_s']:.2f}",
        ]
    )
    return rows


def _notes(plain: dict[str, Any], ckks: dict[str, Any], plan_bytes: tuple[int, int], quick: bool) -> list[str]:
    """The section's notes: models, set-up, rounds, bytes, memory, CKKS bytes."""
    mb = _MB
    model_mb = plain["model_bytes"] / mb
    ckks_measured = ckks["pushed"] / (len(SITES) * 4 * ckks["values"])
    ckks_plan = plan_bytes[0] / (4 * plan_bytes[1])
    plain_model = f"{plain['values'] / 1e6:.1f} M-parameter transformer ({model_mb:.1f} MB)"
    ckks_model = f"{ckks['values'] / 1e6:.1f} M-parameter transformer ({ckks['model_bytes'] / mb:.1f} MB)"
    notes = [
        f"- Plaintext: the {plain_model}; every shard CKKS-encrypted: the {ckks_model}"
        + (
            " (--quick: small models, a smoke test of the path)."
            if quick
            else " (a subset of the 118 M one: one block, "
            "vocab 4,096, so that 4 sites' encryption and decryption fit a run on 2 cores)."
        ),
        "- 4 site processes (2 EU, 2 US), 2 zone processes (eu-central reducing, us-east), gRPC on loopback, plain "
        "text; the real Coordinator, Site (sealed store, signed manifests) and zones (residency policy, signatures "
        "checked); training replaced by a synthetic in-place update. Sites are sent their messages one at a time. "
        f"Shard tile {TILE[0]}x{TILE[1]} ({TILE[0] * TILE[1] * 4 / 2**20:g} MiB shards; `--tile`).",
        f"- Times are medians over rounds 2…{plain['rounds']} (plaintext) and 2…{ckks['rounds']} (CKKS); round 1 "
        f"(model build, genesis save, CKKS pool start) took {plain['first_round_s']:.2f} s / "
        f"{ckks['first_round_s']:.2f} s. Phase seconds are summed over the 4 sites (zone phases over both zones); "
        "a phase is a wrapped library call, so `push` includes the zone's work on the frames.",
        f"- Bytes moved per round: pushed {plain['pushed'] / mb:,.1f} MB + fetched {plain['fetched'] / mb:,.1f} MB "
        f"(plaintext); CKKS {ckks['pushed'] / mb:,.1f} MB + {ckks['fetched'] / mb:,.1f} MB. The copy floor is "
        f"`np.copyto` of that many bytes at {plain['copy_gb_s']:.2f} GB/s, measured in the same run; zone-to-zone "
        "forwarding of partial sums is not counted in it.",
        f"- Data plane: {plain['data_plane_s']:.2f} s = {plain['data_plane_s'] / plain['copy_floor_s']:.0f}× the "
        f"copy floor ({plain['copy_floor_s']:.3f} s).",
        f"- Peak RSS (VmHWM): zone {plain['zone_peak_rss'] / mb:,.0f} MB (its RSS at start "
        f"{plain['zone_base_rss'] / mb:,.0f} MB; staging budget {plain['staging_bytes'] / mb:,.0f} MB) = "
        f"{plain['zone_peak_rss'] / plain['model_bytes']:.2f}× the model; site during a message "
        f"{plain['site_peak_rss'] / mb:,.0f} MB = {plain['site_peak_rss'] / plain['model_bytes']:.2f}× the model "
        "(the median over rounds of the round's largest message peak; both include the processes' Python, gRPC and "
        f"torch); the site's RSS once assembled, before any message, {plain['site_base_rss'] / mb:,.0f} MB, so a "
        f"message adds {_site_added(plain):.2f}× the model.",
        f"- CKKS bytes per float32 byte: {ckks_measured:.2f}× pushed in the measured round; "
        f"{ckks_plan:.2f}× for the {plan_bytes[1] / 1e6:.1f} M values of the "
        f"{'quick' if quick else '118 M'} model's plan (packed as sites pack it, bytes exact).",
    ]
    if plain["missing"] or ckks["missing"]:
        notes.append(f"- Not timed (the library no longer has them): {', '.join(plain['missing'] + ckks['missing'])}.")
    notes.append(
        "- Zone memory with 20 sites is not run here (20 site processes of the 118 M model do not fit this machine): "
        "`bench/zone_memory.py` pushes 20 synthetic updates into one zone."
    )
    return notes


def _site_added(plain: dict[str, Any]) -> float:
    """What a site's largest message adds to its RSS before any message, in models."""
    return float((plain["site_peak_rss"] - plain["site_base_rss"]) / plain["model_bytes"])


def _interpretation(plain: dict[str, Any], ckks_plan: float) -> str:
    """The goals in words, and where the data plane's time goes."""
    mb = _MB
    floor_ratio = plain["data_plane_s"] / plain["copy_floor_s"]
    site_phases = {
        k: v for k, v in plain["phases"].items() if "msg: " in k and not k.endswith(("whole message", ": train"))
    }
    largest = sorted(site_phases.items(), key=lambda kv: -kv[1])[:3]
    where = ", ".join(f"{k.split(': ')[1]} ({k.split(' msg')[0]} message) {v:.2f} s" for k, v in largest)
    interpretation = (
        f"Goals: data plane ≤ 3× the copy floor: {floor_ratio:.0f}× ({'met' if floor_ratio <= 3 else 'not met'}); "
        f"the largest site phases are {where}. "
        f"Zone peak RSS ≤ 1.5 × model + staging budget: {plain['zone_peak_rss'] / mb:,.0f} MB "
        f"({(plain['zone_peak_rss'] - plain['zone_base_rss']) / mb:,.0f} MB over its RSS at start) against "
        f"{(1.5 * plain['model_bytes'] + plain['staging_bytes']) / mb:,.0f} MB; site peak RSS during a message "
        f"≤ 2.5 × model: {plain['site_peak_rss'] / plain['model_bytes']:.2f}× ({_site_added(plain):.2f}× over the "
        "site's RSS before its first message); CKKS bytes ≤ 3× float32: "
        f"{ckks_plan:.2f}×."
    )
    return interpretation


def report(
    plain: dict[str, Any], ckks: dict[str, Any], plan_bytes: tuple[int, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Print the table, write the section, print the headline JSON."""
    ckks_plan = plan_bytes[0] / (4 * plan_bytes[1])
    headers = ["phase (4 sites, summed)", "plaintext s", "plaintext GB/s", "CKKS s", "CKKS GB/s"]
    rows = _rows(plain, ckks)
    headline = {
        "data_plane_s": plain["data_plane_s"],
        "copy_floor_s": plain["copy_floor_s"],
        "zone_peak_rss_mb": plain["zone_peak_rss"] / _MB,
        "site_peak_rss_mb": plain["site_peak_rss"] / _MB,
        "site_base_rss_mb": plain["site_base_rss"] / _MB,
        "model_mb": plain["model_bytes"] / _MB,
        "ckks_bytes_per_f32": ckks_plan,
    }
    c.print_table("a large full-parameter round, 4 sites, 2 zones", headers, rows)
    notes = _notes(plain, ckks, plan_bytes, args.quick)
    runs = f"{plain['rounds']} plaintext rounds, {ckks['rounds']} CKKS rounds (medians of rounds ≥ 2)"
    c.publish(args, SECTION, "A large full-parameter round", runs, None, notes, headers, rows,
              _interpretation(plain, ckks_plan), headline=headline)  # fmt: skip
    return headline


def main(argv: list[str] | None = None) -> int:
    """Run the plaintext and the CKKS variant, print, publish, and print the headline JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--rounds", type=int, default=None, help="plaintext rounds (default: 3; --quick 2)")
    parser.add_argument(
        "--tile", default="1024x1024", help="the shard tile, ROWSxCOLS (default 1024x1024: 4 MiB shards)"
    )
    parser.add_argument("--site-child", help=argparse.SUPPRESS)
    parser.add_argument("--zone-child", help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--state-root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--site-keys", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global TILE
    rows, _, cols = args.tile.partition("x")
    TILE = (int(rows), int(cols))
    if args.site_child:
        site_child(args.site_child, args.config, args.state_root)
        return 0
    if args.zone_child:
        zone_child(args.zone_child, args.config, args.state_root, args.site_keys)
        return 0
    plain_model = QUICK_TRANSFORMER if args.quick else None
    ckks_model = QUICK_CKKS if args.quick else CKKS_SUBSET
    rounds = max(2, args.rounds or (2 if args.quick else 3))
    plain = measure(plain_model, rounds, encrypt=False)
    ckks = measure(ckks_model, 2, encrypt=True)
    plan_bytes = ckks_bytes_of_plan(plain_model)
    report(plain, ckks, plan_bytes, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
