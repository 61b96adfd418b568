"""The site's shard store (issue 7): encrypted reads, cold tiers, key rotation, loading a large model.

Everything runs in one process on a local-folder store (``SealedShardStore`` on
``LocalDirBackend``: fsync'd writes; files in the page cache when read, i.e. warm):

* **warm read**: ``store.get`` of one 256x256 float32 tile (262 KB): read the blob,
  check its header, AES-256-GCM decrypt, SHA-256 digest check. The tiles are the
  256x256 weight tiles of the first two blocks of the synthetic large transformer
  (``clients/tasks/large_transformer.py``), read in turn; p50/p99 per run of READS
  reads, median over runs. Goal p99 ≤ 1 ms.
* **cold read**: the same after ``store.tier(…, fmt)`` for fp8, int8, int4 (a fresh
  store each, same tensors): + dequantisation. Goal p99 ≤ 20 ms. The same pass gives
  the **bytes saved** and the measured **error** per format against its bound.
* **key rotation**: ``rotate_keys`` on a store whose catalog lists 1,000,000 shards
  (catalog and key table built directly; rotation touches neither the catalog nor any
  shard blob, so blobs are not needed), alternating between two KEKs; rate = shard
  keys / wall time of the whole rotation (journal, re-wrap, fsync'd commit). Goal
  ≥ 1 M keys/s.
* **model load**: the 118 M-parameter transformer from the encrypted store into a
  module built on the meta device (``load_module``), without prefetch (look-ahead 0)
  and with (look-ahead 2), next to ``safetensors`` loading the same weights from one
  file (``load_file`` into a dict; ``load_model`` into the module), interleaved runs.

    .venv/bin/python bench/store.py [--quick] [--json] [--runs N] [--output FILE]

``--json`` prints ``warm_read_p50_ms``, ``warm_read_p99_ms``, ``cold_read_p99_ms`` (per format),
``rotation_keys_per_s``, ``cold_bytes_fraction`` and ``cold_relative_rms`` (per format),
``cold_within_bound``, ``model_params``, ``load_s`` (no prefetch), ``load_prefetch_s`` and
``safetensors_load_model_s`` (medians).

The model loads are in ``_store_loads.py``, the report in ``_store_report.py``.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c
from _store_loads import ModelLoads, time_loads
from _store_report import HEADERS, Measured, headline, interpretation, notes, table

from clients.tasks.large_transformer import TransformerConfig, init_tensors, num_parameters
from fedshard.crypto.at_rest import Kek
from fedshard.store import ColdFormat, LocalDirBackend, SealedShardStore, rotate_keys
from fedshard.store.catalog import CATALOG, Catalog, CatalogEntry, keys_name
from fedshard.store.model_io import plan_of, write_tensors
from fedshard.store.quantize import error_bound

SECTION = "store"
TILE = (256, 256)
QUICK_MODEL = TransformerConfig(vocab=512, d_model=256, heads=4, layers=2, ffn=1024, max_len=64)


class Clock:
    """A settable clock for tiering."""

    def __init__(self) -> None:
        self.now = 1e9

    def __call__(self) -> float:
        return self.now


def own_cpu_seconds() -> float:
    """CPU seconds of this process (all its threads)."""
    t = os.times()
    return t.user + t.system


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms" if x < 0.01 else f"{x * 1e3:.1f} ms"


# workloads ---------------------------------------------------------------------------------
def subset(cfg: TransformerConfig, blocks: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """The tensors of the first ``blocks`` transformer blocks (real initial weights)."""
    prefixes = tuple(f"blocks.{i}." for i in range(blocks))
    return [(n, t.numpy()) for n, t in init_tensors(cfg, seed) if n.startswith(prefixes)]


def fresh_store(root: Path, name: str, kek: Kek, durable: bool, clock: Clock | None = None) -> SealedShardStore:
    """A new store in ``root/name`` (``durable``: fsync every write)."""
    backend = LocalDirBackend(root / name, durable=durable)
    return SealedShardStore.create(backend, kek, clock=clock or time.time)


def read_latencies(store: SealedShardStore, tiles: list[str], reads: int) -> list[float]:
    """Seconds of each of ``reads`` gets, cycling over ``tiles`` (after one untimed pass)."""
    for sid in tiles:
        store.get(sid)
    out = []
    perf = time.perf_counter
    for i in range(reads):
        sid = tiles[i % len(tiles)]
        t0 = perf()
        store.get(sid)
        out.append(perf() - t0)
    return out


def read_components(store: SealedShardStore, shard_id: str, reps: int) -> dict[str, float]:
    """Median seconds of the parts of one warm read: file read, AES-GCM decryption, SHA-256 digest."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from fedshard.integrity.digest import shard_digest
    from fedshard.store.sealed_store import blob_name

    name = blob_name(shard_id, store.stat(shard_id).version)
    values = store.get(shard_id)
    key, nonce = os.urandom(32), os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, values.tobytes(), b"")
    parts: dict[str, Callable[[], object]] = {
        "file read": lambda: store.backend.read(name),
        "AES-GCM decrypt": lambda: AESGCM(key).decrypt(nonce, sealed, b""),
        "SHA-256 digest": lambda: shard_digest(values),
    }
    return {part: c.median_of(fn, runs=reps, warmup=3).median for part, fn in parts.items()}


