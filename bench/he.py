"""Homomorphic encryption of gradient shards: fedshard's CKKS scheme vs the NVFlare-style default.

Both schemes run in the same process, on the same synthetic updates (``S`` = 4 simulated
sites, each with its own float32 update of ~1 M and ~10 M values, N(0, 0.01) like a
DP-noised update, cut into 1024x1024 shards by ``ShardPlan``; one shard per layer here):

* **fedshard** (``fedshard/crypto/he.py``): N = 4096, coefficients [60, 49], scale 2^20,
  two quantised values per slot, symmetric (secret-key) encryption; a site encrypts with
  ``HeCodec.encrypt_many``: it packs in the calling process and, from 1 M values, hands
  ciphertext-sized pieces (4096 values) to a spawn process pool of one worker per core that
  is started once per site process and kept. The pool is warm in every timed round (an
  untimed call starts it); its start-up is measured by itself, as the first call of a fresh
  context minus a warm call on the same shards. The zone folds with ``EncryptedSum.add`` and
  serialises the sum, a site decrypts with ``HeCodec.decrypt_mean``.
* **NVFlare-style** (TenSEAL directly, as NVIDIA FLARE's HE filters use it): N = 8192,
  coefficients [60, 40, 40], scale 2^40, public-key encryption (TenSEAL's default), one
  ``ts.ckks_vector`` per shard (TenSEAL splits long vectors into 4096-slot ciphertexts),
  ``.serialize()``; the zone folds with ``ts.ckks_vector_from(public_context, bytes)`` and
  ``+=``; a site decrypts with the secret context. Weighted FedAvg as NVFlare does it: each site multiplies its values
  by its weight before encrypting, the decrypted sum is divided by the total weight in clear.
* **plaintext**: a site serialises float32 (``tobytes``), the zone folds with
  ``fedshard.aggregation.ShardAccumulator`` (float64 weighted sums) and serialises the
  float32 mean, a site reads it back.

A round = every site encrypts (sites one after another on this machine) and the zone
folds each site's shards as they come → the zone serialises the aggregate → one site
decrypts the mean. Weights are ``w_i = n_i / max n`` for n = 400, 300, 200, 100 samples.
Schemes are interleaved within every run, their order rotated per run; medians. Every
run also times fedshard's encryption of site 0's update alone in two more ways: shard by
shard with ``HeCodec.encrypt`` in this one process (one core), and ``encrypt_many`` on
fedshard's default 256x256 tiles. ``--quick`` (one ~130 k-value round per scheme, one pool
start-up, no extras) is the smoke test.

    .venv/bin/python bench/he.py [--quick] [--runs N] [--values N [N ...]] [--output FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tenseal as ts

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.aggregation import ShardAccumulator
from fedshard.crypto import he
from fedshard.crypto.he import (
    COEFF_BITS,
    FIELD_BITS,
    POLY_DEGREE,
    SCALE_BITS,
    SLOTS,
    VALUES_PER_SLOT,
    EncryptedSum,
    HeCodec,
    he_init,
    load_context,
)

SECTION = "he"
TILE = (1024, 1024)
DEFAULT_TILE = (256, 256)  # fedshard's default (sharding.tile)
SAMPLES = (400, 300, 200, 100)  # per site; weights n_i / max n
VALUE_STD = 0.01
VALUE_RANGE = 1.0  # fedshard's defaults (HeConfig)
MAX_SITES = 16
NV_POLY = 8192
NV_COEFF = [60, 40, 40]
NV_SCALE_BITS = 40
POOL_VALUES = he._PARALLEL_VALUES  # encrypt_many uses its process pool from this many values
PIECE = SLOTS * VALUES_PER_SLOT  # values per ciphertext: encrypt_many's unit of work
STARTUP_REPS = 3  # pool start-ups measured (1 with --quick)
GOAL_BYTES = 5.0  # × float32
GOAL_ENCRYPT = 4e6  # values/s on 2 cores
GOAL_ROUND = 1.3  # × plaintext round
SCHEMES = ["fedshard", "nvflare", "plaintext"]
LABELS = {"fedshard": "fedshard", "nvflare": "NVFlare-style", "plaintext": "plaintext"}

_LIBC = ctypes.CDLL(None)


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null inside the block (TenSEAL's C++ warnings for
    vectors longer than one ciphertext go to std::cout), then restore it. C stdio buffers are
    flushed on both sides, so nothing written inside leaks out later; stderr and exceptions
    are untouched."""
    sys.stdout.flush()
    _LIBC.fflush(None)
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        _LIBC.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def pool_workers_cpu() -> float:
    """CPU seconds used so far by the live workers of ``encrypt_many``'s process pools (/proc/PID/stat
    utime + stime). They run for the life of the process, so ``os.times`` never counts them."""
    total = 0
    for pool in list(he._POOLS.values()):
        for pid in list(getattr(pool, "_processes", None) or {}):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(stat[11]) + int(stat[12])  # fields 14 and 15 of proc(5)
            except (OSError, ValueError, IndexError):
                continue
    return total / os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> float:
    """CPU time of this process, of its waited-for children (pools shut down) and of the live
    workers of encrypt_many's pools."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + pool_workers_cpu()


class OtherLoad:
    """CPU time that other processes took while this benchmark ran: machine busy time minus ours."""

    def __init__(self) -> None:
        self.t0, self.busy0, self.own0 = time.perf_counter(), c.machine_busy_seconds(), cpu_seconds()

    def cores(self) -> float:
        """Cores other processes kept busy on average since this object was made."""
        wall = time.perf_counter() - self.t0
        others = c.machine_busy_seconds() - self.busy0 - (cpu_seconds() - self.own0)
        return max(0.0, others) / wall if wall > 0 else 0.0


# schemes -----------------------------------------------------------------------------------------
class FedshardScheme:
    def __init__(self, keys: Path) -> None:
        secret_path, public_path = he_init(keys)
        self.secret_path = secret_path
        self.codec = HeCodec(load_context(secret_path, secret=True), VALUE_RANGE, MAX_SITES)
        self.public = load_context(public_path, secret=False)
        self.clipped = 0

    def encrypt(self, shards: dict[str, np.ndarray], weight: float) -> dict[str, bytes]:
        out, clipped = self.codec.encrypt_many(shards, weight)
        self.clipped += clipped
        return out

    def encrypt_one_process(self, shards: dict[str, np.ndarray], weight: float) -> None:
        for values in shards.values():
            self.codec.encrypt(values, weight)

    def new_zone(self, shapes: dict[str, tuple[int, ...]]) -> Any:
        return _FedshardZone(self.public)

    def decrypt(self, agg: dict[str, bytes], shapes: dict[str, tuple[int, ...]], total: float) -> dict[str, np.ndarray]:
        return {sid: self.codec.decrypt_mean(b, math.prod(shapes[sid])).reshape(shapes[sid]) for sid, b in agg.items()}


class _FedshardZone:
    def __init__(self, public: Any) -> None:
        self.sums = EncryptedSum(public)

    def add(self, sid: str, data: bytes, weight: float) -> None:
        self.sums.add(sid, data)  # the weight travels inside the ciphertext

    def serialize(self, sid: str) -> bytes:
        return self.sums.serialize(sid)


class NvflareScheme:
    def __init__(self) -> None:
        ctx = ts.context(ts.SCHEME_TYPE.CKKS, NV_POLY, coeff_mod_bit_sizes=NV_COEFF)
        ctx.global_scale = 2**NV_SCALE_BITS
        secret = ctx.serialize(save_secret_key=True)
        public = ctx.serialize(save_secret_key=False)
        self.secret = ts.context_from(secret)
        self.public = ts.context_from(public)
        assert not self.public.has_secret_key()

    def encrypt(self, shards: dict[str, np.ndarray], weight: float) -> dict[str, bytes]:
        with quiet_stdout():  # "WARNING: The input does not fit in a single ciphertext ..."
            return {
                sid: ts.ckks_vector(self.secret, values.reshape(-1).astype(np.float64) * weight).serialize()
                for sid, values in shards.items()
            }

    def new_zone(self, shapes: dict[str, tuple[int, ...]]) -> Any:
        return _NvflareZone(self.public)

    def decrypt(self, agg: dict[str, bytes], shapes: dict[str, tuple[int, ...]], total: float) -> dict[str, np.ndarray]:
        return {
            sid: (np.asarray(ts.ckks_vector_from(self.secret, b).decrypt()) / total).reshape(shapes[sid])
            for sid, b in agg.items()
        }


class _NvflareZone:
    def __init__(self, public: Any) -> None:
        self.public = public
        self.sums: dict[str, Any] = {}

    def add(self, sid: str, data: bytes, weight: float) -> None:
        vector = ts.ckks_vector_from(self.public, data)
        current = self.sums.get(sid)
        if current is None:
            self.sums[sid] = vector
        else:
            current += vector

    def serialize(self, sid: str) -> bytes:
        blob: bytes = self.sums[sid].serialize()
        return blob


class PlainScheme:
    def encrypt(self, shards: dict[str, np.ndarray], weight: float) -> dict[str, bytes]:
        return {sid: values.tobytes() for sid, values in shards.items()}

    def new_zone(self, shapes: dict[str, tuple[int, ...]]) -> Any:
        return _PlainZone(shapes)

    def decrypt(self, agg: dict[str, bytes], shapes: dict[str, tuple[int, ...]], total: float) -> dict[str, np.ndarray]:
        return {sid: np.frombuffer(b, dtype=np.float32).reshape(shapes[sid]) for sid, b in agg.items()}


class _PlainZone:
    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = shapes
        self.acc = ShardAccumulator()
        self.means: dict[str, np.ndarray] | None = None

    def add(self, sid: str, data: bytes, weight: float) -> None:
        self.acc.add(sid, np.frombuffer(data, dtype=np.float32).reshape(self.shapes[sid]), weight)

    def serialize(self, sid: str) -> bytes:
        if self.means is None:
            self.means = self.acc.finalize()
        return self.means[sid].tobytes()


def pool_shards(seed: int = 7) -> dict[str, np.ndarray]:
    """One 1024x1024 float32 shard (N(0, VALUE_STD)): just enough values for encrypt_many's pool."""
    rng = np.random.default_rng(seed)
    shard = (rng.standard_normal((1024, 1024), dtype=np.float32) * np.float32(VALUE_STD)).astype(np.float32)
    assert shard.size >= POOL_VALUES
    return {"pool/weight": shard}


