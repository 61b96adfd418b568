"""Zone accumulate throughput, including frame decode, against plain NumPy adds.

What is timed, each over the same ~25 M float32 values (100 MB) cut by a 256x256 tile
into 256 KiB shards, each of which fits one 1 MiB chunk. The push frames are
serialised beforehand exactly as ``GrpcZoneClient.push`` does
(``convert.chunks`` + ``PushFrame(chunk=...).SerializeToString()``):

* ``decode+fold``: parse every frame from bytes (``PushFrame.FromString``),
  ``np.frombuffer`` its data and ``ShardAccumulator.add`` it (weight 3): "accumulate
  including frame decode";
* ``zone push (validated)``: the real zone path as the gRPC service drives it:
  ``begin_push`` then, per frame, ``FromString`` + ``PushSession.receive`` (SHA-256
  digest, dtype/shape/offset checks, finite check, staging) and ``commit`` (the
  float64 fold);
* the NumPy peers, in the same run: ``np.add(acc32, x32, out=acc32)`` (float32 in-place
  add) and ``np.add(acc64, x32, out=acc64)`` (float64 accumulator, the zone's precision);
* components, for the analysis: frame parse, SHA-256 (``ShardHasher``), ``all_finite``
  and the fold (``ShardAccumulator.add`` of decoded arrays).

All variants run interleaved (order rotated every repetition) after one untimed
warm-up, so the peers see the same machine load; the medians, the spread and the ratio
of medians are reported.

    .venv/bin/python bench/zone_accumulate.py [--quick] [--runs N] [--output FILE]
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.aggregation import ShardAccumulator, all_finite
from fedshard.integrity import ShardHasher
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc.convert import CHUNK_BYTES, chunks

SECTION = "zone_accumulate"
WEIGHT = 3.0
GOAL = 0.60


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--runs", type=int, default=None, help="timed repetitions (default 7; 5 with --quick)")
    parser.add_argument("--values", type=int, default=None, help="float32 values in the update (default 25 M)")
    args = parser.parse_args(argv)
    runs = args.runs or (5 if args.quick else 7)
    target = args.values or (1_000_000 if args.quick else 25_000_000)

    desc = c.machine_description()
    update = c.synthetic_update(target)
    plan = c.make_plan(update, (256, 256))
    shards = plan.split(update)
    del update
    n = c.num_values(shards)
    nbytes = c.num_bytes(shards)
    sids = list(shards)
    arrays = [shards[s] for s in sids]
    frames = [pb.PushFrame(chunk=ch).SerializeToString() for ch in chunks(shards, CHUNK_BYTES)]
    assert len(frames) == len(shards), "every 256 KiB shard should be one 1 MiB chunk"
    print(
        f"update: {n:,} float32 values ({nbytes / c.MB:.1f} MB), {len(shards)} shards, "
        f"{len(frames)} frames ({sum(map(len, frames)) / c.MB:.1f} MB serialised); {runs} runs + 1 warm-up",
        flush=True,
    )

    # peers and paths ----------------------------------------------------------------------
    acc32 = [np.zeros_like(a) for a in arrays]
    acc64 = [np.zeros(a.shape, dtype=np.float64) for a in arrays]

    def np_add32() -> None:
        for a, x in zip(acc32, arrays, strict=True):
            np.add(a, x, out=a)

    def np_add64() -> None:
        for a, x in zip(acc64, arrays, strict=True):
            np.add(a, x, out=a)

    decode_acc = ShardAccumulator()

    def decode_fold() -> None:
        for raw in frames:
            ch = pb.PushFrame.FromString(raw).chunk
            values = np.frombuffer(ch.data, dtype=ch.dtype).reshape(tuple(ch.shape))
            decode_acc.add(ch.shard_id, values, WEIGHT)

    from fedshard.integrity import build_manifest

    sites = [f"site-{i}" for i in range(runs + 1)]
    zone = ZoneAggregator(c.ZONE, "bench")  # default staging budget (256 MB)
    spec = c.round_spec(1, plan, sites)
    zone.open_round(spec)
    manifest = build_manifest(
        site_id=sites[0],
        round=1,
        plan_digest=plan.digest,
        base_version=c.BASE_VERSION,
        zone=c.ZONE,
        weight=WEIGHT,
        shards=shards,
    )
    manifests = [c.manifest_for_site(manifest, s) for s in sites]
    pushed = 0

    def zone_push() -> None:
        nonlocal pushed
        session = zone.begin_push(manifests[pushed], spec.token)
        pushed += 1
        with session:
            for raw in frames:
                ch = pb.PushFrame.FromString(raw).chunk
                session.receive(ch.shard_id, ch.data, offset=ch.offset, dtype=ch.dtype, shape=tuple(ch.shape))
            receipt = session.commit()
        assert receipt.shards == len(frames)

    def parse_only() -> None:
        for raw in frames:
            pb.PushFrame.FromString(raw).chunk.data  # noqa: B018  (the bytes copy is part of the cost)

    payloads = [pb.PushFrame.FromString(raw).chunk.data for raw in frames]

    def sha_only() -> None:
        for a, data in zip(arrays, payloads, strict=True):
            h = ShardHasher(a.dtype.str, a.shape)
            h.update(data)
            h.hexdigest()

    def finite_only() -> None:
        for a in arrays:
            all_finite(a)

    fold_acc = ShardAccumulator()

    def fold_only() -> None:
        for sid, a in zip(sids, arrays, strict=True):
            fold_acc.add(sid, a, WEIGHT)

    main_variants: dict[str, Callable[[], None]] = {
        "decode+fold": decode_fold,
        "zone push (validated)": zone_push,
        "numpy add f32 (acc f32)": np_add32,
        "numpy add f32 (acc f64)": np_add64,
    }
    parts: dict[str, Callable[[], None]] = {
        "frame parse (FromString + data)": parse_only,
        "SHA-256 (ShardHasher)": sha_only,
        "all_finite": finite_only,
        "fold (ShardAccumulator.add)": fold_only,
    }
    everything = {**main_variants, **parts}
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

    # sanity: the zone's mean equals the float64 reference
    zone.close_round(1)
    _, means = zone.aggregate(1)
    k = runs + 1
    for sid, a in list(zip(sids, acc64, strict=True))[:8]:
        np.testing.assert_allclose(means[sid], (a / k).astype(np.float32), rtol=1e-6, atol=1e-7)

    # report -----------------------------------------------------------------------------
    stats = {k_: c.Stat(v) for k_, v in times.items()}
    peer32, peer64 = stats["numpy add f32 (acc f32)"], stats["numpy add f32 (acc f64)"]

    def paired(name: str, peer: str) -> tuple[float, float]:
        r = [p / t for t, p in zip(times[name], times[peer], strict=True)]
        return min(r), max(r)

    headers = [
        "variant",
        "median s",
        "min-max s",
        "M values/s",
        "GB/s",
        "vs numpy f32 add",
        "vs numpy f64-acc add",
        "page faults/run",
    ]
    rows = []
    for name in [*main_variants, *parts]:
        s = stats[name]
        r32 = peer32.median / s.median
        r64 = peer64.median / s.median
        lo32, hi32 = paired(name, "numpy add f32 (acc f32)")
        lo64, hi64 = paired(name, "numpy add f32 (acc f64)")
        rows.append(
            [
                name,
                f"{s.median:.4f}",
                f"{s.min:.4f}-{s.max:.4f}",
                c.fmt(n / s.median / 1e6, 0),
                f"{nbytes / s.median / 1e9:.2f}",
                f"{r32:.0%} ({lo32:.0%}-{hi32:.0%})",
                f"{r64:.0%} ({lo64:.0%}-{hi64:.0%})",
                c.fmt(statistics.median(faults[name]), 0),
            ]
        )
    c.print_table(f"zone accumulate, {n:,} values, median of {runs}", headers, rows)

    df = stats["decode+fold"].median
    zp = stats["zone push (validated)"].median
    goal = {
        (path, peer): peer_s.median / t_s >= GOAL
        for path, t_s in (("decode+fold", df), ("zone push", zp))
        for peer, peer_s in (("f32", peer32), ("f64", peer64))
    }

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    component_sum = sum(stats[p].median for p in parts)
    fold_s = stats["fold (ShardAccumulator.add)"].median
    parse_s = stats["frame parse (FromString + data)"].median
    sha_s = stats["SHA-256 (ShardHasher)"].median
    fin_s = stats["all_finite"].median
    largest = max(parts, key=lambda p: stats[p].median)
    push_faults = statistics.median(faults["zone push (validated)"])
    df_faults = statistics.median(faults["decode+fold"])
    overhead = zp - component_sum
    sentences = [
        f"Goal (≥ {GOAL:.0%} of NumPy): decode+fold reaches {peer32.median / df:.0%} of the float32 in-place add "
        f"({verdict(goal['decode+fold', 'f32'])}) and {peer64.median / df:.0%} of the float64-accumulator add "
        f"({verdict(goal['decode+fold', 'f64'])}); the full validated zone push reaches {peer32.median / zp:.0%} "
        f"({verdict(goal['zone push', 'f32'])}) and {peer64.median / zp:.0%} ({verdict(goal['zone push', 'f64'])}).",
        "The float32 peer moves 12 bytes per value (read x, read and write a float32 sum), a float64 accumulation "
        "20 (read 4, read and write 8), so a memory-bound float64 fold cannot exceed ~60 % of the float32 add "
        "before doing anything else; the float64 peer, which is that ceiling, runs here at "
        f"{peer32.median / peer64.median:.0%} of the float32 add.",
        f"The zone's blocked fold (multiply each block by the weight into an L2-resident float64 scratch, then add) "
        f"runs at {peer64.median / fold_s:.0%} of the float64 peer; the extra scratch pass and the Python loop over "
        "32 Ki-value blocks are the difference.",
        f"Decoding a frame copies its payload into a new bytes object ({nbytes / parse_s / 1e9:.1f} GB/s), "
        f"{parse_s / df:.0%} of the decode+fold time.",
        f"The validated path adds SHA-256 over every byte ({nbytes / sha_s / 1e9:.2f} GB/s) and the finite check "
        f"({nbytes / fin_s / 1e9:.1f} GB/s); the largest single component is {largest} "
        f"({stats[largest].median / component_sum:.0%} of the components' sum).",
    ]
    if overhead > 0.15 * zp:
        sentences.append(
            f"The components timed alone sum to {component_sum:.3f} s, the whole push takes {zp:.3f} s: the other "
            f"{overhead:.3f} s coincide with ~{push_faults:,.0f} minor page faults per push (one per 4 KiB staged: the "
            "whole push is held as received bytes objects until commit, then freed, and the next push gets fresh "
            f"pages; decode+fold, which frees each frame at once, takes {df_faults:,.0f}; page faults are costly in "
            "this VM), plus the per-chunk checks."
        )
    else:
        sentences.append(
            f"The components timed alone sum to {component_sum:.3f} s against {zp:.3f} s for the whole push: little "
            "overhead around them."
        )
    sentences.append(
        "With a memory-bound float64 fold, SHA-256 of every byte on the same core, and a bytes copy per frame, "
        "the validated push cannot reach 60 % of a NumPy add; decode+fold against the float64 peer is the "
        "comparison the goal can fairly be held to."
    )
    analysis = " ".join(sentences)
    print("\n" + analysis)

    c.publish(
        args,
        SECTION,
        "Zone accumulate throughput (incl. frame decode) vs NumPy",
        f"{runs} timed runs per variant after 1 warm-up, all variants interleaved in one process "
        "(order rotated per run); medians, min-max, ratios of medians with the min-max of the "
        "per-run paired ratios in brackets",
        desc,
        notes=[
            f"- Update: {n:,} float32 values ({nbytes / c.MB:.1f} MB) as {len(shards)} shards "
            f"(tile 256x256 → 256 KiB shards, one 1 MiB chunk each); weight {WEIGHT:g}; GB = 10^9 bytes of "
            "float32 shard data.",
            "- `decode+fold` = `PushFrame.FromString` + `np.frombuffer` + `ShardAccumulator.add`; "
            "`zone push (validated)` = `ZoneAggregator.begin_push` + `FromString` + `PushSession.receive` "
            "(SHA-256, checks, finite check, staging) per frame + `commit` (float64 fold), i.e. what the gRPC "
            "service does without the transport. Component rows are timed alone on the same data.",
        ],
        headers=headers,
        rows=rows,
        interpretation=analysis,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
