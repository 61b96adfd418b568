"""Residency end to end: three regional zones on loopback gRPC, hierarchical reduction,
zones that enforce the policy themselves (refuse, audit, serve only whom they may)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedshard.assembly import make_site, make_zone, running_zones
from fedshard.assembly.routing import FederationRouting
from fedshard.audit import verify_audit_log
from fedshard.config import FederationConfig
from fedshard.coordinator.coordinator import Coordinator
from fedshard.coordinator.results import RunResult
from fedshard.crypto.signing import public_key_bytes
from fedshard.errors import ConfigError, PushRejectedError, RefusalCode, ResidencyViolationError, ZoneError
from fedshard.integrity import build_manifest
from fedshard.protocol.rounds import PartialEntry, PartialSum, RoundSpec
from fedshard.store import LocalShardStore
from fedshard.transports.inprocess import InProcessSiteGateway
from fedshard.zone._state import LEFT_OUT
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.service import serve
from tests.zone_helpers import site_model

SITES = [("eu-a", "EU"), ("eu-b", "EU"), ("us-a", "US"), ("sg-a", "SG")]
ZONES = [("eu-central", "EU"), ("us-east", "US"), ("sg-central", "SG")]
TOKEN = "t" * 32
WEIGHTS = tuple((s, 10.0) for s, _ in SITES)  # what the rounds fix: the weight _manifest signs


def _config(rounds: int = 2, reducing_zone: str | None = "eu-central") -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "res", "seed": 5, "rounds": rounds, "min_sites": 2, "round_timeout_s": 60},
            "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
            "training": {"local_epochs": 2, "batch_size": 8, "learning_rate": 0.05},
            "sharding": {"tile": [4, 4]},
            "zones": [{"name": n, "region": r} for n, r in ZONES],
            "reducing_zone": reducing_zone,
            "sites": [{"id": s, "jurisdiction": j} for s, j in SITES],
        }
    )


Models = dict[str, dict[str, np.ndarray]]


def _run_federation(config: FederationConfig, tmp: Path) -> tuple[RunResult, Models, dict[str, dict]]:
    """Run ``config`` with in-process sites and gRPC zones under ``tmp``: the result, every
    site's final shards, and what each zone reports of itself."""
    routing = FederationRouting(config)
    with running_zones(config, tmp / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp / "sites", routing) for s in config.sites}
        gateway = InProcessSiteGateway(sites)
        zones = {n: GrpcZoneClient(ep) for n, ep in endpoints.items()}
        try:
            result = Coordinator(config, gateway, zones, endpoints).run()
            details = {n: z.details() for n, z in zones.items()}
        finally:
            gateway.close()
            for z in zones.values():
                z.close()
    models = {s.id: site_model(tmp / "sites", s.id)[1] for s in config.sites}
    return result, models, details


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[FederationConfig, RunResult, Path, dict]:
    """One two-round federation over three zones; what it left on disk."""
    tmp = tmp_path_factory.mktemp("residency")
    config = _config()
    result, _, details = _run_federation(config, tmp)
    return config, result, tmp, details


def _audit(tmp: Path, zone: str) -> list[dict]:
    path = tmp / "zones" / zone / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sites_form_residency_groups_and_all_rounds_run(run) -> None:
    _, result, _, _ = run
    assert result.stopped_reason == ""
    assert [r.round for r in result.rounds] == [1, 2]
    assert result.groups == {"EU": ["eu-a", "eu-b"], "SG+US": ["sg-a", "us-a"]}
    assert set(result.rounds[-1].versions) == {"EU", "SG+US"}
    assert all(r.sites == ("eu-a", "eu-b", "sg-a", "us-a") for r in result.rounds)


