"""The schemes ``bench/he.py`` compares, and one round of each (not a benchmark itself).

* :class:`FedshardScheme` (``HeCodec.encrypt_many``, ``EncryptedSum``, ``decrypt_mean``),
  :class:`NvflareScheme` (TenSEAL's defaults as NVIDIA FLARE's HE filters use them) and
  :class:`PlainScheme` (float32 bytes, ``ShardAccumulator``): each encrypts a site's shards,
  makes a zone that folds them and serialises the sum, and decrypts the mean;
* :func:`run_round`: every site encrypts, the zone folds, one site decrypts; wall and CPU
  seconds of each step, bytes each way and the error of the mean;
* :func:`pool_startup`: the one-off start-up of ``encrypt_many``'s process pool;
* CPU accounting that includes the pool's workers (:func:`cpu_seconds`, :class:`OtherLoad`);
* :class:`Measured`: what a whole run measured, per update size.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tenseal as ts

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.aggregation import ShardAccumulator
from fedshard.crypto import he
from fedshard.crypto.ciphertexts import EncryptedSum
from fedshard.crypto.he import (
    DEFAULT_SCHEME,
    VALUES_PER_SLOT,
    HeCodec,
    Pack,
    he_init,
    load_context,
    pack_layout,
)
from fedshard.crypto.he_schemes import SCHEMES as HE_SCHEMES

__all__ = [
    "DEFAULT_TILE",
    "LABELS",
    "Measured",
    "MAX_SITES",
    "NV_COEFF",
    "NV_POLY",
    "NV_SCALE_BITS",
    "PIECE",
    "POOL_VALUES",
    "SAMPLES",
    "SCHEMES",
    "TILE",
    "VALUE_RANGE",
    "VALUE_STD",
    "FedshardScheme",
    "NvflareScheme",
    "OtherLoad",
    "PlainScheme",
    "Round",
    "Workload",
    "cpu_seconds",
    "make_workload",
    "pool_shards",
    "pool_startup",
    "quiet_stdout",
    "run_round",
]

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
PIECE = HE_SCHEMES[DEFAULT_SCHEME].slots * VALUES_PER_SLOT  # values per ciphertext: encrypt_many's unit of work
SCHEMES = ["fedshard", "fedshard-ckks", "nvflare", "plaintext"]
"""``fedshard`` is fedshard's default scheme (BFV), ``fedshard-ckks`` its CKKS alternative (``he.scheme: ckks``)."""
LABELS = {
    "fedshard": f"fedshard ({DEFAULT_SCHEME.upper()}, default)",
    "fedshard-ckks": "fedshard CKKS",
    "nvflare": "NVFlare-style",
    "plaintext": "plaintext",
}

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
    """fedshard's codec under ``scheme`` (``he.scheme``): ``encrypt_packs`` at the sites (the shards
    packed as ``pack_layout`` lays them out), ``EncryptedSum`` at the zone, ``decrypt_pack``."""

    def __init__(self, keys: Path, scheme: str = DEFAULT_SCHEME) -> None:
        secret_path, public_path = he_init(keys, scheme=scheme)
        self.secret_path = secret_path
        self.codec = HeCodec(load_context(secret_path, secret=True, scheme=scheme), VALUE_RANGE, MAX_SITES)
        self.public = load_context(public_path, secret=False, scheme=scheme)
        self.clipped = 0

    def _packs(self, shapes: dict[str, tuple[int, ...]]) -> list[Pack]:
        return pack_layout((sid, math.prod(shape), "") for sid, shape in shapes.items())

    def encrypt(self, shards: dict[str, np.ndarray], weight: float) -> dict[str, bytes]:
        packs = self._packs({sid: v.shape for sid, v in shards.items()})
        out, clipped = self.codec.encrypt_packs(packs, shards, weight)
        self.clipped += clipped
        return out

    def encrypt_one_process(self, shards: dict[str, np.ndarray], weight: float) -> None:
        for values in shards.values():
            self.codec.encrypt(values, weight)

    def new_zone(self, shapes: dict[str, tuple[int, ...]]) -> Any:
        return _FedshardZone(self.public)

    def decrypt(self, agg: dict[str, bytes], shapes: dict[str, tuple[int, ...]], total: float) -> dict[str, np.ndarray]:
        out = {}
        for pack in self._packs(shapes):
            for sid, mean in self.codec.decrypt_pack(agg[pack.carrier], pack).items():
                out[sid] = mean.reshape(shapes[sid])
        return out