def pool_startup(secret_path: Path, shards: dict[str, np.ndarray]) -> tuple[float, float]:
    """Seconds of ``encrypt_many``'s first call in a site process (the spawn pool starts: workers
    import numpy and TenSEAL and load the secret context) and of a warm call, on the same shards.

    A freshly loaded context is a new pool key, so the first call here starts a new pool, exactly
    as a site's first round does; it is shut down afterwards. Warm = the faster of two calls."""
    codec = HeCodec(load_context(secret_path, secret=True), VALUE_RANGE, MAX_SITES)
    t0 = time.perf_counter()
    codec.encrypt_many(shards, 1.0)
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(2):
        t0 = time.perf_counter()
        codec.encrypt_many(shards, 1.0)
        warm.append(time.perf_counter() - t0)
    pool = he._POOLS.pop((id(codec.context), os.cpu_count() or 1), None)
    assert pool is not None, "encrypt_many did not start a process pool"
    pool.shutdown(wait=True)
    return cold, min(warm)


# one round ---------------------------------------------------------------------------------------
@dataclass
class Round:
    enc: list[float] = field(default_factory=list)  # wall s per site
    enc_cpu: list[float] = field(default_factory=list)
    fold: list[float] = field(default_factory=list)  # zone wall s per site
    up_bytes: int = 0  # all sites
    ser: float = 0.0
    down_bytes: int = 0
    dec: float = 0.0
    error: float = 0.0

    @property
    def wall(self) -> float:
        return sum(self.enc) + sum(self.fold) + self.ser + self.dec

    @property
    def critical(self) -> float:
        """Sites encrypting in parallel on their own machines: one site's encryption, the zone's
        folds of every site, its serialisation and one site's decryption."""
        return statistics.median(self.enc) + sum(self.fold) + self.ser + self.dec


