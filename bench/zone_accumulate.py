"""Zone accumulate throughput, including frame decode, against plain NumPy adds.

What is timed, each over the same ~25 M float32 values (100 MB) cut by a 256x256 tile
into 256 KiB shards, each of which fits one 1 MiB chunk. The push frames are
serialised beforehand exactly as ``GrpcZoneClient.push`` does
(``convert.chunks`` + ``PushFrame(chunk=...).SerializeToString()``):

* ``decode+fold``: parse every frame from bytes (``PushFrame.FromString``),
  ``np.frombuffer`` its data and ``ShardAccumulator.add`` it (weight 3): "accumulate
  including frame decode";
* ``zone push (validated)``: the real zone path as the gRPC service drives it:
  ``begin_push`` then, per frame, ``FromString`` + ``PushSession.receive`` (BLAKE3
  digest, dtype/shape/offset checks, finite check, staging) and ``commit`` (the
  fold into float32 sums of ``(w/unit)·x``: with the round's weights all equal, one
  in-place add per shard);
* the NumPy peers, in the same run: ``np.add(acc32, x32, out=acc32)`` (float32 in-place
  add, the zone's precision) and ``np.add(acc64, x32, out=acc64)`` (a float64
  accumulator, the zone's precision before issue 14);
* components, for the analysis: frame parse, BLAKE3 (``ShardHasher``), the value check
  (``extremes``: min and max, which the push checks for finiteness and bounds), the copy
  into the zone's reused staging buffers and the fold (``ShardAccumulator.add`` of
  decoded arrays).

All variants run interleaved (order rotated every repetition) after one untimed
warm-up, so the peers see the same machine load; the medians, the spread and the ratio
of medians are reported.

    .venv/bin/python bench/zone_accumulate.py [--quick] [--json] [--runs N] [--output FILE]

``--json`` prints ``full_push_vs_numpy_f32_add`` and ``full_push_vs_numpy_f64_add`` (the validated
zone push), ``decode_fold_vs_numpy_f32_add`` and ``decode_fold_vs_numpy_f64_add`` (ratios of
medians: NumPy's time / the path's) and ``full_push_gb_s``.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.aggregation import ShardAccumulator, error_bound, extremes
from fedshard.integrity import ShardHasher, build_manifest
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc.convert import CHUNK_BYTES, chunks

SECTION = "zone_accumulate"
WEIGHT = c.SITE_WEIGHT
GOAL = 0.60
PEER32, PEER64 = "numpy add f32 (acc f32)", "numpy add f32 (acc f64)"
DECODE_FOLD, ZONE_PUSH = "decode+fold", "zone push (validated)"
PARSE, SHA, FINITE, STAGE, FOLD = (
    "frame parse (FromString + data)",
    "BLAKE3 (ShardHasher)",
    "value check (extremes)",
    "stage (copy into reused buffers)",
    "fold (ShardAccumulator.add)",
)
PARTS = (PARSE, SHA, FINITE, STAGE, FOLD)
Variants = dict[str, Callable[[], None]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--runs", type=int, default=None, help="timed repetitions (default 7; 5 with --quick)")
    parser.add_argument("--values", type=int, default=None, help="float32 values in the update (default 25 M)")
    return parser.parse_args(argv)


@dataclass
class Workload:
    """The update, its shards in plan order and its push frames, serialised as ``GrpcZoneClient.push`` does."""

    plan: Any
    shards: dict[str, np.ndarray]
    sids: list[str]
    arrays: list[np.ndarray]
    frames: list[bytes]
    n: int
    nbytes: int


def workload(target: int) -> Workload:
    """A synthetic update of about ``target`` values, cut by a 256x256 tile, one 1 MiB frame per shard."""
    update = c.synthetic_update(target)
    plan = c.make_plan(update, (256, 256))
    shards = plan.split(update)
    del update
    sids = list(shards)
    frames = [pb.PushFrame(chunk=ch).SerializeToString() for ch in chunks(shards, CHUNK_BYTES)]
    assert len(frames) == len(shards), "every 256 KiB shard should be one 1 MiB chunk"
    return Workload(plan, shards, sids, [shards[s] for s in sids], frames, c.num_values(shards), c.num_bytes(shards))


def numpy_peers(w: Workload) -> tuple[Variants, list[np.ndarray]]:
    """The NumPy adds (float32 and float64 accumulators) and decode+fold; also the float64 sums."""
    acc32 = [np.zeros_like(a) for a in w.arrays]
    acc64 = [np.zeros(a.shape, dtype=np.float64) for a in w.arrays]

    def np_add32() -> None:
        for a, x in zip(acc32, w.arrays, strict=True):
            np.add(a, x, out=a)

    def np_add64() -> None:
        for a, x in zip(acc64, w.arrays, strict=True):
            np.add(a, x, out=a)

    decode_acc = ShardAccumulator(unit=WEIGHT)  # as at a zone whose round fixed the same weight for every site

    def decode_fold() -> None:
        for raw in w.frames:
            ch = pb.PushFrame.FromString(raw).chunk
            values = np.frombuffer(ch.data, dtype=ch.dtype).reshape(tuple(ch.shape))
            decode_acc.add(ch.shard_id, values, WEIGHT)

    return {DECODE_FOLD: decode_fold, PEER32: np_add32, PEER64: np_add64}, acc64


def zone_push(w: Workload, runs: int) -> tuple[Callable[[], None], ZoneAggregator]:
    """The validated zone push (one site per call, ``runs + 1`` sites selected) and its zone."""
    sites = [f"site-{i}" for i in range(runs + 1)]
    zone = ZoneAggregator(c.ZONE, "bench")  # default staging budget (256 MB)
    spec = c.round_spec(1, w.plan, sites)
    zone.open_round(spec)
    manifest = build_manifest(
        site_id=sites[0],
        round=1,
        plan_digest=w.plan.digest,
        base_version=c.BASE_VERSION,
        zone=c.ZONE,
        weight=WEIGHT,
        shards=w.shards,
    )
    manifests = [c.manifest_for_site(manifest, s) for s in sites]
    pushed = 0

    def push() -> None:
        nonlocal pushed
        session = zone.begin_push(manifests[pushed], spec.token)
        pushed += 1
        with session:
            for raw in w.frames:
                ch = pb.PushFrame.FromString(raw).chunk
                session.receive(ch.shard_id, ch.data, offset=ch.offset, dtype=ch.dtype, shape=tuple(ch.shape))
            receipt = session.commit()
        assert receipt.shards == len(w.frames)

    return push, zone


def components(w: Workload) -> Variants:
    """The parts of the validated path, each alone on the same data: parse, BLAKE3, finite check, fold."""

    def parse_only() -> None:
        for raw in w.frames:
            pb.PushFrame.FromString(raw).chunk.data  # noqa: B018  (the bytes copy is part of the cost)

    payloads = [pb.PushFrame.FromString(raw).chunk.data for raw in w.frames]

    def sha_only() -> None:
        for a, data in zip(w.arrays, payloads, strict=True):
            h = ShardHasher(a.dtype.str, a.shape)
            h.update(data)
            h.hexdigest()

    def finite_only() -> None:
        for a in w.arrays:
            extremes(a)

    staging = [np.empty_like(a) for a in w.arrays]

    def stage_only() -> None:
        for a, buf in zip(w.arrays, staging, strict=True):
            np.copyto(buf, a)

    fold_acc = ShardAccumulator(unit=WEIGHT)

    def fold_only() -> None:
        for sid, a in zip(w.sids, w.arrays, strict=True):
            fold_acc.add(sid, a, WEIGHT)

    return {PARSE: parse_only, SHA: sha_only, FINITE: finite_only, STAGE: stage_only, FOLD: fold_only}


def measure(everything: Variants, runs: int) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Seconds and minor page faults of every variant per run, interleaved (after one warm-up each)."""
    times: dict[str, list[float]] = {k: [] for k in everything}
    faults: dict[str, list[int]] = {k: [] for k in everything}
    for fn in everything.values():  # warm-up: allocates the sums, faults pages in
        fn()
    for rep in range(runs):
        for name in c.rotated(list(everything), rep):
            gc.collect()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            times[name].append(c.timed(everything[name]))
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        print(f"  run {rep + 1}/{runs} done", flush=True)
    return times, faults


