"""Homomorphic encryption of gradient shards: fedshard's BFV (its default) and CKKS schemes vs the
NVFlare-style default.

All schemes run in the same process, on the same synthetic updates (``S`` = 4 simulated
sites, each with its own float32 update of ~1 M and ~10 M values, N(0, 0.01) like a
DP-noised update, cut into 1024x1024 shards by ``ShardPlan``; one shard per layer here):

* **fedshard** (``fedshard/crypto/he.py``, schemes in ``fedshard/crypto/he_schemes.py``): N = 4096,
  coefficients [60, 49], two quantised values per slot (BFV: 4096 slots of 21-bit fields modulo
  a 42-bit prime, the default; CKKS: 2048 slots of 19-bit fields at scale 2^20, ``fedshard-ckks``),
  symmetric (secret-key) encryption; a site encrypts with
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

    .venv/bin/python bench/he.py [--quick] [--json] [--runs N] [--values N [N ...]] [--output FILE]

``--json`` prints, at the largest size: ``scheme`` (the default), ``bytes_per_f32`` (its upload bytes
per float32 byte; ``ckks_bytes_per_f32`` fedshard's CKKS, ``nvflare_bytes_per_f32`` the same
NVFlare-style), ``ckks_max_abs_error`` and ``ckks_error_bound``, ``encrypt_m_values_s`` (per site, pool warm;
``nvflare_encrypt_m_values_s``), ``fold_m_values_s``, ``decrypt_m_values_s``, ``max_abs_error`` (all
sizes) and its ``error_bound``, ``round_vs_plaintext``, ``critical_path_vs_plaintext``,
``pool_startup_s`` and ``values_per_site``.

The schemes and one round of each are in ``_he_schemes.py``, the report in ``_he_report.py``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tenseal as ts

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
from _he_report import headers, report
from _he_schemes import (
    MAX_SITES,
    POOL_VALUES,
    SAMPLES,
    SCHEMES,
    FedshardScheme,
    Measured,
    NvflareScheme,
    OtherLoad,
    PlainScheme,
    Round,
    Workload,
    cpu_seconds,
    make_workload,
    pool_shards,
    pool_startup,
    run_round,
)

SECTION = "he"
STARTUP_REPS = 3  # pool start-ups measured (1 with --quick)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
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
    return parser.parse_args(argv)


def sizes_of(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """The update sizes to measure: (values per site, layer width, timed rounds per scheme)."""
    if args.quick:
        return [(t, 256, args.runs or 1) for t in args.values or [100_000]]
    return [(t, 1024, args.runs or (5 if t < 5_000_000 else 3)) for t in args.values or [1_000_000, 10_000_000]]


def timed_rounds(
    schemes: dict[str, Any], work: Workload, runs: int, quick: bool, run_loads: list[float]
) -> tuple[dict[str, list[Round]], dict[str, list[tuple[float, float]]]]:
    """``runs`` rounds of every scheme, interleaved (order rotated per run); unless ``quick``, fedshard's
    encryption of site 0's update alone, two more ways, after each run. Appends each run's other load."""
    fed: FedshardScheme = schemes["fedshard"]
    res: dict[str, list[Round]] = {name: [] for name in SCHEMES}
    extra_tasks: dict[str, Callable[[], Any]] = {
        "one process": functools.partial(fed.encrypt_one_process, work.sites[0], work.weights[0]),
        "default tiles": functools.partial(fed.encrypt, work.default_tiles, work.weights[0]),
    }
    extra: dict[str, list[tuple[float, float]]] = {k: [] for k in extra_tasks}
    for rep in range(runs):
        run_load = OtherLoad()
        for name in c.rotated(SCHEMES, rep):
            res[name].append(run_round(schemes[name], work))
        if not quick:  # fedshard's encryption alone, two more ways (site 0's update)
            for task in c.rotated(list(extra_tasks), rep):
                cpu0, t0 = cpu_seconds(), time.perf_counter()
                extra_tasks[task]()
                extra[task].append((time.perf_counter() - t0, cpu_seconds() - cpu0))
        run_loads.append(run_load.cores())
        print(
            f"  {work.label} run {rep + 1}/{runs}: "
            + ", ".join(f"{name} {res[name][-1].wall:.2f} s" for name in SCHEMES)
            + f"; other processes kept {run_loads[-1]:.2f} cores busy",
            flush=True,
        )
    return res, extra


def describe_workload(m: Measured, work: Workload, fed: FedshardScheme) -> None:
    """Record the sizes of ``work`` (values, shards, pieces) in ``m``."""
    m.works[work.label] = (work.values, len(work.shapes), sum(work.weights))
    m.default_shards[work.label] = len(work.default_tiles)
    m.largest[work.label] = max(math.prod(shape) for shape in work.shapes.values())
    m.pieces[work.label] = sum(
        math.ceil(fed.codec.slots_for(math.prod(shape)) / fed.codec.scheme.slots) for shape in work.shapes.values()
    )


def measure(sizes: list[tuple[int, int, int]], quick: bool) -> Measured:
    """The pool's start-up, then every size's rounds (see the module docstring)."""
    m = Measured(sizes=sizes, load0=os.getloadavg())
    whole_load = OtherLoad()
    tmp = tempfile.TemporaryDirectory(prefix="fedshard-bench-he-")
    schemes: dict[str, Any] = {
        "fedshard": FedshardScheme(Path(tmp.name) / "default"),
        "fedshard-ckks": FedshardScheme(Path(tmp.name) / "ckks", "ckks"),
        "nvflare": NvflareScheme(),
        "plaintext": PlainScheme(),
    }
    fed: FedshardScheme = schemes["fedshard"]
    headroom = max(1, math.ceil(math.log2(max(2, MAX_SITES))))
    assert fed.codec.levels == 2 ** (fed.codec.scheme.field_bits - 1 - headroom) - 1  # 2^(F - 1 - headroom) - 1
    # encrypt_many's process pool: start-up by itself (fresh contexts), then the benchmark's own pool
    # is started once, untimed, as a site process would on its first round.
    startup_shards = pool_shards()
    m.startup = [pool_startup(fed.secret_path, startup_shards) for _ in range(1 if quick else STARTUP_REPS)]
    print(
        f"pool start-up: first encrypt_many of {POOL_VALUES:,} values "
        + ", ".join(f"{cold:.2f} s vs warm {warm:.2f} s" for cold, warm in m.startup),
        flush=True,
    )
    pool_warmed = False
    for i, (target, width, runs) in enumerate(sizes):
        work = make_workload(target, width)
        describe_workload(m, work, fed)
        print(
            f"update: {work.values:,} float32 values per site in {len(work.shapes)} shards, {len(SAMPLES)} sites; "
            f"{runs} timed round(s) per scheme",
            flush=True,
        )
        if work.values >= POOL_VALUES and not pool_warmed:  # start this codec's pool, untimed
            fed.codec.encrypt_many(startup_shards, 1.0)
            pool_warmed = True
        if i == 0 and not quick:  # one untimed round per scheme (imports, first allocations)
            for name in SCHEMES:
                run_round(schemes[name], work)
        m.results[work.label], m.extra[work.label] = timed_rounds(schemes, work, runs, quick, m.run_loads)
        del work
    m.load1 = os.getloadavg()
    m.others = whole_load.cores()
    tmp.cleanup()
    m.step, m.levels, m.clipped = fed.codec.step, fed.codec.levels, fed.clipped + schemes["fedshard-ckks"].clipped
    m.ckks_step = schemes["fedshard-ckks"].codec.step
    return m


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
    sizes = sizes_of(args)
    desc = c.machine_description()
    desc["numpy"] += f", tenseal {ts.__version__}"
    m = measure(sizes, args.quick)
    rep = report(m)
    runs_text = (
        "1 round per scheme (--quick)"
        if args.quick
        else ", ".join(f"{r} timed rounds per scheme at {lb}" for (_, _, r), lb in zip(sizes, m.labels, strict=True))
        + "; one untimed round per scheme first; schemes interleaved, order rotated per run; medians (round: min-max)"
    )
    c.publish(
        args,
        SECTION,
        "Homomorphic encryption of gradient shards: fedshard's BFV and CKKS vs NVFlare-style CKKS",
        runs_text,
        desc,
        notes=rep.notes,
        headers=headers(),
        rows=rep.rows,
        interpretation=rep.interpretation,
        headline=rep.headline,
        console_title=f"HE of gradient shards, {len(SAMPLES)} sites, medians",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