@dataclass
class Workload:
    label: str
    sites: list[dict[str, np.ndarray]]
    weights: list[float]
    shapes: dict[str, tuple[int, ...]]
    reference: dict[str, np.ndarray]  # float64 weighted mean
    values: int
    default_tiles: dict[str, np.ndarray]  # site 0's update cut at fedshard's default tile


def make_workload(target: int, width: int) -> Workload:
    shards_per_site = []
    plan = None
    default_tiles: dict[str, np.ndarray] = {}
    for i in range(len(SAMPLES)):
        update = c.synthetic_update(target, width=width, seed=1000 + i)
        for a in update.values():
            a *= np.float32(VALUE_STD)
        plan = plan or c.make_plan(update, TILE)
        shards_per_site.append(plan.split(update))
        if i == 0:
            default_tiles = c.make_plan(update, DEFAULT_TILE).split(update)
        del update
    weights = [n / max(SAMPLES) for n in SAMPLES]
    total = sum(weights)
    shapes = {sid: tuple(a.shape) for sid, a in shards_per_site[0].items()}
    reference = {}
    for sid in shapes:
        acc = np.zeros(shapes[sid], dtype=np.float64)
        for shards, w in zip(shards_per_site, weights, strict=True):
            acc += shards[sid].astype(np.float64) * w
        reference[sid] = acc / total
    n = c.num_values(shards_per_site[0])
    label = f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.0f} k"
    return Workload(label, shards_per_site, weights, shapes, reference, n, default_tiles)


def run_round(scheme: Any, work: Workload) -> Round:
    r = Round()
    zone = scheme.new_zone(work.shapes)
    for shards, w in zip(work.sites, work.weights, strict=True):
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        cts = scheme.encrypt(shards, w)
        r.enc.append(time.perf_counter() - t0)
        r.enc_cpu.append(cpu_seconds() - cpu0)
        r.up_bytes += sum(len(b) for b in cts.values())
        t0 = time.perf_counter()
        for sid, data in cts.items():
            zone.add(sid, data, w)
        r.fold.append(time.perf_counter() - t0)
        del cts  # one site's ciphertexts at a time: memory stays O(model)
    t0 = time.perf_counter()
    agg = {sid: zone.serialize(sid) for sid in work.shapes}
    r.ser = time.perf_counter() - t0
    r.down_bytes = sum(len(b) for b in agg.values())
    del zone
    t0 = time.perf_counter()
    mean = scheme.decrypt(agg, work.shapes, sum(work.weights))
    r.dec = time.perf_counter() - t0
    del agg
    r.error = max(float(np.max(np.abs(mean[sid] - work.reference[sid]))) for sid in work.shapes)
    return r


