"""Helpers of the site crash test (``tests/integration/test_site_crashes.py``).

A small DP federation runs a few rounds in the test process (real zones over gRPC on
loopback, real sites); then the victim site's messages run in children forked by a warm
parent (:mod:`tests.site_forker`), each on its own copy of the victim's state, into its
own round at the zone, killed at a named fault point; what is left is checked here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fedshard.assembly import STORE_KEYS_DIR, make_site, make_zone, streaming_parties
from fedshard.config import FederationConfig
from fedshard.protocol.messages import (
    EvaluateInstruction,
    EvaluateReport,
    MessageKind,
    SiteFailure,
    SiteInfo,
    TrainInstruction,
    TrainReport,
    decode,
    encode,
)
from fedshard.protocol.rounds import RoundSpec
from fedshard.transports.inprocess import InProcessSiteGateway
from fedshard.zone.aggregator import ZoneAggregator

__all__ = [
    "VICTIM",
    "Forker",
    "Job",
    "base_run",
    "counted_pushes",
    "crash_config",
    "open_round",
    "phases",
    "pick_points",
    "read_points",
    "scenario_instruction",
    "snapshot_site",
    "zones_up",
]

VICTIM = "s1"
_REPLIES: dict[MessageKind, type[BaseModel]] = {
    MessageKind.TRAIN: TrainReport,
    MessageKind.QUERY: SiteInfo,
    MessageKind.EVALUATE: EvaluateReport,
}
REPO = Path(__file__).resolve().parents[1]


def crash_config(rounds: int = 2) -> FederationConfig:
    """The breast-cancer demo with record-level DP, three EU sites (a third of the data each)
    and one zone; tiles of
    16 so the model is cut into 25 shards (many points along store writes and pushes)."""
    return FederationConfig.model_validate(
        {
            "federation": {"name": "crash", "seed": 7, "rounds": rounds, "min_sites": 2, "round_timeout_s": 60},
            "task": {"target": "clients.tasks.breast_cancer:task", "options": {"hidden": [64, 32]}},
            "training": {"local_epochs": 1, "batch_size": 16, "learning_rate": 0.1},
            "privacy": {
                "record_level": {"enabled": True, "noise_multiplier": 3.0, "max_grad_norm": 1.0},
                "budget": {"epsilon": 3.0, "delta": 1.0e-5},
            },
            "sharding": {"tile": [16, 16]},
            "zones": [{"name": "eu-central", "region": "EU", "endpoint": "127.0.0.1:0"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(3)],
        }
    )


@contextlib.contextmanager
def zones_up(config: FederationConfig, store_root: Path) -> Iterator[tuple[dict[str, ZoneAggregator], dict[str, str]]]:
    """The federation's zones served over gRPC in this process: ``(zones by name, endpoints)``
    (as :func:`fedshard.assembly.running_zones`, keeping the zone objects for the test)."""
    from fedshard.assembly.routing import FederationRouting
    from fedshard.zone.rpc.service import serve

    routing = FederationRouting(config)
    zones: dict[str, ZoneAggregator] = {}
    servers = []
    endpoints: dict[str, str] = {}
    try:
        for zc in config.zones:
            zones[zc.name] = make_zone(zc, store_root, routing=routing, peers=endpoints)
            server, port = serve(zones[zc.name], zc.endpoint, limits=zc.limits, parties=streaming_parties(config))
            servers.append(server)
            endpoints[zc.name] = f"127.0.0.1:{port}"
        yield zones, endpoints
    finally:
        for server in servers:
            server.stop(grace=1.0).wait()
        for zone in zones.values():
            zone.close()


class Recorder:
    """Site gateway over in-process sites that keeps every instruction and reply, and drops
    the messages ``drop`` names (``(kind, round, site)``): that site missed them."""

    def __init__(self, inner: InProcessSiteGateway, drop: set[tuple[str, int, str]]) -> None:
        self.inner = inner
        self.drop = drop
        self.sent: dict[tuple[str, int, str], BaseModel] = {}
        self.replies: dict[tuple[str, int, str], Any] = {}

    def nodes(self) -> list[str]:
        return self.inner.nodes()

    def send(self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float) -> dict[str, Any]:
        keys = {node: (kind.value, int(getattr(msg, "round", 0)), node) for node, msg in messages.items()}
        self.sent.update({keys[node]: msg for node, msg in messages.items()})
        live = {node: msg for node, msg in messages.items() if keys[node] not in self.drop}
        out = self.inner.send(kind, live, timeout)
        out.update({n: SiteFailure(reason="dropped by the test") for n in messages if n not in live})
        self.replies.update({keys[node]: reply for node, reply in out.items()})
        return out


def snapshot_site(state_root: Path, site: str, into: Path) -> Path:
    """Copy ``site``'s state folder and store key into ``into`` (laid out as make_site expects); the new state root."""
    root = into / "sites"
    shutil.copytree(state_root / site, root / site)
    keys = into / STORE_KEYS_DIR
    keys.mkdir(parents=True)
    for key in (state_root.parent / STORE_KEYS_DIR).glob(f"{site}.*"):
        shutil.copy2(key, keys / key.name)
    return root