def test_eu_personal_shards_are_received_and_stored_only_in_the_eu(run) -> None:
    config, _, tmp, _ = run
    personal = {sid for sid, c in FederationRouting(config).classes.items() if c.shard_class == "personal"}
    assert personal  # the first layer and the output bias
    for zone in ("us-east", "sg-central"):
        accepted = [r for r in _audit(tmp, zone) if r["decision"] == "accepted"]
        assert {r["site"] for r in accepted} == {"us-a" if zone == "us-east" else "sg-a"}
        # nothing was published there: every shard they received was forwarded as a partial sum
        assert not list((tmp / "zones" / zone).glob("aggregate-*"))
        assert any(r["decision"] == "forwarded" and r["to_zone"] == "eu-central" for r in _audit(tmp, zone))
    eu = LocalShardStore(tmp / "zones" / "eu-central")
    meta, shards = eu.load("aggregate-000002-regional-EU")
    assert set(shards) <= personal
    assert set(meta["sites"]) == {"eu-a", "eu-b"}
    meta, shards = eu.load("aggregate-000002-global")
    assert set(meta["sites"]) == {"eu-a", "eu-b", "us-a", "sg-a"}
    # the global aggregate of a personal shard holds the non-EU sites' contributions only
    for sid, sites in meta["contributors"].items():
        assert ("eu-a" in sites) == (sid not in personal)


def test_groups_share_global_layers_and_keep_their_regional_ones(run) -> None:
    config, _, tmp, _ = run
    personal = {sid for sid, c in FederationRouting(config).classes.items() if c.shard_class == "personal"}
    models = {s: site_model(tmp / "sites", s)[1] for s, _ in SITES}
    for sid in models["eu-a"]:
        if sid.startswith("optimizer/"):
            continue
        assert np.array_equal(models["eu-a"][sid], models["eu-b"][sid])
        assert np.array_equal(models["us-a"][sid], models["sg-a"][sid])
        same = np.array_equal(models["eu-a"][sid], models["us-a"][sid])
        assert same == (sid not in personal), sid


def test_audit_logs_verify_and_zones_report_their_work(run) -> None:
    _, _, tmp, details = run
    for zone, _ in ZONES:
        verdict = verify_audit_log(tmp / "zones" / zone / "audit.jsonl")
        assert verdict.ok and verdict.lines > 0
        assert details[zone]["refused"] == 0
    assert details["eu-central"]["reducing"] is True
    assert details["eu-central"]["partials_received"] > 0
    assert details["us-east"]["forwarded_shards"] > 0
    assert details["eu-central"]["shards_by_class"]["personal from EU"] > 0
    for zone in ("us-east", "sg-central"):
        assert not any(key.endswith("from EU") for key in details[zone]["shards_by_class"])


# --- zones enforce the policy themselves ---------------------------------------------------


@pytest.fixture
def zones(tmp_path: Path) -> Iterator[tuple[FederationConfig, FederationRouting, dict[str, ZoneAggregator]]]:
    config = _config()
    routing = FederationRouting(config)
    made = {zc.name: make_zone(zc, tmp_path, routing=routing) for zc in config.zones}
    plan = routing.plan
    for zone in made.values():
        zone.open_round(RoundSpec(1, TOKEN, plan.to_json(), "v0", tuple(s for s, _ in SITES), weights=WEIGHTS))
    try:
        yield config, routing, made
    finally:
        for zone in made.values():
            zone.close()


def _update(routing: FederationRouting, shard_ids: list[str] | None = None) -> dict[str, np.ndarray]:
    plan = routing.plan
    rng = np.random.default_rng(0)
    shards = {s.shard_id: rng.standard_normal(s.shape).astype(s.dtype) for s in plan.shards}
    return {sid: shards[sid] for sid in (shard_ids or list(shards))}


def _manifest(routing: FederationRouting, site: str, zone: str, shards: dict[str, np.ndarray], **kw: object):
    classes = {sid: routing.classes[sid].shard_class for sid in shards}
    fields = {"classes": classes, "policy_digest": routing.router.policy.digest}
    fields.update(kw)
    return build_manifest(
        site_id=site,
        round=1,
        plan_digest=routing.plan.digest,
        base_version="v0",
        zone=zone,
        weight=10,
        shards=shards,
        **fields,  # type: ignore[arg-type]
    )


def _personal(routing: FederationRouting) -> list[str]:
    return [sid for sid, c in routing.classes.items() if c.shard_class == "personal"]