def check_means(zone: ZoneAggregator, w: Workload, acc64: list[np.ndarray], pushes: int) -> None:
    """Sanity: the zone's mean is within the accumulator's stated bound of the float64 reference."""
    zone.close_round(1)
    means = zone.fetch(1).means
    for sid, a, x in list(zip(w.sids, acc64, w.arrays, strict=True))[:8]:
        bound = error_bound(pushes, np.abs(x.astype(np.float64)))  # every push is the same update
        assert np.all(np.abs(means[sid] - a / pushes) <= bound), f"shard {sid}: mean beyond the stated bound"


HEADERS = [
    "variant",
    "median s",
    "min-max s",
    "M values/s",
    "GB/s",
    "vs numpy f32 add",
    "vs numpy f64-acc add",
    "page faults/run",
]


class Figures:
    """The measured figures: ``times`` and ``faults`` per variant for workload ``w``."""

    def __init__(self, times: dict[str, list[float]], faults: dict[str, list[int]], w: Workload) -> None:
        self.times, self.faults, self.w = times, faults, w
        self.stats = {k: c.Stat(v) for k, v in times.items()}

    def med(self, name: str) -> float:
        """Median seconds of ``name``."""
        return self.stats[name].median

    def ratio(self, name: str, peer: str) -> float:
        """``name``'s speed as a fraction of ``peer``'s (ratio of medians)."""
        return self.med(peer) / self.med(name)

    def paired(self, name: str, peer: str) -> tuple[float, float]:
        """Min-max of the per-run ratios of ``peer``'s time to ``name``'s."""
        r = [p / t for t, p in zip(self.times[name], self.times[peer], strict=True)]
        return min(r), max(r)