@dataclass
class Job:
    """One message for the victim, run in a forked child."""

    id: str
    state_root: Path
    kind: MessageKind
    message: BaseModel
    faults: str = ""
    log: Path | None = None
    modules: Path | None = None
    status: str = ""
    code: int = 0
    reply: Any = None
    error: str = ""
    cpu: float = 0.0
    wall: float = 0.0

    @property
    def out(self) -> Path:
        return self.state_root.parent / f"reply-{self.id}.json"


@dataclass
class Forker:
    """The warm parent (:mod:`tests.site_forker`) as a subprocess."""

    config: FederationConfig
    site: str = VICTIM
    workers: int = 4
    stderr: Path | None = None
    _proc: subprocess.Popen[str] | None = field(default=None, init=False)
    _ready: bool = field(default=False, init=False)

    def __enter__(self) -> Forker:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        env.pop("FEDSHARD_FAULTS", None)
        env.pop("FEDSHARD_FAULTS_LOG", None)
        with contextlib.ExitStack() as files:
            err = files.enter_context(open(self.stderr, "w")) if self.stderr is not None else subprocess.DEVNULL
            self._proc = self._start(env, err)
        return self  # it imports while the test sets the federation up

    def _start(self, env: dict[str, str], err: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.site_forker", "--workers", str(self.workers)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )

    def _send(self, doc: Any) -> Iterator[dict[str, Any]]:
        """Send one line to the forker; its answers up to ``{"done": true}``."""
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        if not self._ready:
            ready = self._proc.stdout.readline()
            assert ready and json.loads(ready).get("ready"), f"the forker did not start: {ready!r}"
            self._ready = True
        self._proc.stdin.write(json.dumps(doc) + "\n")
        self._proc.stdin.flush()
        while True:
            line = self._proc.stdout.readline()
            assert line, "the forker died"
            answer = json.loads(line)
            if answer.get("done"):
                return
            yield answer

    def preload(self, jobs: Sequence[Job]) -> None:
        """Have the forker import what the messages of ``jobs`` imported (run with ``modules``)."""
        names = sorted({n for j in jobs if j.modules for n in j.modules.read_text().split()})
        for _ in self._send({"import": names}):
            pass

    def prime(self, compositions: Sequence[tuple[float, float, int]], delta: float, accountant: str) -> None:
        """Have the forker compose these record-level events once, for every child to inherit."""
        for _ in self._send({"prime": [list(c) for c in compositions], "delta": delta, "accountant": accountant}):
            pass

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError):
                self._proc.stdin.write("\n")
                self._proc.stdin.close()
            self._proc.wait()

    def run(self, jobs: Sequence[Job]) -> None:
        """Run ``jobs`` (each in a forked child); fill in their status and reply."""
        if not jobs:
            return
        config = self.config.model_dump(mode="json")
        batch = [
            {
                "id": j.id,
                "config": config,
                "state_root": str(j.state_root),
                "site": self.site,
                "kind": j.kind.value,
                "message": encode(j.message).decode(),
                "faults": j.faults,
                "log": str(j.log) if j.log else "",
                "modules": str(j.modules) if j.modules else "",
                "out": str(j.out),
            }
            for j in jobs
        ]
        by_id = {j.id: j for j in jobs}
        for doc in self._send(batch):
            job = by_id[doc["id"]]
            job.status, job.code, job.cpu, job.wall = doc["status"], doc["code"], doc["cpu"], doc["wall"]
            if job.status == "ok":
                job.reply = decode(_REPLIES[job.kind], job.out.read_bytes())
            elif job.status == "error":
                job.error = Path(f"{job.out}.error").read_text()


def open_round(zone: ZoneAggregator, rnd: int, plan_json: str, version: str, weight: float, site: str = VICTIM) -> str:
    """Open round ``rnd`` at ``zone`` for ``site`` alone, as the coordinator would; its token."""
    token = secrets.token_hex(16)
    zone.open_round(RoundSpec(rnd, token, plan_json, version, (site,), (), ((site, weight),)))
    return token