def test_us_zone_refuses_an_eu_personal_shard_over_grpc_with_permission_denied(zones) -> None:
    _, routing, made = zones
    shards = _update(routing, _personal(routing)[:1])
    sid = next(iter(shards))
    server, port = serve(made["us-east"], "127.0.0.1:0", max_workers=2)
    try:
        stub = pb_grpc.ZoneStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        header = pb.PushHeader(manifest=_manifest(routing, "eu-a", "us-east", shards).to_bytes(), round_token=TOKEN)
        with pytest.raises(grpc.RpcError) as info:
            stub.Push(iter([pb.PushFrame(header=header)]), timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert info.value.details().endswith(
            f"residency: shard {sid} (personal, origin EU) may not be received in region US"
        )
    finally:
        server.stop(grace=None).wait(timeout=10)
    refused = [r for r in _audit_of(made["us-east"]) if r["decision"] == "refused"]
    assert refused and refused[-1]["code"] == "residency" and refused[-1]["site"] == "eu-a"
    assert made["us-east"].stats.pushes == 0


def _audit_of(zone: ZoneAggregator) -> list[dict]:
    assert zone.audit is not None
    return [json.loads(line) for line in zone.audit.path.read_text().splitlines()]


def test_zone_refuses_a_manifest_routed_by_another_policy(zones) -> None:
    _, routing, made = zones
    shards = _update(routing)
    with pytest.raises(PushRejectedError, match="routed by policy") as info:
        made["eu-central"].push(
            _manifest(routing, "eu-a", "eu-central", shards, policy_digest="00" * 32), TOKEN, shards
        )
    assert info.value.code == "policy"


def test_zone_refuses_a_shard_whose_class_was_lowered_by_the_site(zones) -> None:
    _, routing, made = zones
    shards = _update(routing, _personal(routing)[:1])
    lie = {sid: "public" for sid in shards}
    with pytest.raises(PushRejectedError, match="the manifest says public") as info:
        made["us-east"].push(_manifest(routing, "eu-a", "us-east", shards, classes=lie), TOKEN, shards)
    assert info.value.code == "class"


def test_zone_takes_the_origin_from_the_certificate_not_the_request(zones) -> None:
    _, routing, made = zones
    shards = _update(routing, _personal(routing)[:1])
    manifest = _manifest(routing, "us-a", "us-east", shards)
    with pytest.raises(PushRejectedError, match="certificate says jurisdiction EU") as info:
        made["us-east"].begin_push(manifest, TOKEN, certified="EU")
    assert info.value.code == "identity"


def test_unsigned_or_forged_manifests_are_refused_when_sites_have_keys(tmp_path: Path) -> None:
    config = _config()
    routing = FederationRouting(config)
    keys = {s: Ed25519PrivateKey.generate() for s, _ in SITES}
    zone = make_zone(
        config.zones[0], tmp_path, routing=routing, site_keys={s: public_key_bytes(k) for s, k in keys.items()}
    )
    zone.open_round(RoundSpec(1, TOKEN, routing.plan.to_json(), "v0", tuple(s for s, _ in SITES), weights=WEIGHTS))
    shards = _update(routing)
    manifest = _manifest(routing, "eu-a", "eu-central", shards)
    with pytest.raises(PushRejectedError, match="is not signed"):
        zone.push(manifest, TOKEN, shards)
    with pytest.raises(PushRejectedError, match="signature does not verify"):
        zone.push(manifest.signed(keys["eu-b"]), TOKEN, shards)
    receipt = zone.push(manifest.signed(keys["eu-a"]), TOKEN, shards)
    assert receipt.shards == len(shards)
    zone.close()


def test_reducing_zone_refuses_partial_sums_of_regional_shards(zones) -> None:
    _, routing, made = zones
    sid = _personal(routing)[0]
    total = np.zeros(routing.plan.shard(sid).shape, dtype=np.float64)
    from fedshard.integrity import shard_digest

    entry = PartialEntry(sid, shard_digest(total), int(total.nbytes), 10.0, ("eu-a",))
    partial = PartialSum("us-east", 1, TOKEN, (entry,))
    with pytest.raises(PushRejectedError, match="aggregated in its region, not globally") as info:
        made["eu-central"].receive_partial(partial, {sid: total})
    assert info.value.code == "residency"
    # a zone that is not the reducing zone reduces nothing
    with pytest.raises(PushRejectedError, match="not the reducing zone"):
        made["us-east"].receive_partial(replace(partial, zone="sg-central"), {sid: total})


def test_regional_aggregate_is_served_only_to_the_jurisdictions_the_policy_allows(zones) -> None:
    _, routing, made = zones
    eu = made["eu-central"]
    for site in ("eu-a", "eu-b"):
        shards = _update(routing, [sid for sid, d in routing.site(site).routes.items() if d.zone == "eu-central"])
        eu.push(_manifest(routing, site, "eu-central", shards), TOKEN, shards)
    summaries = {s.group: s for s in eu.close_round(1, forward_to=None)}
    assert "regional/EU" in summaries and "global" in summaries
    summary = eu.fetch(1, "regional/EU", jurisdiction="EU").summary
    assert summary.sites == ("eu-a", "eu-b")
    with pytest.raises(ResidencyViolationError, match="may not be served to jurisdiction US"):
        eu.fetch(1, "regional/EU", jurisdiction="US")
    with pytest.raises(ResidencyViolationError, match="only to a site it can identify"):
        eu.fetch(1, "regional/EU")
    assert eu.fetch(1, "global", jurisdiction="US").summary.sites == ("eu-a", "eu-b")


def test_a_zone_without_a_reducing_zone_to_forward_to_cannot_close_with_global_shards(zones) -> None:
    _, routing, made = zones
    us = made["us-east"]
    shards = _update(routing)
    us.push(_manifest(routing, "us-a", "us-east", shards), TOKEN, shards)
    with pytest.raises(ZoneError, match="no reducing zone to forward them to"):
        us.close_round(1)


def test_policy_that_would_not_serve_a_site_its_own_aggregate_fails_at_load() -> None:
    data = _config().model_dump(mode="json", by_alias=True)
    data["residency"] = {
        "rules": [
            {"class": "personal", "origin": ["SG"], "allow_regions": ["SG"], "serve_to": ["EU"]},
            {"class": "*", "allow_regions": "*", "serve_to": "*"},
        ]
    }
    routing = FederationRouting(FederationConfig.model_validate(data))
    with pytest.raises(ConfigError, match=r"sg-a \(SG\) could never receive the aggregate of its own shard"):
        routing.check()


# --- over mutual TLS: identities from certificates, zone-to-zone forwarding ---------------


def test_mtls_origin_comes_from_the_certificate_and_zones_forward_over_mtls(tmp_path: Path) -> None:
    from fedshard.crypto.pki import init_ca, issue_coordinator, issue_site, issue_zone
    from fedshard.crypto.tls import TlsFiles

    config = _config()
    routing = FederationRouting(config)
    ca = init_ca(tmp_path / "ca")
    tls: dict[str, TlsFiles] = {}
    for name, region in ZONES:
        z = issue_zone(tmp_path / "ca", name, region, tmp_path / "zones-pki" / name)
        tls[name] = TlsFiles(z.cert, z.key, ca.cert)
    for site, jurisdiction in [*SITES, ("liar", "US")]:
        # "liar" holds eu-a's name with a US certificate
        paths = issue_site(tmp_path / "ca", "eu-a" if site == "liar" else site, jurisdiction, tmp_path / "s" / site)
        tls[site] = TlsFiles(paths.cert, paths.key, ca.cert)
    coordinator = issue_coordinator(tmp_path / "ca", "EU", tmp_path / "coordinator")
    tls["coordinator"] = TlsFiles(coordinator.cert, coordinator.key, ca.cert)
    servers, endpoints, made = [], {}, {}
    try:
        for zc in config.zones:
            made[zc.name] = make_zone(zc, tmp_path / "store", routing=routing, tls=tls[zc.name], peers=endpoints)
            server, port = serve(made[zc.name], "127.0.0.1:0", tls=tls[zc.name])
            servers.append(server)
            endpoints[zc.name] = f"localhost:{port}"
        spec = RoundSpec(1, TOKEN, routing.plan.to_json(), "v0", tuple(s for s, _ in SITES), weights=WEIGHTS)
        for name in endpoints:
            with GrpcZoneClient(endpoints[name], timeout=20, tls=tls["coordinator"]) as c:
                c.open_round(spec)
        us_shards = _update(routing)
        with GrpcZoneClient(endpoints["us-east"], timeout=20, tls=tls["us-a"]) as c:
            c.push(_manifest(routing, "us-a", "us-east", us_shards), TOKEN, us_shards)
        eu_shards = _update(routing, [sid for sid, d in routing.site("eu-a").routes.items()])
        with (
            GrpcZoneClient(endpoints["eu-central"], timeout=20, tls=tls["liar"]) as c,
            pytest.raises(PushRejectedError, match="certificate says jurisdiction US"),
        ):
            c.push(_manifest(routing, "eu-a", "eu-central", eu_shards), TOKEN, eu_shards)
        with GrpcZoneClient(endpoints["eu-central"], timeout=20, tls=tls["eu-a"]) as c:
            c.push(_manifest(routing, "eu-a", "eu-central", eu_shards), TOKEN, eu_shards)
        with GrpcZoneClient(endpoints["us-east"], timeout=20, tls=tls["coordinator"]) as c:
            assert c.close_round(1, forward_to=("eu-central", endpoints["eu-central"])) == []
        with GrpcZoneClient(endpoints["eu-central"], timeout=20, tls=tls["coordinator"]) as c:
            groups = {s.group: s for s in c.close_round(1)}
        assert groups["global"].sites == ("eu-a", "us-a")
        assert groups["regional/EU"].sites == ("eu-a",)
        # the US site may fetch the global aggregate, not the EU one; its certificate says who asks
        with GrpcZoneClient(endpoints["eu-central"], timeout=20, tls=tls["us-a"]) as c:
            assert set(c.fetch(1, "global").means) == {e.shard_id for e in groups["global"].shards}
            with pytest.raises(ResidencyViolationError, match="may not be served to jurisdiction US") as info:
                c.fetch(1, "regional/EU", site_id="eu-a")  # claiming another id changes nothing
            assert info.value.code is RefusalCode.NOT_SERVED
        forwarded = [r for r in _audit_of(made["eu-central"]) if r.get("source_zone") == "us-east"]
        assert forwarded and forwarded[0]["decision"] == "accepted"
    finally:
        for server in servers:
            server.stop(grace=None)
        for zone in made.values():
            zone.close()


# --- CKKS-encrypted shards ride the same routes ---------------------------------------------


def test_encrypted_personal_shards_give_the_plaintext_model_within_quantisation(tmp_path: Path) -> None:
    from fedshard.crypto.he import he_init

    plain = _config()
    he_init(tmp_path / "keys")
    data = plain.model_dump(mode="json", by_alias=True)
    data["residency"]["encrypt"] = ["personal"]
    data["he"] = {"keys": str(tmp_path / "keys"), "value_range": 1.0, "max_sites": 8}
    encrypted = FederationConfig.model_validate(data)
    plain_result, plain_models, _ = _run_federation(plain, tmp_path / "plain")
    he_result, he_models, _ = _run_federation(encrypted, tmp_path / "he")
    assert he_result.stopped_reason == "" and len(he_result.rounds) == 2
    assert he_result.groups == plain_result.groups
    for site, shards in plain_models.items():
        for sid, values in shards.items():
            assert np.allclose(he_models[site][sid], values, atol=2e-3), (site, sid)
    # what the zones stored and serve for personal shards is ciphertext (bytes), for public ones floats
    personal = {sid for sid, c in FederationRouting(plain).classes.items() if c.shard_class == "personal"}
    eu = LocalShardStore(tmp_path / "he" / "zones" / "eu-central")
    meta, regional = eu.load("aggregate-000002-regional-EU")
    assert regional and set(meta["encrypted"]) == set(regional)
    meta, global_ = eu.load("aggregate-000002-global")
    assert set(meta["encrypted"]) == personal & set(global_) != set()
    served = ZoneAggregator("eu-central", "EU", store_dir=tmp_path / "he" / "zones" / "eu-central").fetch(2, "global")
    assert set(served.ciphertexts) == personal & set(global_)
    assert all(type(c) is bytes for c in served.ciphertexts.values())
    assert all(served.means[sid].dtype == np.float32 for sid in set(global_) - personal)
    # the zones were given the public context only
    for audit in (tmp_path / "he" / "zones").glob("*/audit.jsonl"):
        assert verify_audit_log(audit).ok


def test_a_plaintext_shard_of_an_encrypted_class_is_refused(tmp_path: Path) -> None:
    from fedshard.crypto.he import he_init

    he_init(tmp_path / "keys")
    data = _config().model_dump(mode="json", by_alias=True)
    data["residency"]["encrypt"] = "all"
    data["he"] = {"keys": str(tmp_path / "keys")}
    config = FederationConfig.model_validate(data)
    routing = FederationRouting(config)
    zone = make_zone(config.zones[0], tmp_path, routing=routing)
    assert zone.he_context is not None and not zone.he_context.has_secret_key()
    zone.open_round(RoundSpec(1, TOKEN, routing.plan.to_json(), "v0", tuple(s for s, _ in SITES), weights=WEIGHTS))
    shards = _update(routing)
    with pytest.raises(PushRejectedError, match="must be HE-encrypted") as info:
        zone.push(_manifest(routing, "eu-a", "eu-central", shards), TOKEN, shards)
    assert info.value.code == "encryption"
    zone.close()


def _he_config(tmp_path: Path, **update_level: object) -> FederationConfig:
    from fedshard.crypto.he import he_init

    if not (tmp_path / "keys").exists():
        he_init(tmp_path / "keys")
    data = _config(rounds=1).model_dump(mode="json", by_alias=True)
    data["residency"]["encrypt"] = "all"
    data["he"] = {"keys": str(tmp_path / "keys")}
    data["privacy"] = {
        "update_level": {"enabled": True, "clip_norm": 1.0, "noise_multiplier": 1.0, **update_level},
        "budget": {"epsilon": 50.0, "delta": 1e-3},
    }
    return FederationConfig.model_validate(data)


def test_distributed_noise_needs_every_shard_encrypted_and_enough_sites(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"needs residency\.encrypt: all"):
        data = _he_config(tmp_path).model_dump(mode="json", by_alias=True)
        data["residency"]["encrypt"] = ["personal"]
        data["privacy"]["update_level"]["distributed_over"] = 2
        FederationConfig.model_validate(data)
    with pytest.raises(ValidationError, match=r"federation\.min_sites is 2"):
        _he_config(tmp_path, distributed_over=3)


def test_distributed_noise_runs_and_zones_refuse_to_publish_too_few_shares(tmp_path: Path) -> None:
    config = _he_config(tmp_path, distributed_over=2)
    result, _, _ = _run_federation(config, tmp_path / "run")
    assert result.stopped_reason == "" and len(result.rounds) == 1
    # every site accounted σ = 1 (what the other site's share leaves in its view), not its own share
    spent = {site: p["epsilon_update"] for site, p in result.privacy.items()}
    assert len(set(spent.values())) == 1 and next(iter(spent.values())) > 0
    # the reducing zone does not publish an encrypted shard that holds one site's share of the noise
    routing = FederationRouting(config)
    zone = make_zone(config.zones[0], tmp_path / "z", routing=routing)  # eu-central, the reducing zone
    zone.open_round(RoundSpec(1, TOKEN, routing.plan.to_json(), "v0", tuple(s for s, _ in SITES), weights=WEIGHTS))
    sid = next(sid for sid, d in routing.site("eu-a").routes.items() if d.group == "global")
    from fedshard.crypto.he import SECRET_CONTEXT_FILE, HeCodec, load_context

    codec = HeCodec(load_context(tmp_path / "keys" / SECRET_CONTEXT_FILE, secret=True))
    blob = codec.encrypt(np.zeros(routing.plan.shard(sid).size), 1.0)[0]
    manifest = _manifest(routing, "eu-a", "eu-central", {sid: blob}, encrypted=frozenset({sid}))
    zone.push(manifest, TOKEN, {sid: blob})
    with pytest.raises(ZoneError, match="fewer than 2 sites' noise shares"):
        zone.close_round(1)
    zone.close()


def _record_config(tmp_path: Path, batch_size: int) -> FederationConfig:
    data = _he_config(tmp_path).model_dump(mode="json", by_alias=True)
    data["training"].update(local_epochs=1, batch_size=batch_size)
    data["privacy"] = {
        "record_level": {"enabled": True, "noise_multiplier": 1.0, "max_grad_norm": 1.0, "distributed_over": 2},
        "budget": {"epsilon": 50.0, "delta": 1e-3},
    }
    return FederationConfig.model_validate(data)


def test_distributed_record_dp_runs_under_ckks_and_every_ledger_accounts_sigma(tmp_path: Path) -> None:
    from fedshard.privacy.accountant import epsilon
    from fedshard.privacy.events import DPEvent, Guarantee

    config = _record_config(tmp_path, batch_size=64)  # ≥ the toy task's 40 records: one DP-SGD step a round
    result, _, _ = _run_federation(config, tmp_path / "run")
    assert result.stopped_reason == "" and len(result.rounds) == 1
    # one step at q = 1 and σ = 1, the σ of any one site's view of the aggregate, not the σ/√(n−1) each site added
    expected = epsilon([DPEvent(Guarantee.RECORD, 1.0, 1.0, 1)], 1e-3)
    spent = [p["epsilon_record"] for p in result.privacy.values()]
    assert spent and all(e == pytest.approx(expected, rel=1e-6) for e in spent)


def test_distributed_record_dp_with_several_steps_a_round_is_refused_before_any_spend(tmp_path: Path) -> None:
    config = _record_config(tmp_path, batch_size=8)  # 5 Poisson batches a round: not linear in the noise
    result, _, _ = _run_federation(config, tmp_path / "run")
    refusals = [reason for r in result.rounds for reason in r.refused.values()]
    assert not any(r.sites for r in result.rounds)  # nobody released anything
    assert all(p["epsilon_record"] == 0.0 for p in result.privacy.values())
    assert any("one DP-SGD step per round" in reason for reason in [*refusals, result.stopped_reason])


def test_a_coordinator_that_asks_one_site_for_other_noise_gets_its_share_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A breached coordinator asks us-a for σ = 2 (a tightening, so us-a runs it) and the others
    for σ = 1: us-a would account σ = 2 for shares that add up to 1. The zones see it in the
    signed manifests: us-east forwards us-a's terms with its sums, and the reducing zone leaves
    us-a's share out of every aggregate (here a shard is then left with too few shares, so the
    round is not published at all)."""
    from fedshard.coordinator.coordinator import Coordinator as Breached

    honest = Breached._privacy_plan

    def plan(self: Breached, site_id: str):  # type: ignore[no-untyped-def]
        asked = honest(self, site_id)
        if site_id != "us-a" or asked is None or asked.record is None:
            return asked
        return asked.model_copy(update={"record": asked.record.model_copy(update={"noise_multiplier": 2.0})})

    monkeypatch.setattr(Breached, "_privacy_plan", plan)
    config = _record_config(tmp_path, batch_size=64)
    _run_federation(config, tmp_path / "run")
    audit = _audit(tmp_path / "run", "eu-central")
    left_out = [r for r in audit if r.get("reason") == LEFT_OUT]
    assert [(r["group"], r["sites"]) for r in left_out] == [("global", ["us-a"])]
    assert "sigma=2.0" in left_out[0]["noise"]
    published = [r for r in audit if r["decision"] == "published"]
    assert not any("us-a" in r["sites"] for r in published)  # no aggregate holds its share with the others'


def _encrypted_zone(tmp_path: Path) -> tuple[ZoneAggregator, FederationRouting, str, Any]:
    """eu-central (the reducing zone) of a federation whose shards are all HE-encrypted, with
    round 1 open; a global shard eu-a and eu-b push there and us-a to us-east; a codec."""
    from fedshard.crypto.he import SECRET_CONTEXT_FILE, HeCodec, load_context

    config = _record_config(tmp_path, batch_size=64)
    routing = FederationRouting(config)
    zone = make_zone(config.zones[0], tmp_path / "z", routing=routing)
    zone.open_round(RoundSpec(1, TOKEN, routing.plan.to_json(), "v0", tuple(s for s, _ in SITES), weights=WEIGHTS))
    routes = {site: routing.site(site).routes for site in ("eu-a", "eu-b", "us-a")}
    sid = next(
        sid
        for sid, d in routes["eu-a"].items()
        if d.group == "global" and routes["eu-b"][sid].zone == "eu-central" and routes["us-a"][sid].zone == "us-east"
    )
    return zone, routing, sid, HeCodec(load_context(tmp_path / "keys" / SECRET_CONTEXT_FILE, secret=True))


def test_a_zone_publishes_the_shares_most_sites_made_under_one_set_of_noise_terms(tmp_path: Path) -> None:
    zone, routing, sid, codec = _encrypted_zone(tmp_path)
    honest, other = (
        "record dpsgd sigma=1.0 clip=1.0 n=2 q=1.0 lr=0.1",
        "record dpsgd sigma=1.5 clip=1.0 n=2 q=1.0 lr=0.1",
    )
    blob = codec.encrypt(np.zeros(routing.plan.shard(sid).size), 1.0)[0]
    for site in ("eu-a", "eu-b"):
        manifest = _manifest(routing, site, "eu-central", {sid: blob}, encrypted=frozenset({sid}), noise=honest)
        zone.push(manifest, TOKEN, {sid: blob})
    from fedshard.integrity import MAX_NOISE_TERMS, ciphertext_digest

    entry = PartialEntry(sid, ciphertext_digest(blob), len(blob), 1.0, ("us-a",), encrypted=True)
    long = PartialSum("us-east", 1, TOKEN, (entry,), "x" * (MAX_NOISE_TERMS + 1))
    assert PartialSum.from_bytes(long.to_bytes()) == long
    with pytest.raises(PushRejectedError, match=r"at most 512 printable ASCII characters \(got 513") as refused:
        zone.receive_partial(long, {sid: blob})
    assert refused.value.code == "malformed"
    zone.receive_partial(replace(long, noise=other), {sid: blob})  # us-a's share, made under other terms
    (summary,) = zone.close_round(1)
    assert summary.group == "global" and summary.sites == ("eu-a", "eu-b")  # us-a's share left out
    (left,) = [r for r in _audit_of(zone) if r.get("reason") == LEFT_OUT]
    assert (left["sites"], left["noise"]) == (["us-a"], other)
    zone.close()


def test_a_zone_publishes_nothing_when_as_many_sites_name_each_of_two_noise_terms(tmp_path: Path) -> None:
    zone, routing, sid, codec = _encrypted_zone(tmp_path)
    blob = codec.encrypt(np.zeros(routing.plan.shard(sid).size), 1.0)[0]
    for site, sigma in (("eu-a", "1.0"), ("eu-b", "1.5")):
        terms = f"record dpsgd sigma={sigma} clip=1.0 n=2 q=1.0 lr=0.1"
        manifest = _manifest(routing, site, "eu-central", {sid: blob}, encrypted=frozenset({sid}), noise=terms)
        zone.push(manifest, TOKEN, {sid: blob})
    with pytest.raises(
        ZoneError, match=r"as many sites under each \(eu-a: record dpsgd sigma=1\.0 .*eu-b: .*sigma=1\.5"
    ) as info:
        zone.close_round(1)
    assert info.value.code is RefusalCode.PRIVACY and "\n" not in str(info.value)
    with pytest.raises(ZoneError, match=r"aggregate for round 1 \(not closed yet"):
        zone.fetch(1, "global", jurisdiction="EU")
    zone.close()


def test_distributed_noise_refuses_an_aggregate_that_can_never_hold_enough_shares(tmp_path: Path) -> None:
    data = _record_config(tmp_path, batch_size=64).model_dump(mode="json", by_alias=True)
    data["federation"]["min_sites"] = 3
    data["privacy"]["record_level"]["distributed_over"] = 3  # the EU personal shards meet only the 2 EU sites
    config = FederationConfig.model_validate(data)
    with pytest.raises(ConfigError, match=r"aggregate eu-central\|regional/EU holds at most 2 sites' shares") as info:
        FederationRouting(config).check()
    assert "\n" not in str(info.value)


def test_distributed_record_dp_needs_one_local_epoch_and_every_shard_encrypted(tmp_path: Path) -> None:
    from pydantic import ValidationError

    data = _record_config(tmp_path, batch_size=64).model_dump(mode="json", by_alias=True)
    data["training"]["local_epochs"] = 2
    with pytest.raises(ValidationError, match=r"record_level\.distributed_over needs training\.local_epochs: 1"):
        FederationConfig.model_validate(data)
    data["training"]["local_epochs"] = 1
    data["residency"]["encrypt"] = ["personal"]
    with pytest.raises(ValidationError, match=r"privacy\.record_level\.distributed_over needs residency\.encrypt: all"):
        FederationConfig.model_validate(data)
