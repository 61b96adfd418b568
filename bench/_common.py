"""Shared helpers of the fedshard benchmarks (not a benchmark itself).

* timing (``time.perf_counter``), medians and spreads of repeated runs;
* a description of the machine the numbers come from;
* a synthetic model update of a given number of float32 values, its shard plan,
  manifests and round specs;
* a zone server in a separate process (``ZoneServerProcess``), so that a benchmark's
  client and the zone do not share a GIL;
* one round of a single site through a zone's gRPC data plane (:func:`push_round`);
* CPU accounting of the machine (other load, hypervisor steal);
* publishing (re-exported from :mod:`_publish`, the one helper that prints the table,
  writes a section of ``BENCHMARKS.md`` and the ``--json`` line).

Run as ``python bench/_common.py serve --staging-bytes N`` it is the zone server used by
``ZoneServerProcess``: it prints ``PORT <n> PID <pid>`` and serves until its stdin closes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _publish import (  # re-exported: every benchmark reaches them as _common's
    BENCHMARKS_MD,
    MD_HEADER,
    REPO,
    add_output_args,
    command_line,
    headline_json,
    machine_description,
    machine_line,
    markdown_table,
    output_path,
    print_table,
    publish,
    section_header,
    write_section,
)

__all__ = [
    "BASE_VERSION",
    "BENCHMARKS_MD",
    "MB",
    "MD_HEADER",
    "REPO",
    "ZONE",
    "MiB",
    "Stat",
    "ZoneServerProcess",
    "add_output_args",
    "command_line",
    "cpu_ticks",
    "fmt",
    "headline_json",
    "machine_busy_seconds",
    "machine_description",
    "machine_line",
    "make_manifest",
    "make_plan",
    "manifest_for_site",
    "markdown_table",
    "median_of",
    "minor_faults",
    "num_bytes",
    "num_values",
    "output_path",
    "print_table",
    "publish",
    "PUSH_ROUND_KEYS",
    "push_round",
    "rotated",
    "save_json",
    "round_spec",
    "section_header",
    "status_bytes",
    "steal_note",
    "synthetic_update",
    "timed",
    "write_section",
]

MB = 1e6  # throughputs are in decimal MB/GB (10^6 / 10^9 bytes)
MiB = 1 << 20


# results kept between runs ------------------------------------------------------------
def save_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` whole or not at all (a bench killed mid-write keeps the
    previous file: its cache of finished runs holds hours of work)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


# timing --------------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` took (``time.perf_counter``)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclasses.dataclass
class Stat:
    """Median and spread of repeated measurements."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def n(self) -> int:
        return len(self.values)


