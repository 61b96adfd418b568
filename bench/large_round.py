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
  signing key, shared routing, HE codec when encrypting) in its own process; the
  coordinator reaches it through a pipe with each message JSON-encoded, as Flower
  would;
* training is replaced by a synthetic update (every parameter scaled by 1 + 10⁻³, in
  place): everything else a round does is the real code.

A round's train message first catches the site up to the round before: load (the held
model, or the sealed store → model) → fetch (gRPC) → verify (digests and Merkle root) →
[decrypt] → apply (server optimiser, in place) → save (sealed store); then split (the
pre-training copy) → synthetic training → update (trained − base) → [HE encryption] →
digest (the manifest) → sign → push (gRPC; the zone validates and folds as the frames
arrive); then the coordinator closes the zones (they fold up, forward partial sums to the
reducing zone, publish). The last round's aggregate is fetched by an evaluate message of
its own, so the last round is not a steady one and is left out of the figures, as is
round 1 (model build, genesis save).

Two kinds of round alternate in one run, on the same processes:

* *component rounds* (even rounds): the sites are sent their messages one after the
  other, so every phase below runs with nothing else of the round beside it. The sum of
  a round's phases (every site's, and the zones' close) is its **components' sum**.
* *federation rounds* (odd rounds from 3): every site is sent its message at once, as a
  deployment's SuperNodes receive them. Their **data plane** (round − training) is the
  headline, compared with the components' sum (issue 39: ≤ 1.2×).

Phases are timed by wrapping the library's own functions in the site and zone
processes (nothing in the library is changed); a wrapper whose target no longer exists
is reported, not fatal. Peak RSS is each process's ``VmHWM``, reset before each
message (sites) and read at the end of the run (zones).

The copy floor is the time NumPy's ``np.copyto`` takes to copy every byte the round
moves (each site's push and each site's fetch), measured in the same run.

    .venv/bin/python bench/large_round.py [--quick] [--json] [--rounds N] [--tile RxC] [--output FILE]

``--tile``: the federation's shard tile (default 1024x1024, 4 MiB shards, as the README
advises for a large model: fewer shards mean fewer store files, digests and frames).

``--rounds``: plaintext rounds (default 6: component rounds 2 and 4, federation rounds 3
and 5; at least 4).

``--quick``: the 2.7 M-parameter transformer (2 blocks, d_model 256) in plaintext and a
0.3 M-parameter one (1 block, d_model 128) with every shard encrypted (3 rounds: its
phases come from component round 2); the same processes and phases, so a smoke test of the whole path, but its
figures say little (the processes' fixed allocations dwarf the model, the copy floor
runs in cache); the encrypted bytes are the 2.7 M model's, from its plan. Full mode: the
118 M model in plaintext; with every shard encrypted real rounds of a
17 M-parameter subset of it (one block, vocab 4,096; 3 rounds), and the exact
ciphertext bytes of the 118 M model from its shard plan (ciphertext size depends only
on a shard's value count).

``--scheme``: the HE scheme of the encrypted variant (default: fedshard's default,
``he.scheme: bfv``; ``ckks`` as before).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedshard.deploy.loopback import free_ports

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
from _large_round_procs import Phases, ProcessSiteGateway, RoundClock, SiteProcess, ZoneProcess, reset_peak
from _large_round_report import report

QUICK_TRANSFORMER = {"vocab": 4096, "d_model": 256, "heads": 4, "layers": 2, "ffn": 1024, "max_len": 128}
QUICK_HE = {"vocab": 1024, "d_model": 128, "heads": 4, "layers": 1, "ffn": 512, "max_len": 64}
HE_SUBSET = {"vocab": 4096, "layers": 1}
SITES = (("site-eu-1", "EU"), ("site-eu-2", "EU"), ("site-us-1", "US"), ("site-us-2", "US"))
ZONES = (("eu-central", "EU"), ("us-east", "US"))
REDUCER = "eu-central"
CLOSE = "zone: close (forward out, publish)"
"""The one zone phase outside every site's calls (the coordinator closes the zones one after the other)."""
TILE = (1024, 1024)  # the shard tile (--tile): 4 MiB shards, as for a large model (README, "Sizing tiles")
SCALE = 1e-3  # the synthetic update: every parameter p becomes p · (1 + SCALE)
SCHEME = "bfv"  # the encrypted variant's HE scheme (--scheme; default fedshard's, he.DEFAULT_SCHEME)

# (module, attribute path, phase): the library calls timed in a site process
SITE_PHASES = (
    ("fedshard.site.site", "Site._open", "load"),
    ("fedshard.site._model", "HeldModel.split", "split"),
    ("fedshard.site.site", "update_over", "update"),
    ("fedshard.site._release", "encrypt_shards", "encrypt"),
    ("fedshard.site._release", "build_manifest", "digest"),
    ("fedshard.integrity", "Manifest.signed", "sign"),
    ("fedshard.zone.rpc.client", "GrpcZoneClient.push", "push"),
    ("fedshard.zone.rpc.client", "GrpcZoneClient.fetch", "fetch"),
    ("fedshard.site._apply", "RoundShards.digests", "verify"),
    ("fedshard.site.site", "decrypt_aggregate", "decrypt"),
    ("fedshard.aggregation", "ServerOptimizer.apply", "apply"),
    ("fedshard.site.site", "Site._save", "save"),
)
# the library calls timed in a zone process
ZONE_PHASES = (
    ("fedshard.zone.rpc.service", "ZoneService.Push", "zone: push (receive, validate, fold)"),
    ("fedshard.zone.rpc.service", "ZoneService.Forward", "zone: forward in (receive, fold)"),
    ("fedshard.zone.aggregator", "ZoneAggregator.close_round", CLOSE),
    ("fedshard.zone.aggregator", "ZoneAggregator.fetch", "zone: fetch (prepare)"),
)
# a round's site phases in the order a train message runs them: catch up to the round before, then train and push
SITE_ORDER = ("load", "fetch", "verify", "decrypt", "apply", "save", "split", "train", "update", "encrypt", "digest")
SITE_ORDER += ("sign", "push")


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
    staging_mb = (_model_bytes(transformer) >> 20) + 64
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
        # a push is staged whole until it commits: a budget of one update (+ 64 MiB) keeps it in reused buffers;
        # fixed free ports: each zone process takes its peers (the reducing zone) from the config, as deployed
        "zones": [
            {"name": n, "region": r, "endpoint": f"127.0.0.1:{port}", "staging_mb": staging_mb}
            for (n, r), port in zip(ZONES, free_ports(len(ZONES)), strict=True)
        ],
        "reducing_zone": REDUCER,
        "sites": [{"id": s, "jurisdiction": j} for s, j in SITES],
    }
    if keys is not None:
        data["he"] = {"scheme": SCHEME, "keys": str(keys)}
    return data