class _FedshardZone:
    """The zone side of fedshard's scheme."""

    def __init__(self, public: Any) -> None:
        self.sums = EncryptedSum(public)

    def add(self, sid: str, data: bytes, weight: float) -> None:
        self.sums.add(sid, data)  # the weight travels inside the ciphertext

    def serialize(self, sid: str) -> bytes:
        return self.sums.serialize(sid)


class NvflareScheme:
    """TenSEAL's defaults as NVIDIA FLARE's HE filters use them: one public-key ``ckks_vector`` per shard."""

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
    """The zone side of the NVFlare-style scheme: deserialise and ``+=``."""

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
    """No encryption: float32 bytes up, a float64 ``ShardAccumulator`` at the zone, the float32 mean down."""

    def encrypt(self, shards: dict[str, np.ndarray], weight: float) -> dict[str, bytes]:
        return {sid: values.tobytes() for sid, values in shards.items()}

    def new_zone(self, shapes: dict[str, tuple[int, ...]]) -> Any:
        return _PlainZone(shapes)

    def decrypt(self, agg: dict[str, bytes], shapes: dict[str, tuple[int, ...]], total: float) -> dict[str, np.ndarray]:
        return {sid: np.frombuffer(b, dtype=np.float32).reshape(shapes[sid]) for sid, b in agg.items()}


class _PlainZone:
    """The zone side of the plaintext scheme."""

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
    """What one round of one scheme took (wall and CPU seconds per step, bytes, error of the mean)."""

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
    """The sites' updates cut into shards, their weights and the float64 weighted mean they should give."""

    label: str
    sites: list[dict[str, np.ndarray]]
    weights: list[float]
    shapes: dict[str, tuple[int, ...]]
    reference: dict[str, np.ndarray]  # float64 weighted mean
    values: int
    default_tiles: dict[str, np.ndarray]  # site 0's update cut at fedshard's default tile


def make_workload(target: int, width: int) -> Workload:
    """One update of about ``target`` values (layers ``width`` wide) per site, N(0, VALUE_STD)."""
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
    """Every site encrypts and the zone folds it, the zone serialises the sum, one site decrypts the mean."""
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


@dataclass
class Measured:
    """What ``bench/he.py`` measured, per update size (its label, e.g. ``"1.05 M"``)."""

    sizes: list[tuple[int, int, int]]  # (target values, layer width, timed rounds)
    results: dict[str, dict[str, list[Round]]] = field(default_factory=dict)  # label -> scheme -> rounds
    extra: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)  # label -> task -> (wall, cpu)
    works: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # label -> values, shards, total weight
    default_shards: dict[str, int] = field(default_factory=dict)
    largest: dict[str, int] = field(default_factory=dict)  # values of the largest shard
    pieces: dict[str, int] = field(default_factory=dict)  # ciphertexts per site update
    startup: list[tuple[float, float]] = field(default_factory=list)  # pool start-ups: (cold, warm) seconds
    run_loads: list[float] = field(default_factory=list)  # cores other processes kept busy, per run
    others: float = 0.0  # the same over the whole benchmark
    load0: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load1: tuple[float, float, float] = (0.0, 0.0, 0.0)
    step: float = 0.0  # fedshard's quantisation step (the default scheme)
    levels: int = 0
    ckks_step: float = 0.0  # the same under CKKS
    clipped: int = 0  # values fedshard clipped in all runs

    @property
    def labels(self) -> list[str]:
        """The update sizes, smallest first."""
        return list(self.results)