# output ------------------------------------------------------------------------------------------
def _mvs(values: float, seconds: float) -> str:
    return f"{values / seconds / 1e6:,.2f}"


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _range(xs: list[float], digits: int = 2) -> str:
    return f"{_med(xs):,.{digits}f} ({min(xs):,.{digits}f}-{max(xs):,.{digits}f})"


def _s(x: float) -> str:
    return f"{x:,.2f}" if x >= 0.1 else f"{x:,.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="timed rounds per scheme and size (default 5 at 1 M, 3 at 10 M values; 1 with --quick)",
    )
    parser.add_argument(
        "--values",
        type=int,
        nargs="+",
        default=None,
        help="values per site update (default 1 M and 10 M; ~100 k with --quick); rounded up to whole layers",
    )
    args = parser.parse_args(argv)
    if args.quick:
        targets = args.values or [100_000]
        sizes = [(t, 256, args.runs or 1) for t in targets]
    else:
        targets = args.values or [1_000_000, 10_000_000]
        sizes = [(t, 1024, args.runs or (5 if t < 5_000_000 else 3)) for t in targets]

    desc = c.machine_description()
    desc["numpy"] += f", tenseal {ts.__version__}"
    load0 = os.getloadavg()
    whole_load = OtherLoad()
    run_loads: list[float] = []
    n_sites = len(SAMPLES)
    tmp = tempfile.TemporaryDirectory(prefix="fedshard-bench-he-")
    schemes: dict[str, Any] = {
        "fedshard": FedshardScheme(Path(tmp.name)),
        "nvflare": NvflareScheme(),
        "plaintext": PlainScheme(),
    }
    fed: FedshardScheme = schemes["fedshard"]
    step = fed.codec.step
    headroom = max(1, math.ceil(math.log2(max(2, MAX_SITES))))
    assert fed.codec.levels == 2 ** (FIELD_BITS - 1 - headroom) - 1  # the docstring's 2^(18 - headroom) - 1

    results: dict[str, dict[str, list[Round]]] = {}
    extra: dict[str, dict[str, list[tuple[float, float]]]] = {}  # label -> task -> (wall, cpu)
    works: dict[str, tuple[int, int, float]] = {}  # label -> values, shards, total weight
    default_shards: dict[str, int] = {}
    largest: dict[str, int] = {}
    pieces: dict[str, int] = {}  # ciphertexts per site update
    # encrypt_many's process pool: start-up by itself (fresh contexts), then the benchmark's own pool
    # is started once, untimed, as a site process would on its first round.
    startup_shards = pool_shards()
    startup = [pool_startup(fed.secret_path, startup_shards) for _ in range(1 if args.quick else STARTUP_REPS)]
    print(
        f"pool start-up: first encrypt_many of {POOL_VALUES:,} values "
        + ", ".join(f"{cold:.2f} s vs warm {warm:.2f} s" for cold, warm in startup),
        flush=True,
    )
    pool_warmed = False
    for i, (target, width, runs) in enumerate(sizes):
        work = make_workload(target, width)
        works[work.label] = (work.values, len(work.shapes), sum(work.weights))
        default_shards[work.label] = len(work.default_tiles)
        largest[work.label] = max(math.prod(shape) for shape in work.shapes.values())
        pieces[work.label] = sum(
            math.ceil(fed.codec.slots_for(math.prod(shape)) / SLOTS) for shape in work.shapes.values()
        )
        print(
            f"update: {work.values:,} float32 values per site in {len(work.shapes)} shards, {n_sites} sites; "
            f"{runs} timed round(s) per scheme",
            flush=True,
        )
        if work.values >= POOL_VALUES and not pool_warmed:  # start this codec's pool, untimed
            fed.codec.encrypt_many(startup_shards, 1.0)
            pool_warmed = True
        if i == 0 and not args.quick:  # one untimed round per scheme (imports, first allocations)
            for name in SCHEMES:
                run_round(schemes[name], work)
        res: dict[str, list[Round]] = {name: [] for name in SCHEMES}
        extra_tasks: dict[str, Callable[[], Any]] = {
            "one process": functools.partial(fed.encrypt_one_process, work.sites[0], work.weights[0]),
            "default tiles": functools.partial(fed.encrypt, work.default_tiles, work.weights[0]),
        }
        extra[work.label] = {k: [] for k in extra_tasks}
        for rep in range(runs):
            run_load = OtherLoad()
            for name in c.rotated(SCHEMES, rep):
                res[name].append(run_round(schemes[name], work))
            if not args.quick:  # fedshard's encryption alone, two more ways (site 0's update)
                for task in c.rotated(list(extra_tasks), rep):
                    cpu0, t0 = cpu_seconds(), time.perf_counter()
                    extra_tasks[task]()
                    extra[work.label][task].append((time.perf_counter() - t0, cpu_seconds() - cpu0))
            run_loads.append(run_load.cores())
            print(
                f"  {work.label} run {rep + 1}/{runs}: "
                + ", ".join(f"{name} {res[name][-1].wall:.2f} s" for name in SCHEMES)
                + f"; other processes kept {run_loads[-1]:.2f} cores busy",
                flush=True,
            )
        results[work.label] = res
        del work
    load1 = os.getloadavg()
    others = whole_load.cores()
    tmp.cleanup()

    headers = [
        "update / site",
        "scheme",
        "upload bytes / float32 byte",
        "aggregate bytes / float32 byte",
        "encrypt M values/s per site (cores used)",
        "zone fold M values/s",
        "zone serialise s",
        "decrypt M values/s",
        "max abs error of the mean",
        f"round s, {n_sites} sites one after another (min-max)",
        "round / plaintext",
        "critical path s (one site's encryption)",
        "critical path / plaintext",
    ]
    rows: list[list[str]] = []
    summary: dict[tuple[str, str], dict[str, float]] = {}
    ex: dict[tuple[str, str], tuple[float, float]] = {}  # (label, task) -> values/s, cores
    for label, res in results.items():
        n, _, _ = works[label]
        plain_round = _med([r.wall for r in res["plaintext"]])
        plain_crit = _med([r.critical for r in res["plaintext"]])
        for name in SCHEMES:
            rs = res[name]
            enc_site = _med([_med(r.enc) for r in rs])
            cores = _med([sum(r.enc_cpu) / sum(r.enc) for r in rs])
            fold = _med([sum(r.fold) for r in rs])
            ser = _med([r.ser for r in rs])
            dec = _med([r.dec for r in rs])
            wall = [r.wall for r in rs]
            crit = _med([r.critical for r in rs])
            up = rs[0].up_bytes / (4 * n * n_sites)
            down = rs[0].down_bytes / (4 * n)
            err = max(r.error for r in rs)
            summary[(label, name)] = {
                "enc_rate": n / enc_site,
                "enc_site": enc_site,
                "fold_rate": n * n_sites / fold,
                "dec_rate": n / dec,
                "up": up,
                "down": down,
                "err": err,
                "round": _med(wall),
                "crit": crit,
                "round_ratio": _med(wall) / plain_round,
                "crit_ratio": crit / plain_crit,
                "plain_round": plain_round,
                "plain_crit": plain_crit,
                "cores": cores,
                "dec": dec,
                "fold": fold,
                "ser": ser,
            }
            rows.append(
                [
                    label,
                    LABELS[name],
                    f"{up:.2f}x",
                    f"{down:.2f}x",
                    f"{_mvs(n, enc_site)} " + ("(tobytes)" if name == "plaintext" else f"({cores:.2f})"),
                    _mvs(n * n_sites, fold),
                    _s(ser),
                    _mvs(n, dec),
                    f"{err:.2e}",
                    _range(wall),
                    f"{_med(wall) / plain_round:,.1f}x",
                    _s(crit),
                    f"{crit / plain_crit:,.1f}x",
                ]
            )
        for task in extra[label]:
            xs = extra[label][task]
            if not xs:
                continue
            t = _med([wall for wall, _ in xs])
            cores = _med([cpu / wall for wall, cpu in xs])
            ex[(label, task)] = (n / t, cores)
            what = (
                "fedshard, encryption alone: `HeCodec.encrypt` shard by shard, one process"
                if task == "one process"
                else f"fedshard, encryption alone: `encrypt_many` on {DEFAULT_TILE[0]}x{DEFAULT_TILE[1]} tiles "
                f"({default_shards[label]} shards)"
            )
            rows.append([label, what, "–", "–", f"{_mvs(n, t)} ({cores:.2f})", *["–"] * 8])
    c.print_table(f"HE of gradient shards, {n_sites} sites, medians", headers, rows)

    # interpretation ------------------------------------------------------------------------------
    labels = list(results)
    big = labels[-1]
    f_big, nv_big = summary[(big, "fedshard")], summary[(big, "nvflare")]
    workers = os.cpu_count() or 1
    startup_s = _med([cold - warm for cold, warm in startup])
    one_big = ex[(big, "one process")][0] if (big, "one process") in ex else 0.0
    total_w = works[big][2]
    mean_bound = n_sites * step / 2 / total_w
    bytes_met = all(summary[(lb, "fedshard")]["up"] <= GOAL_BYTES for lb in labels)
    enc_rates = [summary[(lb, "fedshard")]["enc_rate"] for lb in labels]
    enc_met = all(x >= GOAL_ENCRYPT for x in enc_rates)
    round_met = all(summary[(lb, "fedshard")]["round_ratio"] <= GOAL_ROUND for lb in labels)
    err_ok = all(summary[(lb, "fedshard")]["err"] <= mean_bound * (1 + 1e-9) for lb in labels)

    def per_size(key: str, fmt: Callable[[float], str], scheme: str = "fedshard") -> str:
        return " / ".join(f"{fmt(summary[(lb, scheme)][key])} ({lb})" for lb in labels)

    def break_even(s: dict[str, float]) -> float:
        """Seconds of other work per round (training, transfer) at which HE costs ≤ GOAL_ROUND×."""
        return max(0.0, (s["crit"] - GOAL_ROUND * s["plain_crit"]) / (GOAL_ROUND - 1))

    def ex_size(task: str) -> str:
        return " / ".join(
            f"{ex[(lb, task)][0] / 1e6:.2f} M/s ({ex[(lb, task)][1]:.2f} cores; {lb})"
            for lb in labels
            if (lb, task) in ex
        )

    sentences = [
        f"Bytes (goal ≤ {GOAL_BYTES:g}× float32): {'met' if bytes_met else 'not met'}. fedshard's ciphertexts are "
        f"{per_size('up', lambda x: f'{x:.2f}×')} the bytes of the float32 update on the way up, "
        f"against {per_size('up', lambda x: f'{x:.1f}×', 'nvflare')} for the NVFlare-style default: two quantised "
        f"values per slot in an N = {POLY_DEGREE} ring whose ciphertexts keep one {COEFF_BITS[0]}-bit prime "
        f"(the {COEFF_BITS[1]}-bit one is the special prime, dropped after encryption), against one value per slot "
        f"and two primes ({NV_COEFF[0]} + {NV_COEFF[1]} bits) of N = {NV_POLY}. The encrypted aggregate a site "
        f"downloads has the same size per value ({f_big['down']:.2f}× / {nv_big['down']:.1f}×; a float32 "
        "aggregate is 1×).",
        f"Encryption (goal ≥ {GOAL_ENCRYPT / 1e6:g} M values/s on this 2-core machine; pool warm): "
        f"{'met' if enc_met else 'not met'}. With `encrypt_many` on the {TILE[0]}x{TILE[1]} shards fedshard "
        f"encrypts {per_size('enc_rate', lambda x: f'{x / 1e6:.2f} M/s')} per site "
        f"({per_size('cores', lambda x: f'{x:.2f} cores busy')}). "
        + " ".join(
            f"At {lb} (below {POOL_VALUES:,} values `encrypt_many` uses no pool) it encrypts in this process, "
            "on one core."
            if works[lb][0] < POOL_VALUES
            else f"At {lb} it packs the {works[lb][1]} shard{'s' if works[lb][1] > 1 else ''} here and hands their "
            f"{pieces[lb]:,} ciphertext-sized pieces ({PIECE:,} values each) to the pool's {workers} workers, so even "
            f"a single shard (the largest has {largest[lb]:,} values) is spread over all of them."
            for lb in labels
        )
        + f" The pool is started once per site process, on its first call with ≥ {POOL_VALUES:,} values, and kept "
        f"for the life of the process"
        + (
            ": every timed round here that used it ran with it warm."
            if any(works[lb][0] >= POOL_VALUES for lb in labels)
            else " (no size here used it)."
        )
        + f" Its start-up ({workers} spawned workers import numpy, TenSEAL and the main module, here this "
        "script, and load the secret context) is a one-off of "
        f"{startup_s:.2f} s"
        + (
            f" (median of {len(startup)} start-ups, {min(cold - warm for cold, warm in startup):.2f}-"
            f"{max(cold - warm for cold, warm in startup):.2f} s)"
            if len(startup) > 1
            else ""
        )
        + f": a fresh context's first `encrypt_many` of {POOL_VALUES:,} values takes "
        f"{_med([cold for cold, _ in startup]):.2f} s against {_med([warm for _, warm in startup]):.2f} s warm "
        f"({POOL_VALUES / _med([warm for _, warm in startup]) / 1e6:.2f} M/s). A site that ran one process per "
        "round would pay it every round."
        + (
            f" For comparison, symmetric encryption with the same codec shard by shard in this one process: "
            f"{ex_size('one process')}; `encrypt_many` on fedshard's default {DEFAULT_TILE[0]}x{DEFAULT_TILE[1]} "
            f"tiles: {ex_size('default tiles')}. The pool turns {one_big / 1e6:.2f} M/s on one core into "
            f"{f_big['enc_rate'] / 1e6:.2f} M/s on {f_big['cores']:.2f} busy cores at {big} "
            f"({f_big['enc_rate'] / one_big:.2f}× with {workers} workers; packing runs in the calling process "
            "and the ciphertexts come back pickled)."
            + (
                ""
                if enc_met
                else f" {GOAL_ENCRYPT / 1e6:g} M/s on {workers} cores needs "
                f"{GOAL_ENCRYPT / workers / 1e6:.1f} M/s per core with all of them busy."
            )
            if ex
            else ""
        )
        + f" The NVFlare-style path (public-key encryption, N = {NV_POLY}) does "
        f"{per_size('enc_rate', lambda x: f'{x / 1e6:.2f} M/s', 'nvflare')} "
        f"({nv_big['cores']:.2f} cores busy: "
        + (
            "TenSEAL's own thread pool encrypts the ciphertexts of a long vector in parallel"
            if nv_big["cores"] > 1.3
            else "TenSEAL encrypts the ciphertexts of a vector one after another, in one thread"
        )
        + "), so fedshard's `encrypt_many` is "
        + " / ".join(
            f"{summary[(lb, 'fedshard')]['enc_rate'] / summary[(lb, 'nvflare')]['enc_rate']:.1f}× ({lb})"
            for lb in labels
        )
        + " faster.",
        f"The zone folds (deserialise + add) {per_size('fold_rate', lambda x: f'{x / 1e6:.1f} M values/s')} with "
        f"fedshard against {per_size('fold_rate', lambda x: f'{x / 1e6:.1f} M/s', 'nvflare')} NVFlare-style and "
        f"{per_size('fold_rate', lambda x: f'{x / 1e6:.0f} M/s', 'plaintext')} in plaintext (float64 "
        f"`ShardAccumulator`); a site decrypts {per_size('dec_rate', lambda x: f'{x / 1e6:.2f} M values/s')} "
        f"(NVFlare-style {per_size('dec_rate', lambda x: f'{x / 1e6:.2f} M/s', 'nvflare')}).",
        f"Error: fedshard's largest error of the decrypted weighted mean against the float64 mean is "
        f"{per_size('err', lambda x: f'{x:.2e}')}; the bound is step/2 per value and site on w·x, with "
        f"step = value_range / (2^({FIELD_BITS - 1} - headroom) - 1) = "
        f"{VALUE_RANGE:g}/(2^{FIELD_BITS - 1 - headroom} - 1) = {VALUE_RANGE:g}/{fed.codec.levels:,} = "
        f"{step:.3e} (value_range {VALUE_RANGE:g}, max_sites {MAX_SITES}, headroom ceil(log2 {MAX_SITES}) = "
        f"{headroom} bits), i.e. ≤ S·step/(2·Σw) = {n_sites}·{step:.3e}/(2·{total_w:g}) = {mean_bound:.2e} on the mean "
        f"of these {n_sites} sites — {'respected' if err_ok else 'EXCEEDED'}; the rounding errors are independent, so "
        f"over millions of values the maximum comes close to the bound. That is "
        f"{f_big['err'] / VALUE_STD:.1%} of the updates' standard deviation ({VALUE_STD:g}), well below the noise "
        f"a DP mechanism adds; NVFlare-style CKKS at scale 2^{NV_SCALE_BITS} errs by "
        f"{per_size('err', lambda x: f'{x:.1e}', 'nvflare')}, float32 plaintext by "
        f"{per_size('err', lambda x: f'{x:.1e}', 'plaintext')}. No value was clipped "
        f"({fed.clipped} clipped in all runs).",
        f"Round time (goal ≤ {GOAL_ROUND:g}× plaintext): {'met' if round_met else 'not met'} for a round that "
        f"is only crypto. With the {n_sites} sites encrypting one after another on this machine a fedshard round takes "
        f"{per_size('round', lambda x: f'{x:.2f} s')}, {per_size('round_ratio', lambda x: f'{x:.0f}×')} the "
        f"plaintext round ({per_size('plain_round', lambda x: f'{x:.3f} s')}: serialising float32 and a float64 "
        f"accumulate cost almost nothing), against {per_size('round', lambda x: f'{x:.1f} s', 'nvflare')} "
        f"NVFlare-style ({per_size('round_ratio', lambda x: f'{x:.0f}×', 'nvflare')}); fedshard's round is "
        f"{nv_big['round'] / f_big['round']:.1f}× shorter at {big}. With sites encrypting in parallel on their "
        f"own machines the critical path is one site's encryption + the zone's folds + serialisation + one "
        f"decryption: {per_size('crit', lambda x: f'{x:.2f} s')} for fedshard "
        f"(NVFlare-style {per_size('crit', lambda x: f'{x:.1f} s', 'nvflare')}). Local training and the "
        f"transfer are out of scope here (not measured); the HE round stays within {GOAL_ROUND:g}× of the "
        f"plaintext one once they take at least (HE critical path − {GOAL_ROUND:g} × plaintext) / "
        f"{GOAL_ROUND - 1:.1f} per round: "
        + " / ".join(f"{break_even(summary[(lb, 'fedshard')]):.1f} s ({lb})" for lb in labels)
        + " for fedshard, "
        + " / ".join(f"{break_even(summary[(lb, 'nvflare')]):.0f} s ({lb})" for lb in labels)
        + " NVFlare-style. The transfer itself grows with the bytes: "
        f"{f_big['up']:.1f}× the float32 bytes up and down with fedshard, {nv_big['up']:.1f}× NVFlare-style.",
    ]
    interp = " ".join(sentences)
    print("\n" + interp)

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    runs_text = (
        "1 round per scheme (--quick)"
        if args.quick
        else ", ".join(f"{r} timed rounds per scheme at {lb}" for (_, _, r), lb in zip(sizes, labels, strict=True))
        + "; one untimed round per scheme first; schemes interleaved, order rotated per run; medians (round: min-max)"
    )
    c.publish(
        args,
        SECTION,
        "Homomorphic encryption of gradient shards: fedshard vs NVFlare-style CKKS",
        runs_text,
        desc,
        notes=[
            f"- Updates: {n_sites} sites, each with its own float32 update of "
            + " / ".join(f"{works[lb][0]:,} values in {works[lb][1]} shards" for lb in labels)
            + f" (synthetic layers of {sizes[0][1]}x{sizes[0][1]} weights + biases, values N(0, {VALUE_STD:g}) like "
            f"DP-noised updates; `ShardPlan` tile {TILE[0]}x{TILE[1]}: one shard per layer); weights "
            f"w_i = n_i / max n = {', '.join(f'{w:g}' for w in [n / max(SAMPLES) for n in SAMPLES])}.",
            f"- fedshard: `HeCodec(value_range={VALUE_RANGE:g}, max_sites={MAX_SITES})` (the defaults), N = "
            f"{POLY_DEGREE}, coefficients {list(COEFF_BITS)}, scale 2^{SCALE_BITS}, symmetric encryption (`he_init`'s "
            "context; sites hold the secret key); sites `encrypt_many`: packing in the calling process, from "
            f"{POOL_VALUES:,} values ciphertext-sized pieces ({PIECE:,} values) on a spawn pool of one worker per "
            f"core ({os.cpu_count()} here), started once per process and kept; the benchmark starts its pool with "
            "an untimed call, so every timed round runs it warm; the pool's start-up is measured on "
            f"{len(startup)} fresh context{'s' if len(startup) > 1 else ''} (first call − faster of two warm calls on "
            f"one {POOL_VALUES:,}-value shard), each pool shut down afterwards. Zone `EncryptedSum.add` / "
            "`.serialize`, site `decrypt_mean`. NVFlare-style: TenSEAL N = "
            f"{NV_POLY}, coefficients {NV_COEFF}, scale 2^{NV_SCALE_BITS}, "
            "TenSEAL's default context (public-key encryption, thread count = cores), "
            "one `ts.ckks_vector(ctx, w·x)` per shard, `.serialize()`; zone `ts.ckks_vector_from(public, bytes)` "
            "+ `+=`; decrypted sum / Σw in clear. Plaintext: `tobytes()` of float32, zone "
            "`ShardAccumulator.add` (float64), float32 mean back.",
            "- TenSEAL prints a C++ warning on stdout for every vector longer than one ciphertext "
            '("WARNING: The input does not fit in a single ciphertext ..."): the NVFlare-style path runs with '
            "file descriptor 1 redirected to /dev/null around those calls (`os.dup2`, C stdio flushed, restored "
            "afterwards; stderr and exceptions untouched). Only encryption prints it; deserialising, adding and "
            "decrypting run unredirected. fedshard encrypts one ciphertext per `ckks_vector` and prints nothing.",
            "- Columns: bytes are ciphertext bytes / (4 × values) (upload: one site's push; aggregate: the zone's "
            "sum); encrypt = values / one site's encryption wall time (cores used = CPU s / wall s, the pool "
            "workers' CPU read from /proc/PID/stat included); zone fold = values of all sites / the zone's "
            "deserialise + add time; decrypt = values / one site's decryption of the aggregate (decoding "
            "included); error = max |decrypted weighted mean − float64 weighted mean| over all values and runs; "
            "round = all sites' encryption + the zone's folds and serialisation + one decryption, in one process; "
            "critical path = the same with one site's encryption (sites in parallel). No network: the bytes are "
            "what would travel.",
            f"- Other processes on the machine kept {others:.2f} of its {os.cpu_count()} cores busy on average "
            f"during the whole benchmark (at most {max(run_loads):.2f} in one run; /proc/stat busy time minus this "
            f"benchmark's own CPU time, pool workers included); load average before / after: {load0[0]:.2f} / "
            f"{load1[0]:.2f}; peak RSS of the benchmark process {peak_mb:,.0f} MB.",
        ],
        headers=headers,
        rows=rows,
        interpretation=interp,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
