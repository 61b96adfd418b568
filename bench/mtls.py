"""Push and fetch throughput over the gRPC zone data plane: mutual TLS against plain text.

A throwaway federation PKI is made in a temporary folder with ``fedshard.crypto.pki``
(``init_ca``; ``issue_zone`` for the zone, hosts 127.0.0.1 and localhost; ``issue_site``
for the site). Two zone servers run, each in its own process on 127.0.0.1
(``_common.ZoneServerProcess``, ``tls=`` for the second): one plain text
(``serve(zone, addr)``), one requiring mutual TLS (``serve(zone, addr, tls=TlsFiles(...))``; it also checks on every
push that the caller's certificate names the manifest's site). Each client
(``GrpcZoneClient(endpoint, tls=...)``) keeps one channel open, so the TLS handshake
is paid once, in the warm-up.

Every repetition runs one round on each server, in an order rotated per repetition:
``open_round``, build the manifest (not timed in the push), ``push`` the same ~100 MB
update (25 M+ float32 values, tile 256x256, 1 MiB chunks), ``close_round``,
``fetch_aggregate`` (download + digest and Merkle-root checks). A new connection
(channel, handshake, one ``Info`` call, on its own subchannel) is timed separately.

    .venv/bin/python bench/mtls.py [--quick] [--runs N] [--values N] [--output FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.crypto.pki import init_ca, issue_site, issue_zone
from fedshard.crypto.tls import TlsFiles
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.convert import GRPC_OPTIONS

SECTION = "mtls"
SITE = "site-0"
PLAIN, MTLS = "plain text", "mutual TLS"
CONFIGS = [PLAIN, MTLS]
TILE = (256, 256)


def make_pki(root: Path) -> tuple[TlsFiles, TlsFiles]:
    """A throwaway federation PKI under ``root``: ``(zone TLS files, site TLS files)``."""
    ca = init_ca(root / "ca", "bench CA")
    zone = issue_zone(root / "ca", c.ZONE, "EU", root / "zones", hosts=("127.0.0.1", "localhost"))
    site = issue_site(root / "ca", SITE, "EU", root / "sites")
    return TlsFiles(zone.cert, zone.key, ca.cert), TlsFiles(site.cert, site.key, ca.cert)


def connect_once(endpoint: str, tls: TlsFiles | None) -> float:
    """Seconds for a new channel on its own subchannel (TCP, and TLS handshake) plus one ``Info`` call."""
    options = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    t0 = time.perf_counter()
    if tls is None:
        channel = grpc.insecure_channel(endpoint, options=options)
    else:
        channel = grpc.secure_channel(endpoint, tls.channel(), options=options)
    try:
        stub = pb_grpc.ZoneStub(channel)  # type: ignore[no-untyped-call]
        stub.Info(pb.InfoRequest(), timeout=30, wait_for_ready=True)
        return time.perf_counter() - t0
    finally:
        channel.close()


def _noise_note(push_lo: float, push_hi: float, fetch_lo: float, fetch_hi: float) -> str:
    """A sentence naming the ratios whose per-run range straddles 100 % (not told apart from noise)."""
    noisy = [name for name, lo, hi in (("push", push_lo, push_hi), ("fetch", fetch_lo, fetch_hi)) if lo <= 1 <= hi]
    if not noisy:
        return " In every run mTLS was the slower of the pair, for push and for fetch."
    return (
        f" For {' and '.join(noisy)} the per-run ratios straddle 100 % (some runs were faster with mTLS): "
        "the run-to-run noise of this shared machine is as large as the effect, so the ratio of the medians is "
        "the estimate and the bracketed range its uncertainty."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument(
        "--runs", type=int, default=None, help="timed rounds per configuration (default 25; 5 with --quick)"
    )
    parser.add_argument("--values", type=int, default=None, help="float32 values in the update (default 25 M)")
    args = parser.parse_args(argv)
    runs = args.runs or (5 if args.quick else 25)
    target = args.values or (1_000_000 if args.quick else 25_000_000)

    desc = c.machine_description()
    ticks0 = c.cpu_ticks()
    update = c.synthetic_update(target)
    plan = c.make_plan(update, TILE)
    shards = plan.split(update)
    n, nbytes = c.num_values(update), c.num_bytes(update)
    del update
    print(f"update: {n:,} float32 values ({nbytes / c.MB:.1f} MB); {runs} runs + 1 warm-up per config", flush=True)

    keys = ("manifest", "push", "close", "fetch", "connect", "srv_cpu", "cli_cpu")
    results: dict[str, dict[str, list[float]]] = {cfg: {k: [] for k in keys} for cfg in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="fedshard-bench-pki-") as tmp:
        zone_tls, site_tls = make_pki(Path(tmp))
        with c.ZoneServerProcess() as plain_server, c.ZoneServerProcess(tls=zone_tls) as tls_server:
            servers = {PLAIN: plain_server, MTLS: tls_server}
            client_tls = {PLAIN: None, MTLS: site_tls}
            procs = {cfg: psutil.Process(srv.pid) for cfg, srv in servers.items()}
            # The coordinator opens and closes rounds; with mTLS it needs a CA-signed
            # certificate too (the zone checks the caller's identity on pushes only).
            coordinators = {cfg: GrpcZoneClient(servers[cfg].endpoint, tls=client_tls[cfg]) for cfg in CONFIGS}
            clients = {cfg: GrpcZoneClient(servers[cfg].endpoint, tls=client_tls[cfg]) for cfg in CONFIGS}
            for cl in [*coordinators.values(), *clients.values()]:
                cl.wait_ready()
            round_no = {cfg: 0 for cfg in CONFIGS}

            def one_round(cfg: str, record: bool) -> None:
                round_no[cfg] += 1
                rnd = round_no[cfg]
                coordinator, client, server_proc = coordinators[cfg], clients[cfg], procs[cfg]
                spec = c.round_spec(rnd, plan, [SITE])
                coordinator.open_round(spec)
                t0 = time.perf_counter()
                manifest = c.make_manifest(plan, shards, site_id=SITE, round=rnd, weight=3.0)
                t_manifest = time.perf_counter() - t0
                srv0, cli0 = sum(server_proc.cpu_times()[:2]), time.process_time()
                t1 = time.perf_counter()
                receipt = client.push(manifest, spec.token, shards)
                t2 = time.perf_counter()
                srv1, cli1 = sum(server_proc.cpu_times()[:2]), time.process_time()
                assert receipt.bytes == nbytes, receipt
                coordinator.close_round(rnd)
                t3 = time.perf_counter()
                summary, agg = client.fetch_aggregate(rnd)
                t4 = time.perf_counter()
                assert len(agg) == len(shards) and summary.sites == (SITE,)
                del agg
                t_connect = connect_once(servers[cfg].endpoint, client_tls[cfg])
                if record:
                    r = results[cfg]
                    r["manifest"].append(t_manifest)
                    r["push"].append(t2 - t1)
                    r["close"].append(t3 - t2)
                    r["fetch"].append(t4 - t3)
                    r["connect"].append(t_connect)
                    r["srv_cpu"].append(srv1 - srv0)
                    r["cli_cpu"].append(cli1 - cli0)

            for cfg in CONFIGS:
                one_round(cfg, record=False)
            for rep in range(runs):
                for cfg in c.rotated(CONFIGS, rep):
                    one_round(cfg, record=True)
                print(f"  run {rep + 1}/{runs} done", flush=True)
            for cl in [*coordinators.values(), *clients.values()]:
                cl.close()

    def stat(cfg: str, key: str) -> c.Stat:
        return c.Stat(results[cfg][key])

    def rate(seconds: float) -> float:
        return nbytes / seconds / c.MB

    def rates(cfg: str, key: str) -> str:
        st = stat(cfg, key)
        return f"{rate(st.median):,.0f} ({rate(st.max):,.0f}-{rate(st.min):,.0f})"

    def paired(key: str) -> tuple[float, float, float]:
        """mTLS / plain throughput: ratio of medians, and min-max of the per-run ratios."""
        per_run = [p / t for p, t in zip(results[PLAIN][key], results[MTLS][key], strict=True)]
        return stat(PLAIN, key).median / stat(MTLS, key).median, min(per_run), max(per_run)

    headers = [
        "data plane",
        "push MB/s (min-max)",
        "push s",
        "server CPU s/push",
        "client CPU s/push",
        "fetch MB/s (min-max)",
        "fetch s",
        "close s",
        "manifest s",
        "new connection ms",
    ]
    rows = [
        [
            cfg,
            rates(cfg, "push"),
            f"{stat(cfg, 'push').median:.3f}",
            f"{stat(cfg, 'srv_cpu').median:.2f}",
            f"{stat(cfg, 'cli_cpu').median:.2f}",
            rates(cfg, "fetch"),
            f"{stat(cfg, 'fetch').median:.3f}",
            f"{stat(cfg, 'close').median:.3f}",
            f"{stat(cfg, 'manifest').median:.3f}",
            f"{stat(cfg, 'connect').median * 1e3:,.1f}",
        ]
        for cfg in CONFIGS
    ]
    push_r, push_lo, push_hi = paired("push")
    fetch_r, fetch_lo, fetch_hi = paired("fetch")
    rows.append(
        [
            "mTLS / plain",
            f"{push_r:.0%} ({push_lo:.0%}-{push_hi:.0%})",
            "",
            f"{stat(MTLS, 'srv_cpu').median / stat(PLAIN, 'srv_cpu').median:.2f}x",
            f"{stat(MTLS, 'cli_cpu').median / stat(PLAIN, 'cli_cpu').median:.2f}x",
            f"{fetch_r:.0%} ({fetch_lo:.0%}-{fetch_hi:.0%})",
            "",
            "",
            "",
            f"{stat(MTLS, 'connect').median / stat(PLAIN, 'connect').median:.1f}x",
        ]
    )
    c.print_table(
        f"gRPC data plane, mTLS vs plain text, {nbytes / c.MB:.1f} MB update, median of {runs}", headers, rows
    )

    extra_srv = stat(MTLS, "srv_cpu").median - stat(PLAIN, "srv_cpu").median
    extra_cli = stat(MTLS, "cli_cpu").median - stat(PLAIN, "cli_cpu").median
    sentences = [
        f"With mutual TLS a push runs at {push_r:.0%} of the plain-text throughput "
        f"({rate(stat(MTLS, 'push').median):,.0f} vs {rate(stat(PLAIN, 'push').median):,.0f} MB/s; per-run "
        f"paired ratios {push_lo:.0%}-{push_hi:.0%}) and `fetch_aggregate` at {fetch_r:.0%} "
        f"({rate(stat(MTLS, 'fetch').median):,.0f} vs {rate(stat(PLAIN, 'fetch').median):,.0f} MB/s; "
        f"{fetch_lo:.0%}-{fetch_hi:.0%})." + _noise_note(push_lo, push_hi, fetch_lo, fetch_hi),
        f"CPU seconds per {nbytes / c.MB:.0f} MB push, mTLS minus plain text (differences of medians): zone "
        f"{extra_srv:+.3f} s, client {extra_cli:+.3f} s, for encrypting and authenticating every byte in gRPC's "
        "TLS stack (BoringSSL, TLS records of at most 16 KiB).",
        f"A new connection (TCP, the TLS handshake in which both sides verify the other's CA-signed certificate, "
        f"one `Info` call) takes {stat(MTLS, 'connect').median * 1e3:,.1f} ms with mTLS against "
        f"{stat(PLAIN, 'connect').median * 1e3:,.1f} ms in plain text; a site keeps its channel for the whole "
        "run, so this is paid once, not per push.",
        "Both configurations ran in the same run, interleaved, on the same update, with the client and the two "
        "zone processes sharing this machine's cores; the ranges in brackets show the run-to-run noise.",
    ]
    interp = " ".join(sentences)
    print("\n" + interp)

    c.publish(
        args,
        SECTION,
        "Data-plane throughput with mutual TLS vs plain text (gRPC, loopback)",
        f"{runs} timed rounds per configuration after 1 warm-up round each; configurations interleaved, order "
        "rotated per run; medians with min-max; ratios of medians with the min-max of the per-run paired ratios",
        desc,
        notes=[
            f"- Update: {n:,} float32 values ({nbytes / c.MB:.1f} MB; MB = 10^6 bytes of float32 shard data), "
            f"{len(shards):,} shards (tile {TILE[0]}x{TILE[1]}, 256 KiB each), 1 MiB chunks, one site, weight 3. "
            "Two zone servers, each in its own process on 127.0.0.1 (default staging budget 256 MB, 16 worker "
            "threads): one plain text, one requiring mutual TLS with certificates from a throwaway federation PKI "
            "(ECDSA P-256, `fedshard.crypto.pki`). A new round per push; channels stay open between rounds.",
            "- `push` = `GrpcZoneClient.push` (manifest built beforehand: `manifest`); `close` = `close_round`; "
            "`fetch` = `fetch_aggregate` download + verification; CPU columns = user+sys CPU seconds of each "
            "process during the push; `new connection` = a fresh channel on its own subchannel until one `Info` "
            "call returns.",
            c.steal_note(ticks0),
        ],
        headers=headers,
        rows=rows,
        interpretation=interp,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
