"""Issue 32, items 3, 4, 5 and 12 (audit): identity on every connection, aggregates signed by
the zone that published them, zones that forward only where their own config says.

Against one live federation (``fedshard keys init`` keys, real ``fedshard zone up`` processes
with mutual TLS) and, where an attacker needs a server of its own, real gRPC servers in this
process holding certificates the federation CA issued to another party: the SuperLink's,
another zone's, the expected zone's name in another region, a zone certificate from before
zone identities. A site dials them through the connector it is built with
(:func:`fedshard.assembly.tls_connector`, from its own config's zones), as the coordinator
would make it dial any endpoint it names.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from typer.testing import CliRunner

from fedshard.assembly import load_site_keys, make_zone, tls_connector
from fedshard.audit import AuditLog, HeadSigner, HeadVerifier, verify_audit_log
from fedshard.cli.main import app
from fedshard.crypto.identity import JURISDICTION_OID, REGION_OID, ZONE_HOST_SUFFIX, Role, read_identity
from fedshard.crypto.pki import issue_zone
from fedshard.crypto.tls import TlsFiles
from fedshard.errors import (
    FedshardError,
    IntegrityError,
    PeerIdentityError,
    PushRejectedError,
    RefusalCode,
    ZoneUnavailableError,
)
from fedshard.integrity.aggregate_signature import AggregateSignature, AggregateSigner, AggregateStatement
from fedshard.protocol.messages import AppliedRound, PublishedAggregate, SignedStatement
from fedshard.protocol.rounds import DEFAULT_GROUP, AggregateKey, RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.site._apply import fetch_view
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.service import serve
from tests.security.conftest import LiveFederation, live_federation
from tests.zone_helpers import BASE, TOKEN, manifest_for, random_update

pytestmark = pytest.mark.slow

SITE = "charite-berlin"  # an EU site: its personal shards go to eu-central, in clear in these tests
PLAN = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32)}, tile=(4, 4))


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveFederation]:
    """One live federation for the module (its zones take a few seconds to start)."""
    federation = live_federation(tmp_path_factory.mktemp("identity"))
    federation.start()
    try:
        yield federation
    finally:
        federation.stop()


def _regions(fed: LiveFederation) -> dict[str, str]:
    return {z.name: z.region for z in fed.config.zones}


def _site_connect(fed: LiveFederation, site: str = SITE):  # type: ignore[no-untyped-def]
    """How ``site`` reaches zones: mutual TLS with its certificate, zones' regions from its own config."""
    return tls_connector(fed.tls(site), _regions(fed))


class _Impostor:
    """A real gRPC zone server in this process presenting ``tls``'s certificate."""

    def __init__(self, zone: ZoneAggregator, tls: TlsFiles) -> None:
        self.zone = zone
        self.server, port = serve(zone, "127.0.0.1:0", tls=tls)
        self.endpoint = f"127.0.0.1:{port}"

    def __enter__(self) -> _Impostor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None).wait()


