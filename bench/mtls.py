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
``fetch`` (download + digest and Merkle-root checks). A new connection
(channel, handshake, one ``Info`` call, on its own subchannel) is timed separately.

    .venv/bin/python bench/mtls.py [--quick] [--json] [--runs N] [--values N] [--output FILE]

``--json`` prints ``push_tls_vs_plain``, ``fetch_tls_vs_plain`` (mTLS / plain-text throughput, ratios
of medians), ``push_mb_s``, ``fetch_mb_s`` and ``connect_ms`` (each as ``{"plain": …, "mtls": …}``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from fedshard.crypto.pki import init_ca, issue_coordinator, issue_site, issue_zone
from fedshard.crypto.tls import TlsFiles
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.convert import GRPC_OPTIONS

SECTION = "mtls"
SITE = "site-0"
PLAIN, MTLS = "plain text", "mutual TLS"
CONFIGS = [PLAIN, MTLS]
JSON_KEYS = {PLAIN: "plain", MTLS: "mtls"}  # the configurations in --json
TILE = (256, 256)


def make_pki(root: Path) -> tuple[TlsFiles, TlsFiles, TlsFiles]:
    """A throwaway federation PKI under ``root``: ``(zone, site, coordinator TLS files)``."""
    ca = init_ca(root / "ca", "bench CA")
    zone = issue_zone(root / "ca", c.ZONE, "EU", root / "zones", hosts=("127.0.0.1", "localhost"))
    site = issue_site(root / "ca", SITE, "EU", root / "sites")
    lead = issue_coordinator(root / "ca", "EU", root / "coordinator")
    zone_tls, site_tls, lead_tls = (TlsFiles(p.cert, p.key, ca.cert) for p in (zone, site, lead))
    return zone_tls, site_tls, lead_tls


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument(
        "--runs", type=int, default=None, help="timed rounds per configuration (default 25; 5 with --quick)"
    )
    parser.add_argument("--values", type=int, default=None, help="float32 values in the update (default 25 M)")
    return parser.parse_args(argv)


Results = dict[str, dict[str, list[float]]]  # configuration -> measure -> one value per run


def measure(plan: Any, shards: dict[str, np.ndarray], runs: int) -> Results:
    """Rounds on a plain-text and an mTLS zone server, interleaved (one warm-up round each first)."""
    keys = (*c.PUSH_ROUND_KEYS, "connect")
    results: Results = {cfg: {k: [] for k in keys} for cfg in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="fedshard-bench-pki-") as tmp:
        zone_tls, site_tls, lead_tls = make_pki(Path(tmp))
        with c.ZoneServerProcess() as plain_server, c.ZoneServerProcess(tls=zone_tls) as tls_server:
            servers = {PLAIN: plain_server, MTLS: tls_server}
            client_tls = {PLAIN: None, MTLS: site_tls}
            procs = {cfg: psutil.Process(srv.pid) for cfg, srv in servers.items()}
            # The coordinator opens and closes rounds; with mTLS only its own certificate may.
            lead_files = {PLAIN: None, MTLS: lead_tls}
            coordinators = {cfg: GrpcZoneClient(servers[cfg].endpoint, tls=lead_files[cfg]) for cfg in CONFIGS}
            clients = {cfg: GrpcZoneClient(servers[cfg].endpoint, tls=client_tls[cfg]) for cfg in CONFIGS}
            for cl in [*coordinators.values(), *clients.values()]:
                cl.wait_ready()
            round_no = {cfg: 0 for cfg in CONFIGS}

            def one_round(cfg: str, record: bool) -> None:
                round_no[cfg] += 1
                times = c.push_round(coordinators[cfg], clients[cfg], procs[cfg], plan, shards, round_no[cfg], SITE)
                times["connect"] = connect_once(servers[cfg].endpoint, client_tls[cfg])
                if record:
                    for key, value in times.items():
                        results[cfg][key].append(value)

            for cfg in CONFIGS:
                one_round(cfg, record=False)
            for rep in range(runs):
                for cfg in c.rotated(CONFIGS, rep):
                    one_round(cfg, record=True)
                print(f"  run {rep + 1}/{runs} done", flush=True)
            for cl in [*coordinators.values(), *clients.values()]:
                cl.close()
    return results


class Figures:
    """The measured figures of ``results`` for an update of ``nbytes`` bytes."""

    def __init__(self, results: Results, nbytes: int) -> None:
        self.results = results
        self.nbytes = nbytes

    def stat(self, cfg: str, key: str) -> c.Stat:
        """All runs of ``key`` in configuration ``cfg``."""
        return c.Stat(self.results[cfg][key])

    def rate(self, seconds: float) -> float:
        """MB/s of the update moved in ``seconds``."""
        return self.nbytes / seconds / c.MB

    def rates(self, cfg: str, key: str) -> str:
        """Median MB/s with the min-max over runs."""
        st = self.stat(cfg, key)
        return f"{self.rate(st.median):,.0f} ({self.rate(st.max):,.0f}-{self.rate(st.min):,.0f})"

    def paired(self, key: str) -> tuple[float, float, float]:
        """mTLS / plain throughput: ratio of medians, and min-max of the per-run ratios."""
        per_run = [p / t for p, t in zip(self.results[PLAIN][key], self.results[MTLS][key], strict=True)]
        return self.stat(PLAIN, key).median / self.stat(MTLS, key).median, min(per_run), max(per_run)


HEADERS = [
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


def table(f: Figures) -> list[list[str]]:
    """One row per data plane, then the mTLS / plain ratios."""
    rows = [
        [
            cfg,
            f.rates(cfg, "push"),
            f"{f.stat(cfg, 'push').median:.3f}",
            f"{f.stat(cfg, 'srv_cpu').median:.2f}",
            f"{f.stat(cfg, 'cli_cpu').median:.2f}",
            f.rates(cfg, "fetch"),
            f"{f.stat(cfg, 'fetch').median:.3f}",
            f"{f.stat(cfg, 'close').median:.3f}",
            f"{f.stat(cfg, 'manifest').median:.3f}",
            f"{f.stat(cfg, 'connect').median * 1e3:,.1f}",
        ]
        for cfg in CONFIGS
    ]
    push_r, push_lo, push_hi = f.paired("push")
    fetch_r, fetch_lo, fetch_hi = f.paired("fetch")
    rows.append(
        [
            "mTLS / plain",
            f"{push_r:.0%} ({push_lo:.0%}-{push_hi:.0%})",
            "",
            _times(f.stat(MTLS, "srv_cpu").median, f.stat(PLAIN, "srv_cpu").median),
            _times(f.stat(MTLS, "cli_cpu").median, f.stat(PLAIN, "cli_cpu").median),
            f"{fetch_r:.0%} ({fetch_lo:.0%}-{fetch_hi:.0%})",
            "",
            "",
            "",
            f"{f.stat(MTLS, 'connect').median / f.stat(PLAIN, 'connect').median:.1f}x",
        ]
    )
    return rows


def _times(a: float, b: float) -> str:
    """``a / b`` as "1.23x"; "n/a" when ``b`` is 0 (CPU times are counted in clock ticks:
    a ``--quick`` push can take less than one)."""
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def interpretation(f: Figures) -> str:
    """What the figures say, in words."""
    push_r, push_lo, push_hi = f.paired("push")
    fetch_r, fetch_lo, fetch_hi = f.paired("fetch")
    extra_srv = f.stat(MTLS, "srv_cpu").median - f.stat(PLAIN, "srv_cpu").median
    extra_cli = f.stat(MTLS, "cli_cpu").median - f.stat(PLAIN, "cli_cpu").median
    sentences = [
        f"With mutual TLS a push runs at {push_r:.0%} of the plain-text throughput "
        f"({f.rate(f.stat(MTLS, 'push').median):,.0f} vs {f.rate(f.stat(PLAIN, 'push').median):,.0f} MB/s; per-run "
        f"paired ratios {push_lo:.0%}-{push_hi:.0%}) and `fetch` at {fetch_r:.0%} "
        f"({f.rate(f.stat(MTLS, 'fetch').median):,.0f} vs {f.rate(f.stat(PLAIN, 'fetch').median):,.0f} MB/s; "
        f"{fetch_lo:.0%}-{fetch_hi:.0%})." + _noise_note(push_lo, push_hi, fetch_lo, fetch_hi),
        f"CPU seconds per {f.nbytes / c.MB:.0f} MB push, mTLS minus plain text (differences of medians): zone "
        f"{extra_srv:+.3f} s, client {extra_cli:+.3f} s, for encrypting and authenticating every byte in gRPC's "
        "TLS stack (BoringSSL, TLS records of at most 16 KiB).",
        f"A new connection (TCP, the TLS handshake in which both sides verify the other's CA-signed certificate, "
        f"one `Info` call) takes {f.stat(MTLS, 'connect').median * 1e3:,.1f} ms with mTLS against "
        f"{f.stat(PLAIN, 'connect').median * 1e3:,.1f} ms in plain text; a site keeps its channel for the whole "
        "run, so this is paid once, not per push.",
        "Both configurations ran in the same run, interleaved, on the same update, with the client and the two "
        "zone processes sharing this machine's cores; the ranges in brackets show the run-to-run noise.",
    ]
    return " ".join(sentences)


def headline(f: Figures) -> dict[str, Any]:
    """The ``--json`` figures (medians)."""
    return {
        "push_tls_vs_plain": f.paired("push")[0],
        "fetch_tls_vs_plain": f.paired("fetch")[0],
        "push_mb_s": {JSON_KEYS[cfg]: f.rate(f.stat(cfg, "push").median) for cfg in CONFIGS},
        "fetch_mb_s": {JSON_KEYS[cfg]: f.rate(f.stat(cfg, "fetch").median) for cfg in CONFIGS},
        "connect_ms": {JSON_KEYS[cfg]: f.stat(cfg, "connect").median * 1e3 for cfg in CONFIGS},
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, then publish (see the module docstring)."""
    args = parse_args(argv)
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
    figures = Figures(measure(plan, shards, runs), nbytes)
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
            "`fetch` = `fetch` download + verification; CPU columns = user+sys CPU seconds of each "
            "process during the push; `new connection` = a fresh channel on its own subchannel until one `Info` "
            "call returns.",
            c.steal_note(ticks0),
        ],
        headers=HEADERS,
        rows=table(figures),
        interpretation=interpretation(figures),
        headline=headline(figures),
        console_title=f"gRPC data plane, mTLS vs plain text, {nbytes / c.MB:.1f} MB update, median of {runs}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