def synthetic_store(root: Path, n: int, kek: Kek, durable: bool) -> LocalDirBackend:
    """A store whose catalog lists ``n`` shards (ids like a large model's tiles), each with its own data key."""
    digest = "0" * 64
    entry = CatalogEntry(1, "full", digest, digest, 262_348, 262_144, 65_536, 1.0)
    entries = {f"blocks.{i // 4096}.ff{i % 2}.weight#r{(i // 16) % 256}c{i % 16}": entry for i in range(n)}
    keys = {sid: os.urandom(32) for sid in entries}
    catalog = Catalog(store_id="bench", kek_id="", generation=1, entries=entries, keys=keys)
    raw_catalog, raw_keys = catalog.seal(kek)
    backend = LocalDirBackend(root / f"rotation-{n}", durable=durable)
    backend.write(keys_name(1), raw_keys)
    backend.write(CATALOG, raw_catalog)
    return backend


# measures ------------------------------------------------------------------------------------
def measure_reads(m: Measured, root: Path, kek: Kek, cfg: TransformerConfig, seed: int) -> None:
    """Warm reads of the first blocks' tiles, then cold reads, bytes and error per cold format."""
    durable = not m.quick
    tensors = subset(cfg, m.tier_blocks, seed)
    plan = plan_of([(n, a.shape, "<f4") for n, a in tensors], TILE)
    tiles = [s.shard_id for s in plan.shards if s.shape == TILE]
    m.values, m.shards, m.tiles = sum(a.size for _, a in tensors), len(plan), len(tiles)
    print(f"read workload: {len(tensors)} tensors, {m.values:,} values, {len(plan)} shards, {len(tiles)} full tiles")
    hot = fresh_store(root, "hot", kek, durable)
    write_tensors(hot, plan, tensors)
    hot_runs = [read_latencies(hot, tiles, m.reads) for _ in range(m.runs)]
    m.warm = ([_pct(r, 50) for r in hot_runs], [_pct(r, 99) for r in hot_runs], [max(r) for r in hot_runs])
    print(f"warm read p50 {_ms(statistics.median(m.warm[0]))} p99 {_ms(statistics.median(m.warm[1]))}")
    m.parts = read_components(hot, tiles[0], 50 if m.quick else 500)
    originals = dict(plan.split(dict(tensors)))
    m.hot_bytes = hot.stats().tiers["hot"].stored_bytes
    for fmt in ColdFormat:
        clock = Clock()
        store = fresh_store(root, f"cold-{fmt.value}", kek, durable, clock)
        write_tensors(store, plan, tensors)
        clock.now += 91 * 86400
        t0 = time.perf_counter()
        report = store.tier(90 * 86400, fmt)
        tier_s = time.perf_counter() - t0
        cold_runs = [read_latencies(store, tiles, m.reads // 2) for _ in range(m.runs)]
        stats = store.stats()
        err = stats.formats[fmt.value]
        ratio = max(
            float((np.abs(store.get(sid, touch=False) - a) / error_bound(a, fmt).reshape(a.shape)).max())
            for sid, a in list(originals.items())[:64]
        )
        m.cold[fmt.value] = {
            "p50": [_pct(r, 50) for r in cold_runs],
            "p99": [_pct(r, 99) for r in cold_runs],
            "stored": stats.tiers["cold"].stored_bytes,
            "logical": stats.tiers["cold"].logical_bytes,
            "moved": len(report.moved),
            "err": err,
            "bound_ratio": ratio,
            "tier_s": tier_s,
        }
        print(
            f"cold {fmt.value}: p99 {_ms(statistics.median(m.cold[fmt.value]['p99']))}, "
            f"{stats.tiers['cold'].stored_bytes / stats.tiers['cold'].logical_bytes:.1%} of fp32, "
            f"rel rms {err.relative_rms:.2%}, max/bound {ratio:.2f}"
        )
        del store


def measure_rotation(m: Measured, root: Path, kek: Kek) -> Kek:
    """Rotations of a catalog of ``m.rotation_keys`` shards between two KEKs; returns the KEK in force."""
    t0 = time.perf_counter()
    backend = synthetic_store(root, m.rotation_keys, kek, not m.quick)
    m.build_s = time.perf_counter() - t0
    keys_pair = [kek, Kek.generate()]
    rotate_keys(backend, keys_pair[0], keys_pair[1])  # warm-up (file cache), not timed
    keys_pair.reverse()
    for _ in range(m.runs):
        gc.collect()
        t0 = time.perf_counter()
        report = rotate_keys(backend, keys_pair[0], keys_pair[1])
        m.rot_wall.append(time.perf_counter() - t0)
        m.rot_core.append(report.seconds)
        keys_pair.reverse()
    m.table_mb = sum(s.size for s in (backend.stat(n) for n in backend.list("keys/")) if s) / 1e6
    m.catalog_mb = (backend.stat(CATALOG).size if backend.stat(CATALOG) else 0) / 1e6
    print(f"rotation of {m.rotation_keys:,} keys: {m.rotation_rate() / 1e6:.2f} M keys/s")
    return keys_pair[0]


def measure_model(m: Measured, root: Path, kek: Kek, cfg: TransformerConfig, seed: int) -> None:
    """The large model: written, then every way of loading it; then the store's own key rotation."""
    m.params = num_parameters(cfg)
    store = fresh_store(root, "model", kek, not m.quick)
    model = ModelLoads(cfg, store, root, seed)
    m.write_s, m.model_bytes, m.model_shards = model.write_s, model.record.plan.nbytes, len(model.record.plan)
    m.tokens = (int(model.tokens.shape[0]), int(model.tokens.shape[1]))
    m.torch_threads = model.torch_threads
    m.loads, m.peaks = time_loads(model.variants(), m.load_runs, warm_up=not m.quick)
    for name, xs in m.loads.items():
        print(f"{name}: {statistics.median(xs):.3f} s")
    # the same store's rotation, then a read under the new key
    new = Kek.generate()
    rotation = rotate_keys(store.backend, kek, new)
    m.model_rotation_keys, m.model_rotation_s = rotation.keys, rotation.seconds
    SealedShardStore.open(store.backend, new).get(store.list()[0])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--runs", type=int, default=None, help="timed runs of each measure (default 5; 1 --quick)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
    quick = args.quick
    m = Measured(
        quick=quick,
        runs=args.runs or (1 if quick else 5),
        load_runs=args.runs or (1 if quick else 3),
        reads=100 if quick else 2000,
        tier_blocks=1 if quick else 2,
        rotation_keys=5_000 if quick else 1_000_000,
    )
    model_cfg = QUICK_MODEL if quick else TransformerConfig()
    seed = 0

    import cryptography
    import safetensors

    desc = c.machine_description()
    desc["numpy"] += (
        f", torch {torch.__version__}, cryptography {cryptography.__version__}, safetensors {safetensors.__version__}"
    )
    ticks0 = c.cpu_ticks()
    load0 = os.getloadavg()
    wall0, busy0, own0 = time.perf_counter(), c.machine_busy_seconds(), own_cpu_seconds()
    tmp = tempfile.TemporaryDirectory(prefix="fedshard-bench-store-")
    root = Path(tmp.name)
    kek = Kek.generate()
    measure_reads(m, root, kek, model_cfg, seed)
    kek = measure_rotation(m, root, kek)  # the KEK in force after the rotations
    measure_model(m, root, kek, model_cfg, seed)

    load1 = os.getloadavg()
    others = max(0.0, c.machine_busy_seconds() - busy0 - (own_cpu_seconds() - own0)) / (time.perf_counter() - wall0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    c.publish(
        args,
        SECTION,
        "Site shard store: encrypted reads, cold tiers, key rotation, model load",
        f"{m.runs} timed run(s) per read and rotation measure, {m.load_runs} per model load; medians (min-max)",
        desc,
        notes=notes(m, others, load0[0], load1[0], peak_mb, c.steal_note(ticks0)),
        headers=HEADERS,
        rows=table(m),
        interpretation=interpretation(m),
        headline=headline(m),
        console_title="shard store",
    )
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