def _legacy(fed_ca: Path, cert_path: Path, role: Role) -> None:
    """Re-sign ``cert_path`` (same key) as fedshard issued it before roles were written:
    no role, no zone identity name, the SuperLink's as a zone's."""
    ca = x509.load_pem_x509_certificate((fed_ca / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((fed_ca / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    identity = read_identity(cert_path.read_bytes(), (fed_ca / "ca.pem").read_bytes())
    server = role in (Role.ZONE, Role.SUPERLINK)
    eku = (
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        if server
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    oid = JURISDICTION_OID if role is Role.SITE else REGION_OID
    place = cert.extensions.get_extension_for_oid(oid)
    builder = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(ca.subject)
        .public_key(cert.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(cert.not_valid_before_utc)
        .not_valid_after(cert.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(place.value, critical=False)
    )
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        kept = [n for n in sans if not (isinstance(n, x509.DNSName) and n.value.endswith(ZONE_HOST_SUFFIX))]
        builder = builder.add_extension(x509.SubjectAlternativeName(kept), critical=False)
    except x509.ExtensionNotFound:
        pass
    cert_path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    assert read_identity(cert_path.read_bytes(), (fed_ca / "ca.pem").read_bytes()).name == identity.name


# -- item 3: a site pushes only to the zone its own config names ---------------------------------------------


def test_a_site_sends_nothing_to_a_server_that_is_not_the_zone_it_expects(fed: LiveFederation, tmp_path: Path) -> None:
    spec = fed.spec(1)
    fed.open_round(spec)
    shards = fed.update(SITE, "eu-central")
    manifest = fed.manifest(SITE, "eu-central", spec, shards)
    connect = _site_connect(fed)
    agg = fed.keys.aggregator
    wrong_region = issue_zone(fed.keys.ca_dir, "eu-central", "US", tmp_path / "mistake")  # mistakenly issued
    legacy = tmp_path / "legacy"
    shutil.copytree(agg.root / "zones", legacy)
    _legacy(fed.keys.ca_dir, legacy / "eu-central.pem", Role.ZONE)
    impostors = {
        "superlink superlink (EU)": agg.superlink,
        "zone eu-central (US)": TlsFiles(wrong_region.cert, wrong_region.key, agg.ca),
        "from before zone identities; run `fedshard keys upgrade`": TlsFiles(
            legacy / "eu-central.pem", legacy / "eu-central.key", agg.ca
        ),
    }
    for held, tls in impostors.items():
        with _Impostor(ZoneAggregator("eu-central", "EU"), tls) as impostor:
            client = connect("eu-central", impostor.endpoint)  # the endpoint a coordinator named
            with pytest.raises(PeerIdentityError) as info:
                client.push(manifest, spec.token, shards)
            client.close()
            line = str(info.value)
            assert "\n" not in line and "is not zone eu-central (EU)" in line and held in line, line
            assert impostor.zone.stats.as_dict()["refused"] == 0 and impostor.zone.open_rounds == 0
    # another zone (us-east, US): a real zone process; nothing of the site's reaches it
    before = len(fed.audit("us-east"))
    with connect("eu-central", fed.endpoints["us-east"]) as client, pytest.raises(PeerIdentityError) as info:  # type: ignore[attr-defined]
        client.push(manifest, spec.token, shards)
    assert "holds the certificate of zone us-east (US)" in str(info.value)
    assert not [r for r in fed.audit("us-east")[before:] if r.get("by") == f"site:{SITE}"]
    with pytest.raises(PeerIdentityError, match="not a zone of this party's config"):
        connect("mallory-zone", fed.endpoints["eu-central"])
    # the zone itself, at its own endpoint: the push is taken
    client = connect("eu-central", fed.endpoints["eu-central"])
    receipt = client.push(manifest, spec.token, shards)
    client.close()
    assert (receipt.zone, receipt.site_id) == ("eu-central", SITE)
    for zone in fed.endpoints:
        with fed.client(zone, "coordinator") as c:
            c.abort_round(1)


def test_a_site_names_the_server_at_its_superlink_address_when_it_is_not_the_superlink(
    fed: LiveFederation, tmp_path: Path
) -> None:
    """What `site up` checks before its SuperNode dials (README, "Run across machines"): a
    server of another role (a zone's port given as the SuperLink's address) or one holding
    another CA's certificate is named at once, in one line; a closed port is no answer yet."""
    from fedshard.crypto.pki import init_ca
    from fedshard.crypto.tls import describe_superlink

    ca = fed.keys.aggregator.ca.read_bytes()
    said = describe_superlink(fed.endpoints["us-east"], ca)
    assert said is not None and "\n" not in said
    assert "holds the certificate of zone us-east (US) (role zone), not the SuperLink's" in said
    other = init_ca(tmp_path / "other-ca", "hospitals federation CA")
    foreign = describe_superlink(fed.endpoints["us-east"], other.cert.read_bytes())
    assert foreign is not None and "is not this federation's SuperLink" in foreign
    assert "was not issued by the federation CA" in foreign and "different `fedshard keys init` runs" in foreign
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert describe_superlink(f"127.0.0.1:{port}", ca) is None  # not up yet: the caller retries


def test_the_coordinators_clients_check_the_zone_too(fed: LiveFederation) -> None:
    connect = tls_connector(fed.tls("coordinator"), _regions(fed))
    with connect("eu-central", fed.endpoints["sg-central"]) as client, pytest.raises(PeerIdentityError) as info:  # type: ignore[attr-defined]
        client.open_round(fed.spec(2))
    assert "holds the certificate of zone sg-central (SG)" in str(info.value)


def _superlink_client_certificate(fed: LiveFederation, out: Path) -> TlsFiles:
    """A certificate of the SuperLink's role that also claims client authentication (a
    mistakenly issued one: ``keys init`` issues the SuperLink a server-only certificate)."""
    ca_dir = fed.keys.ca_dir
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    real = x509.load_pem_x509_certificate(fed.keys.aggregator.superlink.cert.read_bytes())
    eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    extensions = [e.value for e in real.extensions if not isinstance(e.value, x509.ExtendedKeyUsage)]
    builder = (
        x509.CertificateBuilder()
        .subject_name(real.subject)
        .issuer_name(ca.subject)
        .public_key(real.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(real.not_valid_before_utc)
        .not_valid_after(real.not_valid_after_utc)
        .add_extension(eku, critical=False)
    )
    for ext in real.extensions:
        if not isinstance(ext.value, x509.ExtendedKeyUsage):
            builder = builder.add_extension(ext.value, critical=ext.critical)
    assert extensions
    out.mkdir()
    (out / "superlink.pem").write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return TlsFiles(out / "superlink.pem", fed.keys.aggregator.superlink.key, fed.keys.aggregator.ca)


def test_zones_refuse_the_superlinks_certificate_for_every_call(fed: LiveFederation, tmp_path: Path) -> None:
    before = len(fed.audit("eu-central"))
    with fed.client("eu-central", "superlink") as c, pytest.raises(ZoneUnavailableError):
        c.info()  # a server-only certificate: the zone's TLS ends the handshake, no call runs
    assert not [r for r in fed.audit("eu-central")[before:] if "superlink" in str(r.get("by"))]

    spec = fed.spec(3)
    shards = fed.update(SITE, "eu-central")
    calls = {
        "info": lambda c: c.info(),
        "open-round": lambda c: c.open_round(spec),
        "push": lambda c: c.push(fed.manifest(SITE, "eu-central", spec, shards), spec.token, shards),
        "fetch": lambda c: c.fetch(1, "global"),
        "close-round": lambda c: c.close_round(3),
    }
    tls = _superlink_client_certificate(fed, tmp_path / "superlink")
    for call, attempt in calls.items():
        with (
            GrpcZoneClient(fed.endpoints["eu-central"], timeout=30, tls=tls) as c,
            pytest.raises(PushRejectedError) as info,
        ):
            attempt(c)
        assert info.value.code is RefusalCode.AUTHORITY, call
        assert "SuperLink's certificate, which may make no call" in str(info.value)
    refused = [
        r for r in fed.audit("eu-central") if r["decision"] == "refused" and r.get("by") == "superlink:superlink"
    ]
    assert {r["call"] for r in refused} >= set(calls)


# -- item 5: zones forward only to the reducing zone of their own config -------------------------------------


def test_a_zone_refuses_a_close_naming_another_forward_target(fed: LiveFederation) -> None:
    spec = fed.spec(4)
    fed.open_round(spec)
    us_site = "mayo-rochester"
    fed.push(us_site, "us-east", spec, seed=4)
    received = fed.info("eu-central")["partials_received"]
    with _Impostor(ZoneAggregator("eu-central", "EU"), fed.keys.aggregator.superlink) as capture:
        for target in (("eu-central", capture.endpoint), ("sg-central", fed.endpoints["sg-central"])):
            with fed.client("us-east", "coordinator") as c, pytest.raises(PushRejectedError) as info:
                c.close_round(4, forward_to=target)
            assert info.value.code is RefusalCode.AUTHORITY
            assert "own config" in str(info.value) and "nothing was forwarded" in str(info.value)
        assert capture.zone.stats.as_dict()["refused"] == 0
    records = fed.audit("us-east")
    refused = [
        r for r in records if r.get("call") == "close-round" and r.get("round") == 4 and r.get("code") == "authority"
    ]
    assert len(refused) == 2 and all(r["by"] == "coordinator:coordinator" for r in refused)
    assert not [r for r in records if r["decision"] == "forwarded" and r.get("round") == 4]
    assert fed.info("eu-central")["partials_received"] == received  # nothing reached the reducing zone
    # the round was kept: the honest close forwards to eu-central, as us-east's own config says
    groups = fed.close_round(4)
    assert us_site in groups["global"].sites
    forwarded = [r for r in fed.audit("us-east") if r["decision"] == "forwarded" and r.get("round") == 4]
    assert [r["to_zone"] for r in forwarded] == ["eu-central"]


# -- item 4: a site applies only what the publishing zone signed ---------------------------------------------


def test_a_site_applies_only_an_aggregate_its_zone_signed(fed: LiveFederation) -> None:
    spec = fed.spec(5)
    fed.open_round(spec)
    fed.push(SITE, "eu-central", spec, seed=5)
    fed.push("mayo-rochester", "us-east", spec, seed=6)
    groups = fed.close_round(5)
    summary = groups["regional/EU"]
    statement = AggregateStatement.from_bytes(summary.signature.statement)  # relayed in the CloseRound reply
    assert (statement.zone, statement.region, statement.round, statement.merkle_root) == (
        "eu-central",
        "EU",
        5,
        summary.merkle_root,
    )
    assert dict(statement.contributors) == {SITE: spec.weight_for(SITE)}
    key = AggregateKey("eu-central", "regional/EU")
    view = {key: [e.shard_id for e in summary.shards]}
    zones = {"eu-central": fed.endpoints["eu-central"]}
    applied = AppliedRound(round=5, merkle_root=summary.merkle_root, aggregates=[PublishedAggregate.of(summary)])
    fetched = fetch_view(SITE, applied, view, zones, _site_connect(fed))  # valid: the site takes it
    assert sorted(fetched.means) == sorted(view[key])
    # the coordinator relays another statement (the global aggregate's) in place of the zone's: refused
    other = PublishedAggregate.of(summary).model_copy(update={"signed": SignedStatement.of(groups["global"].signature)})
    lied = AppliedRound(round=5, merkle_root=summary.merkle_root, aggregates=[other])
    with pytest.raises(IntegrityError, match="did not serve: refusing to apply it"):
        fetch_view(SITE, lied, view, zones, _site_connect(fed))


class _Tampering(AggregateSigner):
    """A signer that signs something else than what the zone publishes, or spoils the signature."""

    def __init__(self, key: bytes, cert: bytes, *, root: str | None = None, spoil: bool = False) -> None:
        super().__init__(key, cert)
        self.root, self.spoil = root, spoil

    def sign(self, statement: AggregateStatement) -> AggregateSignature:
        signed = super().sign(replace(statement, merkle_root=self.root) if self.root else statement)
        if self.spoil:
            return replace(signed, signature=signed.signature[:-1] + bytes([signed.signature[-1] ^ 1]))
        return signed


@pytest.mark.parametrize(
    ("signer", "refusal"),
    [
        ("none", "is not signed by the zone"),
        ("us-east", r"is signed by zone us-east \(US\), not by the zone"),
        ("superlink", "signing certificate fails the federation's checks|is signed by superlink"),
        ("spoiled", "signature does not verify"),
        ("other-root", "not what was fetched"),
        ("eu-central", None),
    ],
)
def test_a_site_refuses_an_aggregate_not_signed_by_its_zone(
    fed: LiveFederation, signer: str, refusal: str | None
) -> None:
    """A server holding eu-central's own certificate (a breached zone host, or the zone's key
    elsewhere) serves an aggregate signed by someone else, or not at all: the site refuses it."""
    agg = fed.keys.aggregator
    files = {"eu-central": agg.zone("eu-central"), "us-east": agg.zone("us-east"), "superlink": agg.superlink}
    own = agg.zone("eu-central").read()
    signers = {
        "none": None,
        "spoiled": _Tampering(own[1], own[0], spoil=True),
        "other-root": _Tampering(own[1], own[0], root="ab" * 32),
        **{name: AggregateSigner(tls.read()[1], tls.read()[0]) for name, tls in files.items()},
    }
    zone = ZoneAggregator("eu-central", "EU", signer=signers[signer])
    update = random_update(7, PLAN)
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, (SITE,)))
    zone.push(manifest_for(SITE, update, plan=PLAN, zone="eu-central"), TOKEN, update)
    zone.close_round(1)
    with _Impostor(zone, agg.zone("eu-central")) as twin:
        client = _site_connect(fed)("eu-central", twin.endpoint)
        try:
            if refusal is None:
                aggregate = client.fetch(1, DEFAULT_GROUP, SITE)
                np.testing.assert_allclose(aggregate.means["w#r0c0"], update["w#r0c0"], rtol=1e-6)
            else:
                with pytest.raises(IntegrityError, match=refusal) as info:
                    client.fetch(1, DEFAULT_GROUP, SITE)
                assert "\n" not in str(info.value)
        finally:
            client.close()


# -- keys upgrade: a folder of an earlier release, then a push -----------------------------------------------


def test_keys_upgrade_reissues_old_certificates_and_a_push_then_works(fed: LiveFederation, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    shutil.copytree(fed.keys.root, keys)
    ca_dir = keys / "ca"
    agg = keys / "aggregator"
    old = {agg / "superlink.pem": Role.SUPERLINK, agg / "zones" / "eu-central.pem": Role.ZONE}
    old[keys / "sites" / SITE / f"{SITE}.pem"] = Role.SITE
    for path, role in old.items():
        _legacy(ca_dir, path, role)
    site_old = TlsFiles(keys / "sites" / SITE / f"{SITE}.pem", keys / "sites" / SITE / f"{SITE}.key", agg / "ca.pem")
    zone_tls = TlsFiles(agg / "zones" / "eu-central.pem", agg / "zones" / "eu-central.key", agg / "ca.pem")
    site_cert_before = site_old.cert.read_bytes()
    untouched = {p: p.read_bytes() for p in keys.rglob("*") if p.is_file() and p not in old}

    zc = next(z for z in fed.config.zones if z.name == "eu-central")
    spec = fed.spec(1)
    shards = fed.update(SITE, "eu-central")
    manifest = fed.manifest(SITE, "eu-central", spec, shards)
    connect = tls_connector(site_old, _regions(fed))
    with (
        _Impostor(ZoneAggregator("eu-central", "EU"), zone_tls) as before,  # the old zone certificate
        connect("eu-central", before.endpoint) as c,  # type: ignore[attr-defined]
        pytest.raises(PeerIdentityError, match="keys upgrade"),
    ):
        c.push(manifest, spec.token, shards)

    runner = CliRunner()
    result = runner.invoke(app, ["keys", "upgrade", "--keys", str(keys)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    certificates = sorted(p for p in keys.rglob("*.pem") if p.parent.name != "ca" and p.name != "ca.pem")
    assert len(lines) == len(certificates)
    assert sorted(line.split()[0] for line in lines) == ["current"] * (len(lines) - 3) + ["re-issued"] * 3
    assert "superlink superlink (EU)" in result.output and "zone eu-central (EU)" in result.output
    assert {p: p.read_bytes() for p in untouched} == untouched  # nothing else rewritten, keys included
    again = runner.invoke(app, ["keys", "upgrade", "--keys", str(keys)], env={"COLUMNS": "300"})
    assert again.exit_code == 0 and "re-issued" not in again.output
    superlink = read_identity((agg / "superlink.pem").read_bytes(), (agg / "ca.pem").read_bytes())
    assert superlink.role is Role.SUPERLINK

    # the zone restarts on its re-issued certificate (same key); the site pushes with its old one, then its new one
    zone = make_zone(
        zc, tmp_path / "store", routing=fed.routing, site_keys=load_site_keys(agg / "site-keys"), tls=zone_tls
    )
    zone.open_round(spec)
    with _Impostor(zone, zone_tls) as after:
        assert site_old.cert.read_bytes() != site_cert_before
        stale = tmp_path / "stale.pem"
        stale.write_bytes(site_cert_before)  # the site did not get its new certificate yet
        for tls in (TlsFiles(stale, site_old.key, site_old.ca), site_old):
            client = tls_connector(tls, _regions(fed))("eu-central", after.endpoint)
            try:
                receipt = client.push(manifest, spec.token, shards)
                assert receipt.site_id == SITE
            except PushRejectedError as exc:  # the second push of the same manifest: already counted
                assert exc.code is RefusalCode.DUPLICATE
            finally:
                client.close()
    zone.close()


# -- item 12: `fedshard audit verify` is bound to the zone whose log it is -----------------------------------


def _snapshot_audit(store: Path, into: Path) -> None:
    """A consistent copy of a live zone's audit log and signed head: the zone may append (and
    sign) between two file copies, so copy until the head is the same before and after the log."""
    for _ in range(50):
        head = (store / "audit.head.json").read_bytes()
        shutil.copy(store / "audit.jsonl", into / "audit.jsonl")
        if (store / "audit.head.json").read_bytes() == head:
            (into / "audit.head.json").write_bytes(head)
            return
        time.sleep(0.05)
    raise AssertionError(f"{store}: the zone kept appending to its audit log")


def test_audit_verify_refuses_another_zones_log_and_a_log_signed_by_the_superlink(
    fed: LiveFederation, tmp_path: Path
) -> None:
    agg = fed.keys.aggregator
    ca = agg.ca.read_bytes()
    us = tmp_path / "us"
    us.mkdir()
    _snapshot_audit(fed.stores["us-east"], us)
    verifier = HeadVerifier(ca_pem=ca)
    assert verify_audit_log(us / "audit.jsonl", verifier=verifier, zone="us-east").ok
    swapped = verify_audit_log(
        us / "audit.jsonl", verifier=verifier, zone="eu-central"
    )  # us-east's in eu-central's place
    assert not swapped.ok and "not eu-central" in str(swapped.reason)

    legacy = tmp_path / "legacy-superlink"
    legacy.mkdir()
    shutil.copy(agg.superlink.cert, legacy / "superlink.pem")
    shutil.copy(agg.superlink.key, legacy / "superlink.key")
    _legacy(fed.keys.ca_dir, legacy / "superlink.pem", Role.SUPERLINK)
    signers = {
        "superlink": (agg.superlink.key, agg.superlink.cert, "not a zone's"),
        "legacy superlink": (
            legacy / "superlink.key",
            legacy / "superlink.pem",
            "signed with the certificate of zone superlink",
        ),
        "us-east": (
            agg.zone("us-east").key,
            agg.zone("us-east").cert,
            "signed with the certificate of zone us-east (US)",
        ),
    }
    for name, (key, cert, refusal) in signers.items():
        path = tmp_path / name.replace(" ", "-") / "audit.jsonl"
        log = AuditLog(path, signer=HeadSigner.from_files(key, cert))
        log.append("accepted", zone="eu-central", region="EU", site="x")
        log.close()
        verdict = verify_audit_log(path, verifier=verifier)
        assert not verdict.ok and refusal in str(verdict.reason), (name, verdict.reason)
        with pytest.raises(FedshardError) as info:
            CliRunner().invoke(
                app, ["audit", "verify", "--log", str(path), "--ca", str(agg.ca)], catch_exceptions=False
            )
        assert "fails verification" in str(info.value) and "\n" not in str(info.value)
