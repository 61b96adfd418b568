"""Issue 32: a breached coordinator cannot weaken a site's privacy, raise its budget, move a
shard to another party or make a site apply a model of its own.

Real parts throughout: the example deployment (``configs/aggregator.yaml``, its site
configs) on free loopback ports, its keys from ``fedshard keys init`` (:func:`provision`),
its three zones as real gRPC servers with mutual TLS, and two deployed sites
(``charite-berlin``, EU, and ``mayo-rochester``, US) assembled from their own config files
exactly as a SuperNode assembles them, every message going through the real ClientApp
(Flower records, the site's own config from the node config). Beside them, two *rogue*
servers hold certificates the federation CA issued to other parties: the SuperLink's
and ``us-east``'s. Every call they receive is recorded.

The attacker is the coordinator. After one honest round (a real :class:`Coordinator`:
discovery, training, zones closing and forwarding; the sites have not applied it yet), it sends thousands of
messages in which hypothesis mutates every field a coordinator controls: the privacy plan
(missing, weaker or stricter σ and clip, wider noise sharing, another accountant, a
larger budget, fewer planned rounds, other batch sizes), the zones and their endpoints
(rogue servers, unknown zones, zones left out), the rounds to apply (invented roots,
zones and rounds), the round, token, weights, ledger head, seed and training settings;
queries with mutated plans and ledger heads too. After every message:

* a site that released did so under DP-SGD at least as strong as its own config
  (σ ≥ its σ, clip ≤ its clip), and only to zones of its own config;
* the rogue servers have received nothing;
* every refusal is one line;
* each site's model is genesis or the honest round's model, which it applies from the first
  message that names it truly (nothing else is ever applied);

and the sites' ledgers never hold a budget above their own config's, nor spend above it.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from fedshard.assembly import deployed_site_for, load_site_keys, make_zone, streaming_parties, tls_connector
from fedshard.assembly.routing import FederationRouting
from fedshard.config import FederationConfig, load_federation
from fedshard.config.layout import KeysLayout
from fedshard.coordinator.coordinator import Coordinator
from fedshard.deploy.keys import provision
from fedshard.deploy.loopback import write_loopback_layout
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.ledger import PrivacyLedger
from fedshard.privacy.mechanisms.dpsgd import RecordPrivacy
from fedshard.protocol.messages import (
    AppliedRound,
    LedgerHeadReport,
    MessageKind,
    PrivacyPlan,
    PublishedAggregate,
    QueryRequest,
    SignedStatement,
    SiteInfo,
    TrainInstruction,
    TrainReport,
    UpdatePlan,
)
from fedshard.site.site import Site
from fedshard.transports.flower.records import REPLIES, pack, unpack
from fedshard.zone.rpc.service import serve

ROOT = Path(__file__).resolve().parents[2]
SITES = ("charite-berlin", "mayo-rochester")
OWN_SIGMA, OWN_CLIP, OWN_EPSILON = 1.0, 1.0, 8.0  # what configs/aggregator.yaml and the sites' caps say
MUTATED_MESSAGES = 5000


# -- the rogue servers -------------------------------------------------------------------------------------------
class Rogue:
    """A gRPC server holding another party's certificate (CA-signed), recording every call it gets."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()
        credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])  # any client welcome
        self.server = grpc.server(_pool(), handlers=[_Recorder(self)])
        self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def record(self, method: str) -> None:
        with self._lock:
            self.calls.append(method)


def _pool() -> Any:
    from concurrent import futures

    return futures.ThreadPoolExecutor(max_workers=8)