def table(f: Figures) -> list[list[str]]:
    """One row per variant, the paths and peers first, then the components."""
    rows = []
    for name in [DECODE_FOLD, ZONE_PUSH, PEER32, PEER64, *PARTS]:
        s = f.stats[name]
        lo32, hi32 = f.paired(name, PEER32)
        lo64, hi64 = f.paired(name, PEER64)
        rows.append(
            [
                name,
                f"{s.median:.4f}",
                f"{s.min:.4f}-{s.max:.4f}",
                c.fmt(f.w.n / s.median / 1e6, 0),
                f"{f.w.nbytes / s.median / 1e9:.2f}",
                f"{f.ratio(name, PEER32):.0%} ({lo32:.0%}-{hi32:.0%})",
                f"{f.ratio(name, PEER64):.0%} ({lo64:.0%}-{hi64:.0%})",
                c.fmt(statistics.median(f.faults[name]), 0),
            ]
        )
    return rows


def _verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def interpretation(f: Figures) -> str:
    """What the figures say, in words."""
    nbytes, med = f.w.nbytes, f.med
    peer32, peer64, df, zp = med(PEER32), med(PEER64), med(DECODE_FOLD), med(ZONE_PUSH)
    component_sum = sum(med(p) for p in PARTS)
    largest = max(PARTS, key=med)
    overhead = zp - component_sum
    sentences = [
        f"Goal (≥ {GOAL:.0%} of NumPy): decode+fold reaches {peer32 / df:.0%} of the float32 in-place add "
        f"({_verdict(peer32 / df >= GOAL)}) and {peer64 / df:.0%} of the float64-accumulator add "
        f"({_verdict(peer64 / df >= GOAL)}); the full validated zone push reaches {peer32 / zp:.0%} "
        f"({_verdict(peer32 / zp >= GOAL)}) and {peer64 / zp:.0%} ({_verdict(peer64 / zp >= GOAL)}).",
        "The float32 peer moves 12 bytes per value (read x, read and write a float32 sum), a float64 accumulation "
        "20 (read 4, read and write 8): the float64 peer (the zone's sums before issue 14) runs here at "
        f"{peer32 / peer64:.0%} of the float32 add.",
        f"The zone's fold (float32 sums of (w/unit)·x; every site here has the round's one weight, so each shard is "
        f"one in-place add) runs at {peer32 / med(FOLD):.0%} of the float32 peer.",
        f"Decoding a frame copies its payload into a new bytes object ({nbytes / med(PARSE) / 1e9:.1f} GB/s), "
        f"{med(PARSE) / df:.0%} of the decode+fold time.",
        f"The validated path adds BLAKE3 over every byte ({nbytes / med(SHA) / 1e9:.2f} GB/s), the value check "
        f"({nbytes / med(FINITE) / 1e9:.1f} GB/s) and the copy into the zone's staging buffers "
        f"({nbytes / med(STAGE) / 1e9:.1f} GB/s); the largest single component is {largest} "
        f"({med(largest) / component_sum:.0%} of the components' sum).",
    ]
    if overhead > 0.15 * zp:
        sentences.append(
            f"The components timed alone sum to {component_sum:.3f} s, the whole push takes {zp:.3f} s: the other "
            f"{overhead:.3f} s coincide with ~{statistics.median(f.faults[ZONE_PUSH]):,.0f} minor page faults per "
            f"push (decode+fold takes {statistics.median(f.faults[DECODE_FOLD]):,.0f}; page faults are costly in "
            "this VM), plus the per-chunk checks."
        )
    else:
        sentences.append(
            f"The components timed alone sum to {component_sum:.3f} s against {zp:.3f} s for the whole push: little "
            "overhead around them."
        )
    return " ".join(sentences)


