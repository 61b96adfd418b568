"""Per-phase time of one update through the whole chain, in one process (a rough profile).

site split → digest (build the manifest) → sign → push over gRPC on loopback (the zone
reassembles, digests, validates and folds every frame) → publish (close the round) →
fetch (the client checks every digest and the Merkle root) → apply (join the shards
into tensors). Two phases are also timed on their own: the zone's frame assembly with
its digests (no gRPC, no fold), and the digests of the fetched aggregate.

The zone serves from this process (one GIL), so push and fetch include both ends; this
is a profile to find where the time goes, not a throughput figure (``bench/upload.py``
is that). Not part of ``make bench``; nothing is written to BENCHMARKS.md.

    .venv/bin/python bench/digest_chain.py [--quick] [--json] [--mb 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.integrity import shard_digest
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.frames import Declared, FrameAssembler, Header, shard_chunks
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.service import serve

SITE = "site-a"
CHUNK = 1 << 20


@contextmanager
def _phase(phases: dict[str, list[float]], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    phases.setdefault(name, []).append(time.perf_counter() - start)


def _zone_assembly(manifest: Any, shards: dict[str, np.ndarray]) -> None:
    """The zone's frame assembly and digests alone (what a push does per frame, minus gRPC and fold)."""
    declared = {
        e.shard_id: Declared(e.shard_id, e.nbytes, e.digest, declared_by=Header.MANIFEST) for e in manifest.shards
    }
    assembler = FrameAssembler(declared, source=Header.MANIFEST)
    for sid, value in shards.items():
        for chunk in shard_chunks(sid, value, CHUNK):
            assembler.add(chunk)
    assembler.finish()


def run(mb: int, runs: int) -> dict[str, float]:
    """Median seconds of each phase over ``runs`` rounds (after one warm-up round)."""
    update = c.synthetic_update(mb * (1 << 20) // 4)
    plan = c.make_plan(update)
    key = Ed25519PrivateKey.generate()
    zone = ZoneAggregator(c.ZONE, "EU", staging_bytes=4 * c.num_bytes(update))
    server, port = serve(zone, "127.0.0.1:0", max_workers=4)
    phases: dict[str, list[float]] = {}
    try:
        with GrpcZoneClient(f"127.0.0.1:{port}", timeout=600, chunk_bytes=CHUNK) as client:
            for rnd in range(1, runs + 2):
                if rnd == 2:
                    phases.clear()  # round 1 warms up
                spec = c.round_spec(rnd, plan, [SITE])
                client.open_round(spec)
                with _phase(phases, "split"):
                    shards = plan.split(update)
                with _phase(phases, "digest"):
                    manifest = c.make_manifest(plan, shards, site_id=SITE, round=rnd, weight=c.SITE_WEIGHT)
                with _phase(phases, "sign"):
                    signed = manifest.signed(key)
                with _phase(phases, "zone assembly+digest (alone)"):
                    _zone_assembly(signed, shards)
                with _phase(phases, "push (incl. zone validate+fold)"):
                    client.push(signed, spec.token, shards)
                with _phase(phases, "publish"):
                    client.close_round(rnd)
                with _phase(phases, "fetch (incl. verify)"):
                    aggregate = client.fetch(rnd)
                with _phase(phases, "fetch digests (alone)"):
                    for value in aggregate.means.values():
                        shard_digest(value)
                with _phase(phases, "apply (join)"):
                    plan.join(aggregate.means)
    finally:
        server.stop(grace=None).wait(timeout=10)
    return {name: float(np.median(times)) for name, times in phases.items()}


def main(argv: list[str] | None = None) -> None:
    """Run and print the per-phase times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 MB, one round")
    parser.add_argument("--json", action="store_true", help="print the phase times as JSON last")
    parser.add_argument("--mb", type=int, default=100, help="update size in MiB")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    mb, runs = (8, 1) if args.quick else (args.mb, args.runs)
    times = run(mb, runs)
    for name, seconds in times.items():
        print(f"{name:36s} {seconds * 1e3:9.1f} ms  {mb / 1024 / seconds:6.2f} GiB/s")
    if args.json:
        print(json.dumps({name: round(s, 6) for name, s in times.items()}))


if __name__ == "__main__":
    main()