class _Recorder(grpc.GenericRpcHandler):
    """Accepts every method of every service: reads what is sent, records it, refuses."""

    def __init__(self, rogue: Rogue) -> None:
        self.rogue = rogue

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        rogue = self.rogue

        def streamed(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
            rogue.record(method)
            for _ in requests:
                pass
            context.abort(grpc.StatusCode.UNAVAILABLE, "rogue")

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            rogue.record(method)
            context.abort(grpc.StatusCode.UNAVAILABLE, "rogue")

        def replying(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            rogue.record(method)
            context.abort(grpc.StatusCode.UNAVAILABLE, "rogue")
            yield b""

        name = method.rsplit("/", 1)[-1]
        if name in ("Push", "Forward"):
            return grpc.stream_unary_rpc_method_handler(streamed)
        if name == "FetchAggregate":
            return grpc.unary_stream_rpc_method_handler(replying)
        return grpc.unary_unary_rpc_method_handler(unary)


# -- the deployment ---------------------------------------------------------------------------------------------
@dataclass
class Deployment:
    """The zones, the two deployed sites, the rogues, and what the honest round left."""

    root: Path
    config: FederationConfig
    site_configs: dict[str, Path]
    endpoints: dict[str, str]
    rogues: dict[str, Rogue]
    sites: dict[str, Site]
    coordinator: Coordinator
    genesis: str = ""
    honest: dict[str, str] = field(default_factory=dict)  # site -> its model version after the honest round
    round1: dict[str, AppliedRound] = field(default_factory=dict)  # site -> the honest round as it applies it
    dp_runs: list[tuple[float, float]] = field(default_factory=list)  # (σ added, clip) of every DP-SGD run
    pushes: list[tuple[str, str, str]] = field(default_factory=list)  # (site, zone, endpoint) of every push dialled
    token: str = ""
    outcomes: dict[str, int] = field(default_factory=dict)  # what the attack's messages came to, counted
    mutated: int = 0  # mutated objects sent: instructions or queries, plans, endpoint maps, aggregate lists
    applied: set[str] = field(default_factory=set)  # sites that applied the honest round (from a true message)

    def send(self, site_id: str, kind: MessageKind, message: BaseModel) -> BaseModel:
        """Deliver ``message`` to ``site_id`` through the real ClientApp (Flower records, the
        site assembled from its own config file named by the node config); its reply."""
        return _client_app_call(self.site_configs[site_id], kind, message)

    def ledger(self, site_id: str) -> PrivacyLedger:
        return PrivacyLedger(self.sites[site_id].privacy.ledger_path, None, key=self.sites[site_id].privacy.key)


def _client_app_call(site_config: Path, kind: MessageKind, message: BaseModel) -> BaseModel:
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from clients.client_app import app

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    try:
        msg = Message(content=pack(message), dst_node_id=1, message_type=kind.value)
        context = Context(
            run_id=1, node_id=1, node_config={"site-config": str(site_config)}, state=RecordDict(), run_config={}
        )
        reply = app(msg, context)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    return unpack(reply, REPLIES[kind])


class _ClientAppGateway:
    """The coordinator's side of the honest round: every message through the real ClientApp."""

    def __init__(self, deployment: Deployment) -> None:
        self.d = deployment

    def nodes(self) -> list[str]:
        return list(SITES)

    def send(self, kind: MessageKind, messages: dict[str, BaseModel], timeout: float) -> dict[str, Any]:
        return {node: self.d.send(node, kind, msg) for node, msg in messages.items()}

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("breached")

    def edit(data: dict[str, Any]) -> None:
        data["residency"].pop("encrypt", None)  # plaintext: faster, and the tests can read what was sent
        data["federation"].update(min_sites=2, rounds=12)
        data["privacy"]["record_level"]["accountant"] = "rdp"  # PRV takes ~1 s per query's projection

    paths = write_loopback_layout(ROOT / "configs", root, edit=edit)
    config = load_federation(paths["aggregator"])
    assert config.deployment is not None
    provision(config, config.deployment.keys)
    keys = KeysLayout(config.deployment.keys).aggregator
    routing = FederationRouting(config)
    site_keys = load_site_keys(keys.site_keys)
    servers = []
    zones = []
    for zc in config.zones:
        zone = make_zone(zc, root / "zones", routing=routing, site_keys=site_keys, tls=keys.zone(zc.name))
        server, _ = serve(
            zone, zc.endpoint, tls=keys.zone(zc.name), limits=zc.limits, parties=streaming_parties(config)
        )
        servers.append(server)
        zones.append(zone)
    rogues = {"superlink": Rogue(keys.superlink.cert, keys.superlink.key)}
    us = keys.zone("us-east")
    rogues["us-east-elsewhere"] = Rogue(us.cert, us.key)
    with pytest.MonkeyPatch.context() as mp:
        runs: list[tuple[float, float]] = []
        original = RecordPrivacy.make_private

        def spied(self: RecordPrivacy, *args: Any, **kwargs: Any) -> Any:
            runs.append((self.added_noise_multiplier, self.max_grad_norm))
            return original(self, *args, **kwargs)

        mp.setattr(RecordPrivacy, "make_private", spied)
        from fedshard.zone.rpc.client import GrpcZoneClient

        pushes: list[tuple[str, str, str]] = []
        real_push = GrpcZoneClient.push

        def dialled(self: GrpcZoneClient, manifest: Any, *args: Any, **kwargs: Any) -> Any:
            pushes.append((manifest.site_id, manifest.zone, self.endpoint))
            return real_push(self, manifest, *args, **kwargs)

        mp.setattr(GrpcZoneClient, "push", dialled)
        sites = {s: deployed_site_for(paths[s]) for s in SITES}
        connect = tls_connector(keys.coordinator, {z.name: z.region for z in config.zones})
        endpoints = {z.name: z.endpoint for z in config.zones}
        clients = {name: connect(name, ep) for name, ep in endpoints.items()}
        d = Deployment(
            root,
            config,
            {s: paths[s] for s in SITES},
            endpoints,
            rogues,
            sites,
            None,
            dp_runs=runs,
            pushes=pushes,  # type: ignore[arg-type]
        )
        d.coordinator = Coordinator(config, _ClientAppGateway(d), clients, endpoints)
        try:
            _honest_round(d)
            yield d
        finally:
            for c in clients.values():
                c.close()
            for server in servers:
                server.stop(grace=0.5).wait()
            for zone in zones:
                zone.close()
            for rogue in rogues.values():
                rogue.server.stop(grace=0.1).wait()


def _honest_round(d: Deployment) -> None:
    """Round 1 run by a real, honest coordinator up to its close (the sites apply it with their next
    message: the attacker's); then round 2 opened for the attacker's messages."""
    c = d.coordinator
    result = c.discover()
    d.genesis = result.genesis_version
    c._evaluate = lambda rnd, clock=None: (math.nan, math.nan, {})  # type: ignore[method-assign]
    closed = c.run_round(1, d.genesis)  # not evaluated: the sites apply round 1 from the attacker's messages
    assert set(closed.sites) == set(SITES), closed.refused
    for node in c._nodes:
        site_id = c._nodes[node].site_id
        d.honest[site_id] = c._group(node).version
        (d.round1[site_id],) = c._group(node).rounds
    d.token = secrets.token_hex(16)
    weights = dict.fromkeys(c._nodes, 100.0)
    c._open(2, d.token, closed.version, sorted(c._nodes), weights)
    assert len(d.dp_runs) == 2 and all(sigma >= OWN_SIGMA for sigma, _ in d.dp_runs)


# -- the findings, one by one ----------------------------------------------------------------------------
def _honest(d: Deployment, site_id: str) -> TrainInstruction:
    return _instruction(d, site_id, {**HONEST_CHOICE})


def test_item_3_endpoints_the_coordinator_names_reach_no_other_party(deployment: Deployment) -> None:
    """An EU site told to push to servers holding the SuperLink's and us-east's certificates
    pushes to its own config's zones (and applies the honest round first)."""
    d, site_id = deployment, "charite-berlin"
    message = _honest(d, site_id).model_copy(update={"zones": _zones(d, "all to the SuperLink's cert")})
    dp_before, pushes_before = len(d.dp_runs), len(d.pushes)
    reply = d.send(site_id, MessageKind.TRAIN, message)
    assert _check_reply(d, site_id, reply, dp_before, pushes_before) == "released", reply
    assert {zone for _, zone, _ in d.pushes[pushes_before:]} == {"eu-central"}  # its EU personal shards too
    _check_model(d, site_id)
    assert d.applied == {site_id}


def test_item_4_roots_the_coordinator_invents_are_never_applied(deployment: Deployment) -> None:
    """Invented roots are refused (the site's chain would not reach the head), and so is a relayed
    zone statement other than the one the zone serves; an aggregate announced at a zone the
    site's routes do not name is never fetched, and a relay without statements changes nothing
    (the site checks the signature the zone serves): the site applies what it verified."""
    d, site_id = deployment, "mayo-rochester"
    for how in (
        "root invented",
        "aggregate roots invented",
        "signatures swapped",
        "signature of another zone's statement",
    ):
        message = _honest(d, site_id).model_copy(update={"missed": _missed(d, site_id, how)})
        dp_before, pushes_before = len(d.dp_runs), len(d.pushes)
        reply = d.send(site_id, MessageKind.TRAIN, message)
        assert isinstance(reply, TrainReport) and not reply.ok, how
        _check_reply(d, site_id, reply, dp_before, pushes_before)
        assert str(d.sites[site_id].store.meta()["version"]) == d.genesis, how
    both = _missed(d, site_id, "aggregate from an unknown zone")[0]
    unsigned = both.model_copy(update={"aggregates": [a.model_copy(update={"signed": None}) for a in both.aggregates]})
    message = _honest(d, site_id).model_copy(update={"missed": [unsigned]})
    dp_before, pushes_before = len(d.dp_runs), len(d.pushes)
    reply = d.send(site_id, MessageKind.TRAIN, message)
    assert _check_reply(d, site_id, reply, dp_before, pushes_before) == "released"
    assert str(d.sites[site_id].store.meta()["version"]) == d.honest[site_id]


def test_item_1_an_instruction_without_a_privacy_plan_is_refused_before_anything_is_reserved(
    deployment: Deployment,
) -> None:
    d, site_id = deployment, "mayo-rochester"
    with d.ledger(site_id) as ledger:
        rows = ledger.head().length
    message = _honest(d, site_id).model_copy(update={"privacy": None})
    dp_before, pushes_before = len(d.dp_runs), len(d.pushes)
    reply = d.send(site_id, MessageKind.TRAIN, message)
    assert isinstance(reply, TrainReport) and not reply.ok and reply.code == "privacy"
    assert "sent no privacy plan but its own config turns on privacy.record_level" in reply.reason
    assert _check_reply(d, site_id, reply, dp_before, pushes_before) == "refused: may only tighten"
    with d.ledger(site_id) as ledger:
        assert ledger.head().length == rows  # nothing reserved


def test_item_2_a_coordinator_cannot_raise_a_budget(deployment: Deployment) -> None:
    d, site_id = deployment, "mayo-rochester"
    plan = d.coordinator._privacy_plan(site_id)
    assert plan is not None
    reply = d.send(
        site_id, MessageKind.QUERY, QueryRequest(privacy={site_id: plan.model_copy(update={"epsilon": 1000.0})})
    )
    assert isinstance(reply, SiteInfo) and reply.privacy is not None
    assert reply.privacy.epsilon_budget == OWN_EPSILON and "keeps its cap ε=8" in reply.privacy.note
    with d.ledger(site_id) as ledger:
        assert ledger.budget.epsilon == OWN_EPSILON


# -- the attacker's moves ------------------------------------------------------------------------------------------
Mutation = Callable[[TrainInstruction, Deployment, str], TrainInstruction]


def _plan_change(**changes: Any) -> Callable[[PrivacyPlan], PrivacyPlan]:
    return lambda p: p.model_copy(update=changes)


def _record_change(**changes: Any) -> Callable[[PrivacyPlan], PrivacyPlan]:
    return lambda p: p.model_copy(update={"record": p.record.model_copy(update=changes) if p.record else None})


PLANS: dict[str, Callable[[PrivacyPlan], PrivacyPlan | None]] = {
    "honest": lambda p: p,
    "no plan": lambda p: None,
    "no record-level DP": _plan_change(record=None),
    "σ lower": _record_change(noise_multiplier=0.3),
    "σ far lower": _record_change(noise_multiplier=1e-6),
    "σ higher": _record_change(noise_multiplier=3.0),
    "σ calibrated": _record_change(noise_multiplier=None),
    "clip larger": _record_change(max_grad_norm=50.0),
    "clip smaller": _record_change(max_grad_norm=0.2),
    "shared over 5": _record_change(distributed_over=5),
    "one planned round": _record_change(planned_rounds=1, noise_multiplier=None),
    "ε 1000": _plan_change(epsilon=1000.0),
    "δ 0.5": _plan_change(delta=0.5),
    "prv": lambda p: p.model_copy(update={"accountant": AccountantKind.PRV}),
    "update-level weak": _plan_change(update=UpdatePlan(clip_norm=100.0, noise_multiplier=1e-6)),
    "batch 10000": _plan_change(batch_size=10000),
}


def _zones(d: Deployment, how: str) -> dict[str, str]:
    rogue = d.rogues["superlink"].endpoint
    us_rogue = d.rogues["us-east-elsewhere"].endpoint
    honest = dict(d.endpoints)
    return {
        "honest": honest,
        "all to the SuperLink's cert": dict.fromkeys(honest, rogue),
        "all to us-east's cert": dict.fromkeys(honest, us_rogue),
        "eu-central elsewhere": {**honest, "eu-central": us_rogue},
        "an unknown zone": {**honest, "evil": rogue},
        "eu-central left out": {k: v for k, v in honest.items() if k != "eu-central"},
        "swapped": dict(zip(honest, reversed(list(honest.values())), strict=True)),
        "none": {},
    }[how]


def _missed(d: Deployment, site_id: str, how: str) -> list[AppliedRound]:
    genuine = d.round1[site_id]
    fake_root = secrets.token_hex(32)
    rogue_zone = PublishedAggregate(zone="evil", group=genuine.aggregates[0].group, merkle_root=fake_root)
    return {
        "genuine": [genuine],
        "none": [],
        "root invented": [genuine.model_copy(update={"merkle_root": fake_root})],
        "aggregate roots invented": [
            genuine.model_copy(
                update={"aggregates": [a.model_copy(update={"merkle_root": fake_root}) for a in genuine.aggregates]}
            )
        ],
        "aggregate from an unknown zone": [
            genuine.model_copy(update={"aggregates": [*genuine.aggregates, rogue_zone]})
        ],
        "a round never run": [genuine.model_copy(update={"round": 7})],
        "signatures stripped": [
            genuine.model_copy(
                update={"aggregates": [a.model_copy(update={"signed": None}) for a in genuine.aggregates]}
            )
        ],
        "signatures swapped": [
            genuine.model_copy(
                update={
                    "aggregates": [
                        a.model_copy(update={"signed": b.signed})
                        for a, b in zip(genuine.aggregates, reversed(genuine.aggregates), strict=True)
                    ]
                }
            )
        ],
        "signature of another zone's statement": [
            genuine.model_copy(
                update={
                    "aggregates": [
                        a.model_copy(update={"signed": _forged(a.signed)}) if a.signed else a
                        for a in genuine.aggregates
                    ]
                }
            )
        ],
        "the round twice": [genuine, genuine],
    }[how]


def _forged(signed: SignedStatement) -> SignedStatement:
    """The zone's statement with its root changed, under the zone's own signature (which then fails)."""
    statement = json.loads(signed.statement)
    statement["merkle_root"] = secrets.token_hex(32)
    return signed.model_copy(update={"statement": json.dumps(statement, sort_keys=True, separators=(",", ":"))})


def _fake_head() -> LedgerHeadReport:
    return LedgerHeadReport(ledger_id=secrets.token_hex(8), length=3, mac=secrets.token_hex(32))


@st.composite
def attacks(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """One mutated message: the site, the kind, and the mutation's choices (by name, so a failing
    example reads as what the attacker did)."""
    site = draw(st.sampled_from(SITES))
    kind = draw(st.sampled_from(["train"] * 7 + ["query"]))
    choice = {
        "plan": draw(st.sampled_from(sorted(PLANS))),
        "zones": draw(st.sampled_from(["honest", "honest", *sorted(_ZONE_MOVES)])),
        "missed": draw(
            st.sampled_from(
                [
                    "genuine",
                    "none",
                    "root invented",
                    "aggregate roots invented",
                    "aggregate from an unknown zone",
                    "a round never run",
                    "the round twice",
                    "signatures stripped",
                    "signatures swapped",
                    "signature of another zone's statement",
                ]
            )
        ),
        "round": draw(st.one_of(st.sampled_from([2, 2, 1, 10_000]), st.integers(3, 80))),
        "token": draw(st.sampled_from(["honest", "random"])),
        "base": draw(st.sampled_from(["honest", "honest", "genesis", "random"])),
        "weight": draw(st.sampled_from([100.0, 100.0, 1e-6, 1e6])),
        "weight_scale": draw(st.sampled_from([100.0, 0.0, 1e-9, 1e12])),
        "head": draw(st.sampled_from(["none", "none", "invented"])),
        "epochs": draw(st.sampled_from([1, 1, 5])),
        "batch": draw(st.sampled_from([16, 16, 1, 4096])),
        "lr": draw(st.sampled_from([0.1, 0.1, 1e6])),
    }
    return site, kind, choice


HONEST_CHOICE: dict[str, Any] = {
    "plan": "honest",
    "zones": "honest",
    "missed": "genuine",
    "round": 2,
    "token": "honest",
    "base": "honest",
    "weight": 100.0,
    "weight_scale": 100.0,
    "head": "none",
    "epochs": 1,
    "batch": 16,
    "lr": 0.1,
}

_ZONE_MOVES = [
    "all to the SuperLink's cert",
    "all to us-east's cert",
    "eu-central elsewhere",
    "an unknown zone",
    "eu-central left out",
    "swapped",
    "none",
]


def _instruction(d: Deployment, site_id: str, choice: dict[str, Any]) -> TrainInstruction:
    """The honest coordinator's round-2 instruction for ``site_id``, mutated as ``choice`` says."""
    c = d.coordinator
    node = next(n for n in c._nodes if c._nodes[n].site_id == site_id)
    honest = c._instruction(node, 2, d.token, 100.0, 100.0)
    assert honest.privacy is not None
    base = {"honest": honest.base_version, "genesis": d.genesis, "random": secrets.token_hex(32)}[choice["base"]]
    return honest.model_copy(
        update={
            "privacy": PLANS[choice["plan"]](honest.privacy),
            "zones": _zones(d, choice["zones"]),
            "missed": _missed(d, site_id, choice["missed"]),
            "round": choice["round"],
            "token": honest.token if choice["token"] == "honest" else secrets.token_hex(16),
            "base_version": base,
            "weight": choice["weight"],
            "weight_scale": choice["weight_scale"],
            "ledger_head": _fake_head() if choice["head"] == "invented" else None,
            "epochs": choice["epochs"],
            "batch_size": choice["batch"],
            "learning_rate": choice["lr"],
            "deadline_s": 20.0,
        }
    )


def _query(d: Deployment, site_id: str, choice: dict[str, Any]) -> QueryRequest:
    c = d.coordinator
    plan = c._privacy_plan(site_id)
    assert plan is not None
    mutated = PLANS[choice["plan"]](plan)
    heads = {site_id: _fake_head()} if choice["head"] == "invented" else {}
    return QueryRequest(
        privacy={site_id: mutated} if mutated is not None else {},
        zones=_zones(d, choice["zones"]),
        ledger_heads=heads,
    )


# -- the properties --------------------------------------------------------------------------------------------------
def _check_reply(d: Deployment, site_id: str, reply: BaseModel, dp_before: int, pushes_before: int) -> str:
    """The properties of one reply; what the message came to (counted in ``d.outcomes``)."""
    outcome = _checked(d, site_id, reply, dp_before, pushes_before)
    d.outcomes[outcome] = d.outcomes.get(outcome, 0) + 1
    return outcome


def _checked(d: Deployment, site_id: str, reply: BaseModel, dp_before: int, pushes_before: int) -> str:
    assert not any(r.calls for r in d.rogues.values()), {n: r.calls for n, r in d.rogues.items()}
    runs, pushes = d.dp_runs[dp_before:], d.pushes[pushes_before:]
    for sigma, clip in runs:  # every DP-SGD run, released or not, at least as strong as the site's config
        assert sigma >= OWN_SIGMA - 1e-12 and clip <= OWN_CLIP + 1e-12, (sigma, clip)
    for pusher, zone, endpoint in pushes:  # shards only ever dialled to its own config's zones
        assert pusher == site_id and d.endpoints[zone] == endpoint, (pusher, zone, endpoint)
    if pushes:
        assert len(runs) == 1, f"pushed after {len(runs)} DP-SGD runs"
    if isinstance(reply, TrainReport):
        assert reply.site_id == site_id
        if not reply.ok:
            assert reply.reason and "\n" not in reply.reason, reply.reason
            return "pushed, refused by a zone" if pushes else f"refused: {_gist(reply.reason)}"
        assert len(runs) == 1 and pushes, "released without a DP-SGD run and a push"
        assert {p.zone for p in reply.pushes} <= set(d.endpoints), reply.pushes
        return "released"
    assert isinstance(reply, SiteInfo) and reply.site_id == site_id
    assert not runs and not pushes  # a query trains and sends nothing
    if reply.privacy is not None:
        assert reply.privacy.epsilon_budget <= OWN_EPSILON
        assert "\n" not in reply.privacy.note
        return f"query, {reply.privacy.status.value}"
    return "query"


def _gist(reason: str) -> str:
    """What kind of refusal ``reason`` is (for the coverage count)."""
    for key in (
        "may only tighten",
        "does not include zone",
        "version",
        "budget",
        "a round is charged once",
        "rolled back",
        "not in this site's config",
        "weigh",
    ):
        if key in reason:
            return key
    return reason[:60]


def _check_model(d: Deployment, site_id: str) -> None:
    """The site holds genesis or the honest round's model: nothing else was ever applied."""
    version = str(d.sites[site_id].store.meta()["version"])
    assert version in (d.genesis, d.honest[site_id]), (site_id, version)
    if version == d.honest[site_id]:
        d.applied.add(site_id)


def _check_ledgers(d: Deployment) -> None:
    for site_id in SITES:
        with d.ledger(site_id) as ledger:
            status = ledger.status()
            assert status.budget.epsilon <= OWN_EPSILON
            assert all(spent <= status.budget.epsilon + 1e-9 for spent in status.spent.values()), status.spent
            for entry in ledger.entries():
                assert entry.event.noise_multiplier >= OWN_SIGMA - 1e-12, entry


@settings(
    max_examples=MUTATED_MESSAGES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(attack=attacks())
def test_no_mutated_message_weakens_privacy_raises_a_budget_moves_a_shard_or_authors_a_model(
    deployment: Deployment, attack: tuple[str, str, dict[str, Any]]
) -> None:
    d = deployment
    site_id, kind, choice = attack
    message: BaseModel = _instruction(d, site_id, choice) if kind == "train" else _query(d, site_id, choice)
    d.mutated += 4  # the instruction (or query), its privacy plan, its zones' endpoints, its aggregates
    dp_before, pushes_before = len(d.dp_runs), len(d.pushes)
    try:
        message = type(message).model_validate_json(message.model_dump_json())  # what the wire can carry
    except ValidationError:
        d.outcomes["not decodable"] = d.outcomes.get("not decodable", 0) + 1  # the ClientApp cannot decode it
    else:
        reply = d.send(site_id, MessageKind.TRAIN if kind == "train" else MessageKind.QUERY, message)
        _check_reply(d, site_id, reply, dp_before, pushes_before)
    _check_model(d, site_id)


def test_after_the_attack_no_ledger_is_above_its_sites_own_budget(deployment: Deployment) -> None:
    d = deployment
    print(f"{d.mutated} mutated objects in {sum(d.outcomes.values())} messages:", json.dumps(d.outcomes, indent=1))
    assert d.mutated >= 5000
    _check_ledgers(d)
    assert not any(r.calls for r in d.rogues.values())
    # the attack reached every stage: some releases under stricter plans and to the site's own zones,
    # refusals of weaker plans, of zones left out, of invented chains and roots, of exhausted budgets
    assert d.applied == set(SITES)  # each applied the honest round, named truly in one of the messages
    assert d.outcomes.get("released", 0) >= 1, d.outcomes
    assert d.outcomes.get("released", 0) + d.outcomes.get("pushed, refused by a zone", 0) >= 5, d.outcomes
    for gist in ("may only tighten", "version", "budget", "rolled back"):
        assert d.outcomes.get(f"refused: {gist}", 0) >= 1, d.outcomes