def headline(f: Figures) -> dict[str, Any]:
    """The ``--json`` figures (ratios of medians: NumPy's time / the path's; GB = 10^9 bytes)."""
    return {
        "full_push_vs_numpy_f32_add": f.ratio(ZONE_PUSH, PEER32),
        "full_push_vs_numpy_f64_add": f.ratio(ZONE_PUSH, PEER64),
        "decode_fold_vs_numpy_f32_add": f.ratio(DECODE_FOLD, PEER32),
        "decode_fold_vs_numpy_f64_add": f.ratio(DECODE_FOLD, PEER64),
        "full_push_gb_s": f.w.nbytes / f.med(ZONE_PUSH) / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
    runs = args.runs or (5 if args.quick else 7)
    target = args.values or (1_000_000 if args.quick else 25_000_000)

    desc = c.machine_description()
    w = workload(target)
    print(
        f"update: {w.n:,} float32 values ({w.nbytes / c.MB:.1f} MB), {len(w.shards)} shards, "
        f"{len(w.frames)} frames ({sum(map(len, w.frames)) / c.MB:.1f} MB serialised); {runs} runs + 1 warm-up",
        flush=True,
    )
    peers, acc64 = numpy_peers(w)
    push, zone = zone_push(w, runs)
    main_variants = {DECODE_FOLD: peers[DECODE_FOLD], ZONE_PUSH: push, PEER32: peers[PEER32], PEER64: peers[PEER64]}
    times, faults = measure({**main_variants, **components(w)}, runs)
    check_means(zone, w, acc64, runs + 1)
    figures = Figures(times, faults, w)
    c.publish(
        args,
        SECTION,
        "Zone accumulate throughput (incl. frame decode) vs NumPy",
        f"{runs} timed runs per variant after 1 warm-up, all variants interleaved in one process "
        "(order rotated per run); medians, min-max, ratios of medians with the min-max of the "
        "per-run paired ratios in brackets",
        desc,
        notes=[
            f"- Update: {w.n:,} float32 values ({w.nbytes / c.MB:.1f} MB) as {len(w.shards)} shards "
            f"(tile 256x256 → 256 KiB shards, one 1 MiB chunk each); weight {WEIGHT:g}; GB = 10^9 bytes of "
            "float32 shard data.",
            "- `decode+fold` = `PushFrame.FromString` + `np.frombuffer` + `ShardAccumulator.add`; "
            "`zone push (validated)` = `ZoneAggregator.begin_push` + `FromString` + `PushSession.receive` "
            "(BLAKE3, checks, finite check, staging) per frame + `commit` (float32 fold), i.e. what the gRPC "
            "service does without the transport. Component rows are timed alone on the same data.",
        ],
        headers=HEADERS,
        rows=table(figures),
        interpretation=interpretation(figures),
        headline=headline(figures),
        console_title=f"zone accumulate, {w.n:,} values, median of {runs}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
