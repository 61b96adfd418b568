"""Upload (push) and download (fetch_aggregate) throughput through the real gRPC data plane.

A zone gRPC server runs in a separate process (``python bench/_common.py serve``), on
127.0.0.1, so the client and the zone do not share a GIL. For each configuration
(shard tile x chunk size) and each repetition, the client opens a new round, builds the
manifest (digests every shard; timed separately, not part of the push), pushes a
~100 MB update (25 M+ float32 values) with ``GrpcZoneClient.push``, closes the round
and downloads the aggregate with ``fetch_aggregate`` (which verifies every digest and
the Merkle root). Configurations are interleaved and their order rotated every
repetition; one untimed warm-up round per configuration comes first.

Tile 256x256 makes 256 KiB shards (a chunk size above 256 KiB changes nothing);
tile 1024x1024 makes 4 MiB shards, so the chunk size decides how many frames a shard
takes, and shards above 1 MiB are reassembled in a buffer at the zone.

    .venv/bin/python bench/upload.py [--quick] [--runs N] [--output FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.zone.rpc.client import GrpcZoneClient

SECTION = "upload"
TILES = [(256, 256), (1024, 1024)]
CHUNKS = [256 << 10, 1 << 20, 4 << 20]


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument(
        "--runs", type=int, default=None, help="timed pushes per configuration (default 7; 5 with --quick)"
    )
    parser.add_argument("--values", type=int, default=None, help="float32 values in the update (default 25 M)")
    args = parser.parse_args(argv)
    runs = args.runs or (5 if args.quick else 7)
    target = args.values or (1_000_000 if args.quick else 25_000_000)

    desc = c.machine_description()
    update = c.synthetic_update(target)
    plans = {tile: c.make_plan(update, tile) for tile in TILES}
    shard_sets = {tile: plans[tile].split(update) for tile in TILES}
    n = c.num_values(update)
    nbytes = c.num_bytes(update)
    del update
    configs = [(tile, chunk) for tile in TILES for chunk in CHUNKS]
    print(f"update: {n:,} float32 values ({nbytes / c.MB:.1f} MB); {runs} runs + 1 warm-up per config", flush=True)

    results: dict[tuple[tuple[int, int], int], dict[str, list[float]]] = {
        cfg: {k: [] for k in ("manifest", "push", "close", "fetch", "srv_cpu", "cli_cpu", "srv_flt", "cli_flt")}
        for cfg in configs
    }
    frames_per_push: dict[tuple[tuple[int, int], int], int] = {}
    with c.ZoneServerProcess() as server:
        server_proc = psutil.Process(server.pid)
        coordinator = GrpcZoneClient(server.endpoint)
        coordinator.wait_ready()
        clients = {chunk: GrpcZoneClient(server.endpoint, chunk_bytes=chunk) for chunk in CHUNKS}
        round_no = 0

        def one_round(cfg: tuple[tuple[int, int], int], record: bool) -> None:
            nonlocal round_no
            tile, chunk = cfg
            plan, shards, client = plans[tile], shard_sets[tile], clients[chunk]
            round_no += 1
            spec = c.round_spec(round_no, plan, ["site-0"])
            coordinator.open_round(spec)
            t0 = time.perf_counter()
            manifest = c.make_manifest(plan, shards, site_id="site-0", round=round_no, weight=3.0)
            t_manifest = time.perf_counter() - t0
            srv0, cli0 = sum(server_proc.cpu_times()[:2]), time.process_time()
            fs0, fc0 = c.minor_faults(server.pid), c.minor_faults()
            t1 = time.perf_counter()
            receipt = client.push(manifest, spec.token, shards)
            t2 = time.perf_counter()
            srv1, cli1 = sum(server_proc.cpu_times()[:2]), time.process_time()
            fs1, fc1 = c.minor_faults(server.pid), c.minor_faults()
            assert receipt.bytes == nbytes, receipt
            t_close0 = time.perf_counter()
            coordinator.close_round(round_no)
            t3 = time.perf_counter()
            summary, agg = client.fetch_aggregate(round_no)
            t4 = time.perf_counter()
            assert len(agg) == len(shards) and summary.sites == ("site-0",)
            del agg
            if record:
                r = results[cfg]
                r["manifest"].append(t_manifest)
                r["push"].append(t2 - t1)
                r["close"].append(t3 - t_close0)
                r["fetch"].append(t4 - t3)
                r["srv_cpu"].append(srv1 - srv0)
                r["cli_cpu"].append(cli1 - cli0)
                r["srv_flt"].append(fs1 - fs0)
                r["cli_flt"].append(fc1 - fc0)

        for cfg in configs:
            one_round(cfg, record=False)
        for rep in range(runs):
            for cfg in c.rotated(configs, rep):
                one_round(cfg, record=True)
            print(f"  run {rep + 1}/{runs} done", flush=True)
        for cfg in configs:
            tile, chunk = cfg
            frames_per_push[cfg] = sum(-(-a.nbytes // chunk) for a in shard_sets[tile].values())
        for cl in [coordinator, *clients.values()]:
            cl.close()

    headers = [
        "shards",
        "chunk",
        "frames/push",
        "push MB/s (min-max)",
        "push s",
        "server CPU s/push",
        "client CPU s/push",
        "page faults/push server / client",
        "manifest s",
        "close s",
        "fetch MB/s (min-max)",
    ]
    rows = []
    best: tuple[float, str] = (0.0, "")
    for cfg in configs:
        tile, chunk = cfg
        r = {k: c.Stat(v) for k, v in results[cfg].items()}
        push_mbs = nbytes / r["push"].median / c.MB
        fetch_mbs = nbytes / r["fetch"].median / c.MB
        shard_bytes = tile[0] * tile[1] * 4
        label = f"{tile[0]}x{tile[1]} ({_size(shard_bytes)})"
        if push_mbs > best[0]:
            best = (push_mbs, f"{label} shards, {_size(chunk)} chunks")
        rows.append(
            [
                label,
                _size(chunk),
                str(frames_per_push[cfg] + 1),
                f"{push_mbs:,.0f} ({nbytes / r['push'].max / c.MB:,.0f}-{nbytes / r['push'].min / c.MB:,.0f})",
                f"{r['push'].median:.3f}",
                f"{r['srv_cpu'].median:.2f}",
                f"{r['cli_cpu'].median:.2f}",
                f"{r['srv_flt'].median:,.0f} / {r['cli_flt'].median:,.0f}",
                f"{r['manifest'].median:.3f}",
                f"{r['close'].median:.3f}",
                f"{fetch_mbs:,.0f} ({nbytes / r['fetch'].max / c.MB:,.0f}-{nbytes / r['fetch'].min / c.MB:,.0f})",
            ]
        )
    c.print_table(f"gRPC upload/download, {nbytes / c.MB:.1f} MB update, median of {runs}", headers, rows)

    all_manifest = c.Stat([x for cfg in configs for x in results[cfg]["manifest"]])

    def med(cfg: tuple[tuple[int, int], int], key: str) -> float:
        return c.Stat(results[cfg][key]).median

    def mbs(cfg: tuple[tuple[int, int], int]) -> float:
        return nbytes / med(cfg, "push") / c.MB

    srv_share = [med(cfg, "srv_cpu") / med(cfg, "push") for cfg in configs]
    cli_share = [med(cfg, "cli_cpu") / med(cfg, "push") for cfg in configs]
    small = [cfg for cfg in configs if cfg[0] == (256, 256)]
    small_rates = [mbs(cfg) for cfg in small]
    big1, big4 = ((1024, 1024), 1 << 20), ((1024, 1024), 4 << 20)
    sentences = [
        f"Best push throughput: {best[0]:,.0f} MB/s ({best[1]}).",
        f"With 256 KiB shards all three chunk sizes send identical frames (a chunk never spans shards), so their "
        f"spread ({min(small_rates):,.0f}-{max(small_rates):,.0f} MB/s) is the run-to-run noise of this shared "
        "machine; differences smaller than that are not significant.",
        f"Building the manifest (SHA-256 of every shard) takes {all_manifest.median:.3f} s "
        f"({nbytes / all_manifest.median / c.MB:,.0f} MB/s, median of all {all_manifest.n} rounds) before a push "
        "can start; it is not part of push MB/s.",
        f"During a push the zone process is busy for {min(srv_share):.0%}-{max(srv_share):.0%} of the wall time "
        f"and the client process for {min(cli_share):.0%}-{max(cli_share):.0%} (CPU seconds / push seconds; "
        "the zone parses, hashes, checks and stages every frame in one handler thread and folds at commit, the "
        "client copies every chunk twice).",
        "Neither process saturates a core, so part of the push time is waiting: per-message hand-offs between "
        "gRPC's threads and the Python handler, flow control, and the other work on this shared machine."
        if max(srv_share + cli_share) < 0.8
        else "The busier process is close to a full core, so it bounds the push rate (and both share 2 cores).",
    ]
    f1, f4 = med(big1, "cli_flt"), med(big4, "cli_flt")
    if f4 > 10 * max(f1, 1.0):
        sentences.append(
            f"4 MiB chunks are slower than 1 MiB ones with 4 MiB shards ({mbs(big4):,.0f} vs {mbs(big1):,.0f} "
            f"MB/s; client CPU {med(big4, 'cli_cpu'):.2f} vs {med(big1, 'cli_cpu'):.2f} s): the client takes "
            f"{f4:,.0f} minor page faults per push against {f1:,.0f}, because `convert.chunks` copies every chunk "
            "into a new bytes object and protobuf serialises it into another, and at 4 MiB these buffers come "
            "fresh from mmap each time (page faults are expensive in this VM). The default 1 MiB is the better "
            "choice."
        )
    sentences.append(
        "`fetch` serves the latest aggregate from the zone's memory, in 1 MiB chunks (the server's default, "
        "whatever the client's chunk size), and includes the client's digest and Merkle-root checks."
    )
    interp = " ".join(sentences)
    print("\n" + interp)

    c.publish(
        args,
        SECTION,
        "Upload and download throughput over gRPC (loopback)",
        f"{runs} timed rounds per configuration after 1 warm-up round each; configurations "
        "interleaved, order rotated per run; medians with min-max",
        desc,
        notes=[
            f"- Update: {n:,} float32 values ({nbytes / c.MB:.1f} MB; MB = 10^6 bytes of float32 shard data), "
            "one site, weight 3. Zone server in a separate process on 127.0.0.1 (default staging budget "
            "256 MB, 16 worker threads). A new round per push.",
            "- `push` = `GrpcZoneClient.push` (manifest built beforehand, not timed in it); `manifest` = "
            "`build_manifest` (digests); `close` = `close_round` (finalize, digests, publish); `fetch` = "
            "`fetch_aggregate` download + verification; CPU columns = user+sys CPU seconds of each process "
            "during the push.",
        ],
        headers=headers,
        rows=rows,
        interpretation=interp,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