def counted_pushes(zone_store: Path) -> dict[tuple[str, int], int]:
    """Accepted pushes per ``(site, round)``, from the zone's audit log."""
    counts: dict[tuple[str, int], int] = {}
    for line in (zone_store / "audit.jsonl").read_text().splitlines():
        doc = json.loads(line)
        rec = doc.get("record", doc)
        if rec.get("decision") == "accepted" and rec.get("call") == "push":
            key = (str(rec["site"]), int(rec["round"]))
            counts[key] = counts.get(key, 0) + 1
    return counts


def base_run(config: FederationConfig, folder: Path, endpoints: Mapping[str, str]) -> tuple[Any, Recorder]:
    """Run ``config``'s rounds with its first two sites in this process; the victim misses the
    last evaluate (so its next message catches up). ``(result, recorder)``."""
    from fedshard.assembly import grpc_connector
    from fedshard.coordinator.coordinator import Coordinator

    sites = {s.id: make_site(config, s.id, folder / "sites") for s in config.sites[:2]}
    last = config.federation.rounds
    gateway = Recorder(InProcessSiteGateway(sites), {("evaluate", last, VICTIM)})
    zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
    try:
        result = Coordinator(config, gateway, zones, dict(endpoints)).run()
    finally:
        gateway.inner.close()
        for client in zones.values():
            client.close()
    return result, gateway


def scenario_instruction(gateway: Recorder, rnd: int, token: str, epsilon: float) -> TrainInstruction:
    """The victim's train instruction for scenario round ``rnd``: the last round's, with the
    round it missed to catch up on, a budget of ``epsilon``."""
    last = max(r for (kind, r, node) in gateway.sent if kind == "train" and node == VICTIM)
    train = gateway.sent[("train", last, VICTIM)]
    evaluate = gateway.sent[("evaluate", last, VICTIM)]
    assert isinstance(train, TrainInstruction) and isinstance(evaluate, EvaluateInstruction)
    report = gateway.replies[("train", last, VICTIM)]
    assert isinstance(report, TrainReport) and train.privacy is not None and report.privacy is not None
    return train.model_copy(
        update={
            "round": rnd,
            "token": token,
            "base_version": evaluate.version,
            "missed": evaluate.missed,
            "privacy": train.privacy.model_copy(update={"epsilon": epsilon}),
            "ledger_head": report.privacy.ledger_head,
        }
    )


def read_points(log: Path) -> list[tuple[str, int]]:
    """The ``(point, occurrence)`` pairs a run reached, in order (a ``FEDSHARD_FAULTS_LOG`` file)."""
    pairs = []
    for line in log.read_text().splitlines():
        name, n = line.split()
        pairs.append((name, int(n)))
    return pairs


def phases(pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The phase of the message each pair is in: that of the last ``site.<phase>…`` point before it."""
    out: dict[tuple[str, int], str] = {}
    phase = "load"
    for name, n in pairs:
        if name.startswith("site."):
            phase = name.split(".")[1]
        out[(name, n)] = phase
    return out


def _spread(count: int) -> list[int]:
    """1..count ordered to spread out: first, last, middle, then the middles of the halves…"""
    order: list[int] = []
    seen: set[int] = set()
    spans = [(1, count)]
    for n in (1, count):
        if n not in seen:
            order.append(n)
            seen.add(n)
    while spans:
        nxt = []
        for low, high in spans:
            if high - low < 2:
                continue
            mid = (low + high) // 2
            if mid not in seen:
                order.append(mid)
                seen.add(mid)
            nxt += [(low, mid), (mid, high)]
        spans = nxt
    return order


def pick_points(pairs: Sequence[tuple[str, int]], k: int) -> list[tuple[str, int]]:
    """``k`` pairs of ``pairs`` spread over every point and its occurrences (round robin over
    the points, each point's occurrences first, last, middle…), in the order the run reached them."""
    counts: dict[str, int] = {}
    for name, n in pairs:
        counts[name] = max(counts.get(name, 0), n)
    queues = {name: _spread(c) for name, c in counts.items()}
    chosen: set[tuple[str, int]] = set()
    while len(chosen) < min(k, len(pairs)):
        for name, queue in queues.items():
            if queue and len(chosen) < k:
                chosen.add((name, queue.pop(0)))
    return [pair for pair in pairs if pair in chosen]


def sample_points(pairs: Sequence[tuple[str, int]], seed: int) -> list[tuple[str, int]]:
    """Every point of ``pairs`` once, at one of its occurrences drawn with ``seed`` (the same
    draw every run), in the order the run reached them: what the suite kills by default."""
    import random

    rng = random.Random(seed)
    occurrences: dict[str, list[int]] = {}
    for name, n in pairs:
        occurrences.setdefault(name, []).append(n)
    chosen = {(name, rng.choice(ns)) for name, ns in occurrences.items()}
    return [pair for pair in pairs if pair in chosen]