def _model_bytes(transformer: dict[str, int] | None) -> int:
    from clients.tasks.large_transformer import TransformerConfig, shard_plan

    return int(shard_plan(TransformerConfig(**(transformer or {}))).nbytes)


# a site process --------------------------------------------------------------------------------------
def site_child(site_id: str, config_path: Path, state_root: Path) -> None:
    """Serve one site's messages from stdin (one JSON line each) until stdin closes."""
    from fedshard.assembly import make_site
    from fedshard.assembly.routing import FederationRouting
    from fedshard.config import load_federation
    from fedshard.protocol.messages import MessageKind, decode, encode
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
        reset_peak()
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


# a zone process --------------------------------------------------------------------------------------
def zone_child(name: str, config_path: Path, store_root: Path, keys_file: Path) -> None:
    """Serve one zone over gRPC on loopback; on each stdin line print its phase seconds; exit when stdin closes."""
    from fedshard.assembly import make_zone, streaming_parties
    from fedshard.assembly.routing import FederationRouting
    from fedshard.config import load_federation
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

            he_init(root / "keys", scheme=SCHEME)
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
            clock = RoundClock(zones)
            gateway = ProcessSiteGateway(sites, clock, at_once)
            result = Coordinator(config, gateway, clients, endpoints).run()
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


def at_once(rnd: int) -> bool:
    """Whether round ``rnd``'s messages go to every site at once (a federation round: odd rounds
    from 3) or one site after the other (round 1, and the component rounds: even rounds)."""
    return rnd >= 3 and rnd % 2 == 1


def _round_figures(run: dict[str, Any], rnd: int) -> dict[str, Any]:
    """One round's phases (summed over sites), bytes, data-plane time and components' sum."""
    clock = next(r for r in run["rounds"] if r["round"] == rnd)
    records = [r for r in run["records"] if r["round"] == rnd]
    phases = {f"site: {phase}": sum(r["phases"].get(phase, 0.0) for r in records) for phase in SITE_ORDER}
    phases["site: whole messages"] = sum(r["seconds"] for r in records)
    phases.update(sorted(clock["zone"].items()))
    trained = [r["phases"].get("train", 0.0) for r in records]
    # what the round spent training: summed when the sites ran in turn; at once, the longest site's (a lower
    # bound of the time some site trained, so the data plane is not flattered)
    training = max(trained) if at_once(rnd) else sum(trained)
    work = [k for k in phases if k.startswith("site: ") and k not in ("site: train", "site: whole messages")]
    return {
        "round_s": clock["seconds"],
        "data_plane_s": clock["seconds"] - training,
        "components_s": sum(phases[k] for k in work) + phases.get(CLOSE, 0.0),
        "phases": phases,
        "pushed": sum(r["pushed_bytes"] for r in records),
        "fetched": sum(r["fetched_bytes"] for r in records),
        "site_peak_rss": max(r["peak_rss"] for r in records),
    }


