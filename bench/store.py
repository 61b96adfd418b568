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

    .venv/bin/python bench/store.py [--quick] [--runs N] [--output FILE]
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c

from clients.tasks.large_transformer import (
    TransformerConfig,
    build_model,
    init_tensors,
    num_parameters,
    write_to_store,
)
from fedshard.crypto.at_rest import Kek
from fedshard.store import ColdFormat, LocalDirBackend, SealedShardStore, rotate_keys
from fedshard.store.catalog import CATALOG, Catalog, CatalogEntry, keys_name
from fedshard.store.model_io import load_module, plan_of, write_tensors
from fedshard.store.prefetch import PrefetchLoader
from fedshard.store.quantize import BOUND_TEXT, error_bound

SECTION = "store"
GOAL_WARM_P99 = 1e-3
GOAL_COLD_P99 = 20e-3
GOAL_ROTATE = 1e6
TILE = (256, 256)
NO_PREFETCH = "store, no prefetch (look-ahead 0)"
PREFETCH = "store, prefetch (look-ahead 2, 1 fetch thread)"
PREFETCH_2 = "store, prefetch (look-ahead 2, 2 fetch threads: `load_module`'s default)"
FILE = "safetensors load_file (dict)"
REFERENCE = "safetensors load_model (module)"
FORWARD = "forward pass alone (model already loaded), {t} torch thread(s)"
STREAM_0 = "load + forward layer by layer, no prefetch, {t} torch thread(s)"
STREAM_2 = "load + forward layer by layer, prefetch (look-ahead 2), {t} torch thread(s)"


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


def overlapping(*runs: list[float]) -> bool:
    """True if the min-max ranges of all ``runs`` share a point."""
    return max(min(r) for r in runs) <= min(max(r) for r in runs)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms" if x < 0.01 else f"{x * 1e3:.1f} ms"