def median_of(fn: Callable[[], Any], runs: int = 5, warmup: int = 1) -> Stat:
    """Time ``fn`` ``runs`` times (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        fn()
    return Stat([timed(fn) for _ in range(runs)])


def rotated(items: Sequence[Any], rep: int) -> list[Any]:
    """``items`` rotated by ``rep``: interleaved runs do not always go in the same order."""
    k = rep % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


# machine ----------------------------------------------------------------------------------
def status_bytes(field: str, pid: int | str = "self") -> int:
    """A size field of ``/proc/PID/status`` in bytes (``VmHWM``: the process's peak RSS; 0 if unavailable).

    Prefer ``VmHWM`` to ``getrusage``'s ``ru_maxrss`` for a child process: Linux carries a
    parent's peak RSS into a child it forks and execs, so a small child of a large parent
    reports the parent's peak there.
    """
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    return 0


def minor_faults(pid: int | None = None) -> int:
    """Minor page faults of process ``pid`` (this process by default) so far, from /proc (0 if unavailable)."""
    try:
        stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[7])


# synthetic model update -------------------------------------------------------------------
def synthetic_update(num_values: int, width: int = 1024, seed: int = 0) -> dict[str, np.ndarray]:
    """A float32 model update of at least ``num_values`` values (rounded up to whole layers).

    Layers are ``width x width`` weight matrices plus ``width`` biases, like a stack of
    linear layers; values are standard normal (finite).
    """
    per_layer = width * width + width
    layers = max(1, math.ceil(num_values / per_layer))
    rng = np.random.default_rng(seed)
    update: dict[str, np.ndarray] = {}
    for i in range(layers):
        update[f"layer{i}.weight"] = rng.standard_normal((width, width), dtype=np.float32)
        update[f"layer{i}.bias"] = rng.standard_normal(width, dtype=np.float32)
    return update


def num_values(arrays: dict[str, np.ndarray]) -> int:
    """Values in all of ``arrays``."""
    return sum(int(a.size) for a in arrays.values())


def num_bytes(arrays: dict[str, np.ndarray]) -> int:
    """Bytes of all of ``arrays``."""
    return sum(int(a.nbytes) for a in arrays.values())


def make_plan(update: dict[str, np.ndarray], tile: tuple[int, int] = (256, 256)) -> Any:
    """The ``ShardPlan`` of ``update`` for ``tile``."""
    from fedshard.sharding import ShardPlan

    return ShardPlan.from_state_dict(update, tile)


ZONE = "bench-zone"
BASE_VERSION = "0" * 64


def make_manifest(plan: Any, shards: dict[str, np.ndarray], *, site_id: str, round: int, weight: float = 1.0) -> Any:
    """``build_manifest`` for ``shards`` (digests every shard)."""
    from fedshard.integrity import build_manifest

    return build_manifest(
        site_id=site_id,
        round=round,
        plan_digest=plan.digest,
        base_version=BASE_VERSION,
        zone=ZONE,
        weight=weight,
        shards=shards,
    )


def manifest_for_site(manifest: Any, site_id: str, round: int | None = None) -> Any:
    """The same manifest for another site (and round): digests do not depend on either."""
    changes: dict[str, Any] = {"site_id": site_id}
    if round is not None:
        changes["round"] = round
    return dataclasses.replace(manifest, **changes)


SITE_WEIGHT = 3.0
"""The weight every bench site's round fixes for it (and its manifests carry)."""


def round_spec(round: int, plan: Any, sites: Sequence[str], weight: float = SITE_WEIGHT) -> Any:
    """The ``RoundSpec`` of round ``round`` of ``plan`` with ``sites`` selected, each fixed at ``weight``."""
    from fedshard.protocol.rounds import RoundSpec

    weights = tuple((site, weight) for site in sites)
    return RoundSpec(round, f"token-{round}", plan.to_json(), BASE_VERSION, tuple(sites), weights=weights)


# zone server in its own process ----------------------------------------------------------------
class ZoneServerProcess:
    """A zone gRPC server on 127.0.0.1 in a child process (no shared GIL with the client);
    with ``tls`` (a ``fedshard.crypto.tls.TlsFiles``) it requires mutual TLS."""

    def __init__(
        self,
        staging_bytes: int = 256 << 20,
        max_workers: int = 16,
        env: dict[str, str] | None = None,
        tls: Any = None,
    ) -> None:
        self.staging_bytes = staging_bytes
        self.max_workers = max_workers
        self.extra_env = dict(env or {})
        self.tls = tls
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.pid = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> ZoneServerProcess:
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONUNBUFFERED="1", **self.extra_env)
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "serve",
            "--staging-bytes",
            str(self.staging_bytes),
            "--max-workers",
            str(self.max_workers),
        ]
        if self.tls is not None:
            argv += ["--cert", str(self.tls.cert), "--key", str(self.tls.key), "--ca", str(self.tls.ca)]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.match(r"PORT (\d+) PID (\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"zone server did not start: {line!r}")
        self.port, self.pid = int(m.group(1)), int(m.group(2))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _serve_forever(staging_bytes: int, max_workers: int, tls: Any = None) -> None:
    from fedshard.zone.aggregator import ZoneAggregator
    from fedshard.zone.rpc.service import serve

    zone = ZoneAggregator(ZONE, "bench", staging_bytes=staging_bytes)
    server, port = serve(zone, "127.0.0.1:0", max_workers=max_workers, tls=tls)
    print(f"PORT {port} PID {os.getpid()}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(grace=None)


# one site's round through the gRPC data plane ---------------------------------------------------
PUSH_ROUND_KEYS = ("manifest", "push", "close", "fetch", "srv_cpu", "cli_cpu", "srv_flt", "cli_flt")


def push_round(
    coordinator: Any,
    client: Any,
    server_proc: Any,
    plan: Any,
    shards: dict[str, np.ndarray],
    round_no: int,
    site: str,
) -> dict[str, float]:
    """One round of one site on a zone server: open, build the manifest, push, close, fetch.

    ``coordinator`` and ``client`` are ``GrpcZoneClient``s of the zone, ``server_proc`` its
    ``psutil.Process``. Returns the seconds of ``manifest`` (``build_manifest``, not part of
    the push), ``push``, ``close`` (``close_round``) and ``fetch`` (``fetch``,
    download and checks), and of each process during the push its CPU seconds
    (``srv_cpu``, ``cli_cpu``) and minor page faults (``srv_flt``, ``cli_flt``).
    """
    nbytes = num_bytes(shards)
    spec = round_spec(round_no, plan, [site])
    coordinator.open_round(spec)
    t0 = time.perf_counter()
    manifest = make_manifest(plan, shards, site_id=site, round=round_no, weight=SITE_WEIGHT)
    t_manifest = time.perf_counter() - t0
    srv0, cli0 = sum(server_proc.cpu_times()[:2]), time.process_time()
    fs0, fc0 = minor_faults(server_proc.pid), minor_faults()
    t1 = time.perf_counter()
    receipt = client.push(manifest, spec.token, shards)
    t2 = time.perf_counter()
    srv1, cli1 = sum(server_proc.cpu_times()[:2]), time.process_time()
    fs1, fc1 = minor_faults(server_proc.pid), minor_faults()
    assert receipt.bytes == nbytes, receipt
    t_close0 = time.perf_counter()
    coordinator.close_round(round_no)
    t3 = time.perf_counter()
    aggregate = client.fetch(round_no)
    t4 = time.perf_counter()
    assert len(aggregate.means) == len(shards) and aggregate.summary.sites == (site,)
    del aggregate
    return {
        "manifest": t_manifest,
        "push": t2 - t1,
        "close": t3 - t_close0,
        "fetch": t4 - t3,
        "srv_cpu": srv1 - srv0,
        "cli_cpu": cli1 - cli0,
        "srv_flt": float(fs1 - fs0),
        "cli_flt": float(fc1 - fc0),
    }


# CPU accounting -----------------------------------------------------------------------------------
def machine_busy_seconds() -> float:
    """CPU seconds every process of the machine has used so far (/proc/stat: all but idle, iowait and
    steal; 0 if unavailable)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + fields[4] + (fields[7] if len(fields) > 7 else 0)
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> tuple[int, int]:
    """``(steal, total)`` CPU ticks of the machine so far, from /proc/stat (zeros if unavailable)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_note(start: tuple[int, int]) -> str:
    """A note on the CPU time the hypervisor took from this VM since ``start`` (the noise it adds)."""
    steal, total = (b - a for a, b in zip(start, cpu_ticks(), strict=True))
    if total <= 0:
        return "- CPU steal during the timed runs: unknown (no /proc/stat)."
    share = steal / total
    effect = "too little to explain much of the run-to-run noise" if share < 0.02 else "part of the run-to-run noise"
    return (
        f"- CPU steal during the timed runs: {share:.1%} of the CPU time (time the hypervisor gave this VM's vCPUs "
        f"to other guests; {effect})."
    )


def fmt(x: float, digits: int = 1) -> str:
    """``x`` with thousands separators and ``digits`` decimals."""
    return f"{x:,.{digits}f}"


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run a zone gRPC server (mutual TLS with --cert/--key/--ca) until stdin closes")
    s.add_argument("--staging-bytes", type=int, default=256 << 20)
    s.add_argument("--max-workers", type=int, default=16)
    s.add_argument("--cert", type=Path)
    s.add_argument("--key", type=Path)
    s.add_argument("--ca", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        tls = None
        if args.cert is not None:
            from fedshard.crypto.tls import TlsFiles

            tls = TlsFiles(args.cert, args.key, args.ca)
        _serve_forever(args.staging_bytes, args.max_workers, tls)


if __name__ == "__main__":
    _main()