def copy_seconds_per_byte(nbytes: int, runs: int = 3) -> float:
    """Median seconds per byte of ``np.copyto`` of ``nbytes`` (float32), source and target already touched."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    stat = c.median_of(lambda: np.copyto(dst, src), runs=runs, warmup=1)
    return stat.median / src.nbytes


def measure(transformer: dict[str, int] | None, rounds: int, encrypt: bool) -> dict[str, Any]:
    """Run one variant; the median figures of its steady rounds, component rounds and federation
    rounds apart (round 1 pays first use; the last round has an evaluate message besides)."""
    model_bytes = _model_bytes(transformer)
    with _federation(transformer, rounds, encrypt) as run:
        steady = {r: _round_figures(run, r) for r in range(2, rounds)}
        first = _round_figures(run, 1)
    per_byte = copy_seconds_per_byte(model_bytes)
    med = statistics.median

    def medians(figures: list[dict[str, Any]]) -> dict[str, Any]:
        out = {k: med(f[k] for f in figures) for k in ("round_s", "data_plane_s", "components_s")}
        out["phases"] = {k: med(f["phases"].get(k, 0.0) for f in figures) for k in figures[0]["phases"]}
        out["rounds"] = len(figures)
        return out

    moved = [f["pushed"] + f["fetched"] for f in steady.values()]
    return {
        "model_bytes": model_bytes,
        "values": model_bytes // 4,
        "rounds": rounds,
        "one_at_a_time": medians([f for r, f in steady.items() if not at_once(r)]),
        "at_once": medians(together) if (together := [f for r, f in steady.items() if at_once(r)]) else None,
        "first_round_s": first["round_s"],
        "pushed": med(f["pushed"] for f in steady.values()),
        "fetched": med(f["fetched"] for f in steady.values()),
        "moved": med(moved),
        "copy_floor_s": med(moved) * per_byte,
        "copy_gb_s": 1 / per_byte / 1e9,
        "site_peak_rss": med(f["site_peak_rss"] for f in steady.values()),  # each round's largest message peak
        "zone_peak_rss": max(run["zone_peak_rss"].values()),
        "zone_base_rss": max(run["zone_base_rss"].values()),
        "site_base_rss": max(run["site_base_rss"].values()),
        "staging_bytes": run["staging_bytes"],
        "missing": run["missing"],
        "sites": len(SITES),
        "tile": TILE,
    }


def he_bytes_of_plan(transformer: dict[str, int] | None) -> tuple[int, int]:
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
    return encrypted_nbytes([p.count for p in packs], SCHEME), sum(n for _, n, _ in sizes)


def main(argv: list[str] | None = None) -> int:
    """Run the plaintext and the encrypted variant, print, publish, and print the headline JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--rounds", type=int, default=None, help="plaintext rounds (default: 6; --quick 4; at least 4)")
    parser.add_argument(
        "--tile", default="1024x1024", help="the shard tile, ROWSxCOLS (default 1024x1024: 4 MiB shards)"
    )
    parser.add_argument(
        "--scheme",
        choices=("bfv", "ckks"),
        default=None,
        help="the encrypted variant's HE scheme (default: fedshard's)",
    )
    parser.add_argument("--site-child", help=argparse.SUPPRESS)
    parser.add_argument("--zone-child", help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--state-root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--site-keys", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global TILE, SCHEME
    rows, _, cols = args.tile.partition("x")
    TILE = (int(rows), int(cols))
    if args.scheme is None:
        from fedshard.crypto.he import DEFAULT_SCHEME

        args.scheme = DEFAULT_SCHEME
    SCHEME = args.scheme
    if args.site_child:
        site_child(args.site_child, args.config, args.state_root)
        return 0
    if args.zone_child:
        zone_child(args.zone_child, args.config, args.state_root, args.site_keys)
        return 0
    plain_model = QUICK_TRANSFORMER if args.quick else None
    he_model = QUICK_HE if args.quick else HE_SUBSET
    rounds = max(4, args.rounds or (4 if args.quick else 6))
    plain = measure(plain_model, rounds, encrypt=False)
    he = measure(he_model, 3, encrypt=True) | {"scheme": SCHEME.upper()}  # its phases: component round 2
    plan_bytes = he_bytes_of_plan(plain_model)
    report(plain, he, plan_bytes, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