def _range(xs: list[float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(min(xs))}-{fmt(max(xs))}"


# workloads ---------------------------------------------------------------------------------
def subset(cfg: TransformerConfig, blocks: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """The tensors of the first ``blocks`` transformer blocks (real initial weights)."""
    prefixes = tuple(f"blocks.{i}." for i in range(blocks))
    return [(n, t.numpy()) for n, t in init_tensors(cfg, seed) if n.startswith(prefixes)]


DURABLE = True  # fsync every write (off with --quick: a smoke test, not a measurement of writes)


def fresh_store(root: Path, name: str, kek: Kek, clock: Clock | None = None) -> SealedShardStore:
    backend = LocalDirBackend(root / name, durable=DURABLE)
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


def synthetic_store(root: Path, n: int, kek: Kek) -> LocalDirBackend:
    """A store whose catalog lists ``n`` shards (ids like a large model's tiles), each with its own data key."""
    digest = "0" * 64
    entry = CatalogEntry(1, "full", digest, digest, 262_348, 262_144, 65_536, 1.0)
    entries = {f"blocks.{i // 4096}.ff{i % 2}.weight#r{(i // 16) % 256}c{i % 16}": entry for i in range(n)}
    keys = {sid: os.urandom(32) for sid in entries}
    catalog = Catalog(store_id="bench", kek_id="", generation=1, entries=entries, keys=keys)
    raw_catalog, raw_keys = catalog.seal(kek)
    backend = LocalDirBackend(root / f"rotation-{n}", durable=DURABLE)
    backend.write(keys_name(1), raw_keys)
    backend.write(CATALOG, raw_catalog)
    return backend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--runs", type=int, default=None, help="timed runs of each measure (default 5; 1 --quick)")
    args = parser.parse_args(argv)
    quick = args.quick
    global DURABLE
    DURABLE = not quick
    runs = args.runs or (1 if quick else 5)
    load_runs = args.runs or (1 if quick else 3)
    reads = 100 if quick else 2000
    rotation_keys = 5_000 if quick else 1_000_000
    model_cfg = (
        TransformerConfig(vocab=512, d_model=256, heads=4, layers=2, ffn=1024, max_len=64)
        if quick
        else (TransformerConfig())
    )
    tier_blocks = 1 if quick else 2
    seed = 0

    import cryptography
    import safetensors
    import safetensors.torch

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
    results: dict[str, Any] = {}

    # 1. warm and cold reads, bytes and error per cold format -----------------------------------
    tensors = subset(model_cfg, tier_blocks, seed)
    plan = plan_of([(n, a.shape, "<f4") for n, a in tensors], TILE)
    tiles = [s.shard_id for s in plan.shards if s.shape == TILE]
    values = sum(a.size for _, a in tensors)
    print(f"read workload: {len(tensors)} tensors, {values:,} values, {len(plan)} shards, {len(tiles)} full tiles")
    hot = fresh_store(root, "hot", kek)
    write_tensors(hot, plan, tensors)
    hot_runs = [read_latencies(hot, tiles, reads) for _ in range(runs)]
    results["warm"] = (
        [_pct(r, 50) for r in hot_runs],
        [_pct(r, 99) for r in hot_runs],
        [max(r) for r in hot_runs],
    )
    print(
        f"warm read p50 {_ms(statistics.median(results['warm'][0]))} p99 {_ms(statistics.median(results['warm'][1]))}"
    )
    parts = read_components(hot, tiles[0], 50 if quick else 500)

    originals = dict(plan.split(dict(tensors)))
    hot_bytes = hot.stats().tiers["hot"].stored_bytes
    for fmt in ColdFormat:
        clock = Clock()
        store = fresh_store(root, f"cold-{fmt.value}", kek, clock)
        write_tensors(store, plan, tensors)
        clock.now += 91 * 86400
        t0 = time.perf_counter()
        report = store.tier(90 * 86400, fmt)
        tier_s = time.perf_counter() - t0
        cold_runs = [read_latencies(store, tiles, reads // 2) for _ in range(runs)]
        stats = store.stats()
        err = stats.formats[fmt.value]
        ratio = max(
            float((np.abs(store.get(sid, touch=False) - a) / error_bound(a, fmt).reshape(a.shape)).max())
            for sid, a in list(originals.items())[:64]
        )
        results[fmt.value] = {
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
            f"cold {fmt.value}: p99 {_ms(statistics.median(results[fmt.value]['p99']))}, "
            f"{stats.tiers['cold'].stored_bytes / stats.tiers['cold'].logical_bytes:.1%} of fp32, "
            f"rel rms {err.relative_rms:.2%}, max/bound {ratio:.2f}"
        )
        del store

    # 2. key rotation --------------------------------------------------------------------------------
    t0 = time.perf_counter()
    backend = synthetic_store(root, rotation_keys, kek)
    build_s = time.perf_counter() - t0
    keys_pair = [kek, Kek.generate()]
    rotate_keys(backend, keys_pair[0], keys_pair[1])  # warm-up (file cache), not timed
    keys_pair.reverse()
    rot_wall, rot_core = [], []
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        report = rotate_keys(backend, keys_pair[0], keys_pair[1])
        rot_wall.append(time.perf_counter() - t0)
        rot_core.append(report.seconds)
        keys_pair.reverse()
    table_mb = sum(s.size for s in (backend.stat(n) for n in backend.list("keys/")) if s) / 1e6
    catalog_mb = (backend.stat(CATALOG).size if backend.stat(CATALOG) else 0) / 1e6
    print(f"rotation of {rotation_keys:,} keys: {rotation_keys / statistics.median(rot_wall) / 1e6:.2f} M keys/s")

    # 3. the large model: write, load with / without prefetch, safetensors ------------------------------
    params = num_parameters(model_cfg)
    store = fresh_store(root, "model", keys_pair[0])
    t0 = time.perf_counter()
    record = write_to_store(store, model_cfg, seed)
    write_s = time.perf_counter() - t0
    model_bytes = record.plan.nbytes
    st_path = root / "model.safetensors"
    reference = {n: t.contiguous() for n, t in init_tensors(model_cfg, seed)}
    safetensors.torch.save_file(reference, str(st_path))
    probe = ["embed.weight", f"blocks.{model_cfg.layers - 1}.ff2.weight"]
    probe_values = {n: reference[n].clone() for n in probe}
    del reference
    gc.collect()

    def load_store(lookahead: int, workers: int) -> tuple[float, Any]:
        model = build_model(model_cfg)
        t0 = time.perf_counter()
        report = load_module(model, store, lookahead=lookahead, workers=workers)
        seconds = time.perf_counter() - t0
        sd = model.state_dict()
        assert all(torch.equal(sd[n], probe_values[n]) for n in probe)
        return seconds, report

    def load_file() -> tuple[float, Any]:
        t0 = time.perf_counter()
        sd = safetensors.torch.load_file(str(st_path))
        seconds = time.perf_counter() - t0
        assert all(torch.equal(sd[n], probe_values[n]) for n in probe)
        return seconds, None

    def load_model() -> tuple[float, Any]:
        model = build_model(model_cfg)
        t0 = time.perf_counter()
        model.to_empty(device="cpu")
        safetensors.torch.load_model(model, str(st_path))
        seconds = time.perf_counter() - t0
        assert all(torch.equal(model.state_dict()[n], probe_values[n]) for n in probe)
        return seconds, None

    tokens = torch.randint(
        0, model_cfg.vocab, (2, min(128, model_cfg.max_len)), generator=torch.Generator().manual_seed(1)
    )
    loaded = build_model(model_cfg)
    load_module(loaded, store)
    with torch.no_grad():
        expected_logits = loaded(tokens)

    torch_threads = torch.get_num_threads()

    def forward_alone(threads: int) -> tuple[float, Any]:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        with torch.no_grad():
            loaded(tokens)
        seconds = time.perf_counter() - t0
        torch.set_num_threads(torch_threads)
        return seconds, None

    def streamed(lookahead: int, threads: int) -> tuple[float, Any]:
        """Layer-streamed inference: each layer runs as soon as it is loaded (what prefetch is for)."""
        torch.set_num_threads(threads)
        model = build_model(model_cfg)
        t0 = time.perf_counter()
        model.to_empty(device="cpu")
        out = {name: t.detach().numpy() for name, t in model.state_dict(keep_vars=True).items()}
        loader = PrefetchLoader(store.get, record.plan, lookahead=lookahead, out=out)
        positions = torch.arange(tokens.shape[1])
        x = logits = None
        with torch.no_grad():
            for layer, _ in loader:
                if layer.name == "pos":  # embed and pos both loaded
                    x = model.embed(tokens) + model.pos(positions)
                elif layer.name.startswith("blocks."):
                    x = model.blocks[int(layer.name.split(".")[1])](x)
                elif layer.name == "norm":
                    logits = model.norm(x) @ model.embed.weight.T
        seconds = time.perf_counter() - t0
        torch.set_num_threads(torch_threads)
        assert logits is not None and torch.allclose(logits, expected_logits, atol=1e-4)
        return seconds, None

    variants: dict[str, Callable[[], tuple[float, Any]]] = {
        NO_PREFETCH: lambda: load_store(0, 1),
        PREFETCH: lambda: load_store(2, 1),
        PREFETCH_2: lambda: load_store(2, 2),
        FILE: load_file,
        REFERENCE: load_model,
        **{FORWARD.format(t=t): functools.partial(forward_alone, t) for t in (torch_threads, 1)},
        **{STREAM_0.format(t=t): functools.partial(streamed, 0, t) for t in (torch_threads, 1)},
        **{STREAM_2.format(t=t): functools.partial(streamed, 2, t) for t in (torch_threads, 1)},
    }
    loads: dict[str, list[float]] = {k: [] for k in variants}
    peaks: dict[str, tuple[int, int]] = {}
    for fn in variants.values() if not quick else []:  # warm-up: file cache, allocator
        fn()
        gc.collect()
    for rep in range(load_runs):
        for name in c.rotated(list(variants), rep):
            seconds, report = variants[name]()
            loads[name].append(seconds)
            if report is not None:
                peaks[name] = (report.peak_resident_layers, report.peak_resident_bytes)
            gc.collect()
    for name, xs in loads.items():
        print(f"{name}: {statistics.median(xs):.3f} s")

    # 4. the same store's rotation, then a read under the new key ----------------------------------------
    new = Kek.generate()
    model_rotation = rotate_keys(store.backend, keys_pair[0], new)
    SealedShardStore.open(store.backend, new).get(store.list()[0])

    # report -------------------------------------------------------------------------------------------
    warm50, warm99, warm_max = (statistics.median(x) for x in results["warm"])
    rate = rotation_keys / statistics.median(rot_wall)
    core_rate = rotation_keys / statistics.median(rot_core)
    rows: list[list[str]] = []
    rows.append(
        [
            "warm read, one 256x256 fp32 tile (262 KB)",
            f"p50 {_ms(warm50)}, p99 {_ms(warm99)} (p99 per run {_range(results['warm'][1], _ms)}; "
            f"max {_ms(warm_max)})",
            "p99 ≤ 1 ms",
            "yes" if warm99 <= GOAL_WARM_P99 else "no",
        ]
    )
    cold_met = True
    for fmt in ColdFormat:
        r = results[fmt.value]
        p99 = statistics.median(r["p99"])
        cold_met &= p99 <= GOAL_COLD_P99
        rows.append(
            [
                f"cold read, {fmt.value} tile",
                f"p50 {_ms(statistics.median(r['p50']))}, p99 {_ms(p99)} (p99 per run {_range(r['p99'], _ms)})",
                "p99 ≤ 20 ms",
                "yes" if p99 <= GOAL_COLD_P99 else "no",
            ]
        )
    rows.append(
        [
            f"key rotation, {rotation_keys:,} shard keys",
            f"{rate / 1e6:.2f} M keys/s ({statistics.median(rot_wall):.3f} s; "
            f"runs {_range(rot_wall, lambda x: f'{x:.3f}')} s); re-wrap + commit alone {core_rate / 1e6:.2f} M keys/s",
            "≥ 1 M keys/s",
            "yes" if rate >= GOAL_ROTATE else "no",
        ]
    )
    for fmt in ColdFormat:
        r = results[fmt.value]
        e = r["err"]
        rows.append(
            [
                f"cold tier {fmt.value}: bytes, error",
                f"{r['stored'] / 1e6:.1f} MB for {r['logical'] / 1e6:.1f} MB of fp32 "
                f"({r['stored'] / r['logical']:.1%}, saves {1 - r['stored'] / r['logical']:.1%}); "
                f"max |err| {e.max_abs:.2e}, rms {e.rms:.2e}, "
                f"relative rms {e.relative_rms:.2%}; worst err / bound {r['bound_ratio']:.4f}",
                f"within {BOUND_TEXT[fmt]}",
                "yes" if r["bound_ratio"] <= 1 else "no",
            ]
        )
    med = {name: statistics.median(xs) for name, xs in loads.items()}
    base = med[REFERENCE]
    for name, xs in loads.items():
        runs_text = f"runs {_range(xs, lambda x: f'{x:.3f}')} s"
        if "forward" in name:
            label = f"{params / 1e6:.1f} M-param model, {tokens.shape[0]}x{tokens.shape[1]} tokens: {name}"
            result = f"{med[name]:.3f} s ({runs_text})"
        else:
            peak = f"; peak {peaks[name][0]} layers resident" if name in peaks else ""
            label = f"load {params / 1e6:.1f} M-param model: {name}"
            result = (
                f"{med[name]:.3f} s ({model_bytes / med[name] / 1e6:,.0f} MB/s; {runs_text}; "
                f"{med[name] / base:.2f}× load_model){peak}"
            )
        reference = name in (FILE, REFERENCE) or name.startswith("forward pass alone")
        rows.append([label, result, "reference" if reference else "measured", "—"])
    prefetch, plain, two, files = med[PREFETCH], med[NO_PREFETCH], med[PREFETCH_2], med[FILE]
    forward, stream0, stream2 = (med[k.format(t=torch_threads)] for k in (FORWARD, STREAM_0, STREAM_2))
    forward1, stream01, stream21 = (med[k.format(t=1)] for k in (FORWARD, STREAM_0, STREAM_2))
    load1 = os.getloadavg()
    others = max(0.0, c.machine_busy_seconds() - busy0 - (own_cpu_seconds() - own0)) / (time.perf_counter() - wall0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    goals = {
        "warm read p99 ≤ 1 ms": warm99 <= GOAL_WARM_P99,
        "cold read p99 ≤ 20 ms": cold_met,
        "rotation ≥ 1 M keys/s": rate >= GOAL_ROTATE,
    }
    interpretation = (
        "Goals: "
        + "; ".join(f"{goal}: {'met' if ok else 'NOT met'}" for goal, ok in goals.items())
        + f". A warm read ({_ms(warm50)} median) is mostly two passes over the 262 KB, measured alone: AES-256-GCM "
        f"decryption {_ms(parts['AES-GCM decrypt'])} and the SHA-256 digest check every read makes "
        f"{_ms(parts['SHA-256 digest'])}, plus the file read from the page cache {_ms(parts['file read'])}; the "
        f"rest is header parsing and Python, and the p99 adds this shared VM's scheduling noise. Cold reads add "
        f"dequantisation of 65,536 values (NumPy; fp8 through a 256-entry table of torch's E4M3 values) but decrypt "
        + ", ".join(f"{results[f.value]['logical'] / results[f.value]['stored']:.1f}× ({f.value})" for f in ColdFormat)
        + f" fewer bytes. Rotation re-seals only the key table ({table_mb:.0f} MB "
        f"for {rotation_keys:,} keys, 32 bytes each) in one AES-GCM pass each way and commits it with one fsync'd "
        f"write; the catalog ({catalog_mb:.0f} MB) and the shard blobs are not touched, so the rate is bounded by "
        f"writing the table, not by per-key crypto. int8 is the most accurate cold format at fp8's size "
        f"(relative rms {results['int8']['err'].relative_rms:.2%} vs {results['fp8']['err'].relative_rms:.2%}), int4 "
        f"halves the bytes again at {results['int4']['err'].relative_rms:.1%}; every measured error is within its "
        f"documented bound. Loading the {params / 1e6:.0f} M-parameter model from the encrypted store into a module "
        f"takes {plain:.2f} s without prefetch, {prefetch:.2f} s with it ({plain / prefetch:.2f}×; with 2 fetch "
        f"threads {two:.2f} s), against {base:.2f} s for safetensors `load_model` ({plain / base:.0f}× / "
        f"{prefetch / base:.0f}× its time; `load_file`, {files:.3f} s, only maps the file: its tensors are read when "
        f"used). Every shard is read, authenticated (AES-GCM), hashed (SHA-256) and written straight into the "
        f"module's tensor ({model_bytes / plain / 1e6:,.0f} MB/s; the SHA-256 check and the decryption are most of "
        f"it, see the warm read); safetensors only copies. "
        + (
            "The three store loads differ by less than their run-to-run spread. "
            if overlapping(loads[NO_PREFETCH], loads[PREFETCH], loads[PREFETCH_2])
            else f"The fastest store load is `{min((NO_PREFETCH, PREFETCH, PREFETCH_2), key=med.__getitem__)}`. "
        )
        + "When loading is all there is to do, the layer in use costs nothing, so look-ahead alone has nothing to "
        "overlap with; a second fetch thread can overlap what releases the GIL (hashing, file reads) with the "
        f"rest. Prefetch is for loading while computing, e.g. running each layer on {tokens.shape[0]}x"
        f"{tokens.shape[1]} tokens as soon as it is loaded. With torch on both cores ({torch_threads} threads) that "
        f"takes {stream0:.2f} s without prefetch and {stream2:.2f} s with it ({stream0 / stream2:.2f}×), against "
        f"{plain + forward:.2f} s for loading, then the forward pass ({forward:.2f} s), one after the other"
        + (
            " (streaming layer by layer without prefetch costs more than that: fetching and torch's thread pool "
            "take turns every layer)"
            if stream0 > plain + forward
            else ""
        )
        + ": the forward pass already keeps both cores busy, so the fetch thread mostly competes with it, and "
        f"overlap gains little over loading first. With one torch "
        f"thread, which leaves a core to the fetch thread: {stream01:.2f} s without prefetch, {stream21:.2f} s with "
        f"it ({stream01 / stream21:.2f}×), where a load ({plain:.2f} s) and a forward pass ({forward1:.2f} s) "
        f"would take {plain + forward1:.2f} s one after the other and {max(plain, forward1):.2f} s fully overlapped."
    )
    notes = [
        f"- Read workload: the {len(tiles)} 256x256 weight tiles of the first {tier_blocks} block(s) of the "
        f"synthetic transformer ({values:,} values in {len(plan)} shards, N(0, 0.02)-initialised weights), one "
        f"local-folder store per tier (a fresh one per cold format, tiered with `tier(90d, fmt)` under an injected "
        f"clock); {reads:,} timed reads per run for hot, {reads // 2:,} per cold format, after one untimed pass; "
        f"p50/p99 per run, medians over {runs} run(s). Cold tiering of {results['int8']['moved']} shards took "
        + ", ".join(f"{results[f.value]['tier_s']:.2f} s ({f.value})" for f in ColdFormat)
        + f"; the hot store holds {hot_bytes / 1e6:.1f} MB.",
        f"- Rotation: a catalog of {rotation_keys:,} shards ({catalog_mb:.0f} MB) and its key table "
        f"({table_mb:.0f} MB) built directly ({build_s:.1f} s, not timed), no blobs (rotation reads none); "
        f"{runs} timed rotations after one untimed, alternating between two KEKs; wall time of `rotate_keys` "
        f"(journal write, stale-table cleanup, re-wrap, fsync'd commit of the key table, journal delete). The "
        f"model store's own rotation ({model_rotation.keys:,} keys) took {model_rotation.seconds * 1e3:.1f} ms "
        f"(re-wrap + commit), and a shard read back under the new key.",
        f"- Model: `TransformerConfig{'(quick)' if quick else '()'}`: {params:,} parameters, "
        f"{model_bytes / 1e6:.1f} MB float32, {len(record.plan):,} shards (tile 256x256); written into the "
        f"encrypted store by `write_to_store` in {write_s:.2f} s ({model_bytes / write_s / 1e6:,.0f} MB/s, one "
        f"fsync per blob{'; --quick: no fsync' if quick else ''}). Loads go into `build_model()` (meta device; "
        f"`to_empty` + copies, timed), interleaved "
        f"with the order rotated per run, one untimed warm-up each, {load_runs} timed run(s); all files in the page "
        f"cache. Every load is checked against the reference weights.",
        f"- Other processes kept {others:.2f} of the {os.cpu_count()} cores busy on average during the run "
        f"(/proc/stat busy time minus this benchmark's CPU time); load average before / after: {load0[0]:.2f} / "
        f"{load1[0]:.2f}; peak RSS {peak_mb:,.0f} MB.",
        c.steal_note(ticks0),
    ]
    c.print_table("shard store", ["measure", "result (median)", "goal", "met?"], rows)
    print("\n" + interpretation)
    c.publish(
        args,
        SECTION,
        "Site shard store: encrypted reads, cold tiers, key rotation, model load",
        f"{runs} timed run(s) per read and rotation measure, {load_runs} per model load; medians (min-max)",
        desc,
        notes=notes,
        headers=["measure", "result (median)", "goal", "met?"],
        rows=[[cell.replace("|", "\\|") for cell in row] for row in rows],  # |x| must not end a cell
        interpretation=interpretation,
    )
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
