"""Shared helpers of the fedshard benchmarks (not a benchmark itself).

* timing (``time.perf_counter``), medians and spreads of repeated runs;
* a description of the machine the numbers come from;
* a synthetic model update of a given number of float32 values, its shard plan,
  manifests and round specs;
* a zone server in a separate process (``ZoneServerProcess``), so that a benchmark's
  client and the zone do not share a GIL;
* tables (rich when installed, plain text otherwise) and the per-benchmark section of
  ``BENCHMARKS.md``, delimited by ``<!-- bench:NAME -->`` … ``<!-- /bench:NAME -->``.

Run as ``python bench/_common.py serve --staging-bytes N`` it is the zone server used by
``ZoneServerProcess``: it prints ``PORT <n> PID <pid>`` and serves until its stdin closes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
MD_HEADER = (
    "# fedshard benchmarks\n\n"
    "Every number below was produced by the command shown in its section, on the machine "
    "described there; rerunning a benchmark replaces only its own section.\n"
)

MB = 1e6  # throughputs are in decimal MB/GB (10^6 / 10^9 bytes)
MiB = 1 << 20


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
def machine_description() -> dict[str, str]:
    """CPU model, cores, RAM, OS and the versions that matter for these benchmarks."""
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        ram = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    except ImportError:  # pragma: no cover
        ram = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB"
    import google.protobuf
    import grpc
    from google.protobuf.internal import api_implementation

    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "ram": ram,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "protobuf": f"{google.protobuf.__version__} ({api_implementation.Type()})",
    }


def machine_line(desc: dict[str, str] | None = None) -> str:
    d = desc or machine_description()
    return (
        f"{d['cpu']}, {d['cores']} cores, {d['ram']} RAM, {d['os']}; Python {d['python']}, "
        f"numpy {d['numpy']}, grpcio {d['grpcio']}, protobuf {d['protobuf']}"
    )


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
    return sum(int(a.size) for a in arrays.values())


def num_bytes(arrays: dict[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in arrays.values())


def make_plan(update: dict[str, np.ndarray], tile: tuple[int, int] = (256, 256)) -> Any:
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


def round_spec(round: int, plan: Any, sites: Sequence[str]) -> Any:
    from fedshard.protocol.rounds import RoundSpec

    return RoundSpec(round, f"token-{round}", plan.to_json(), BASE_VERSION, tuple(sites))


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


# output --------------------------------------------------------------------------------------
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
    return f"{x:,.{digits}f}"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a table (rich if available)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(f"\n{title}")
        widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
        print("  ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True)))
        for r in rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
        return
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*[str(c) for c in r])
    Console(width=200).print(table)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    align = "|".join("---" if i == 0 else "---:" for i in range(len(headers)))
    out = ["| " + " | ".join(headers) + " |", f"|{align}|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def command_line() -> str:
    """The command that ran this benchmark, as typed from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_s = str(script.relative_to(REPO))
    except ValueError:
        script_s = str(script)
    return " ".join([".venv/bin/python", script_s, *sys.argv[1:]])


def section_header(title: str, runs: str, desc: dict[str, str] | None = None) -> str:
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (
        f"## {title}\n\n"
        f"- Command: `{command_line()}` (from the repository root)\n"
        f"- Machine: {machine_line(desc)}\n"
        f"- Date: {now}\n"
        f"- Runs: {runs}\n"
    )


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--quick`` and ``--output``: the common command-line options of the benchmarks."""
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke test (< 20 s)")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="markdown file to write the section into (default: BENCHMARKS.md; with --quick, nothing "
        "is written unless --output is given, so a smoke test never replaces real results)",
    )


def output_path(args: argparse.Namespace) -> Path | None:
    if args.output is not None:
        return Path(args.output)
    return None if args.quick else BENCHMARKS_MD


def publish(
    args: argparse.Namespace,
    name: str,
    title: str,
    runs: str,
    desc: dict[str, str] | None,
    notes: Sequence[str],
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    interpretation: str,
) -> None:
    """Write a benchmark's section (header, notes, table, interpretation) where ``args`` say."""
    out = output_path(args)
    if out is None:
        return
    body = "\n".join(
        [
            section_header(title, runs, desc),
            *notes,
            "",
            markdown_table(headers, rows),
            "",
            f"**Interpretation.** {interpretation}",
        ]
    )
    write_section(name, body, out)
    print(f"\nwrote section '{name}' of {out}")


def write_section(name: str, body: str, path: Path | None = None) -> Path:
    """Put ``body`` into ``name``'s section of ``path`` (BENCHMARKS.md), replacing the old one."""
    path = path or BENCHMARKS_MD
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else MD_HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
    return path


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
