"""Federation PKI: CA, zone, site, coordinator and SuperLink certificates, identities read back,
files written once; certificates of an earlier release read and re-issued (``keys upgrade``)."""

from __future__ import annotations

import ipaddress
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedshard.crypto.identity import (
    REGION_OID,
    ROLE_OID,
    CheckedCertificates,
    ZoneId,
    claimed_identity,
    utf8_string,
    zone_host,
)
from fedshard.crypto.pki import (
    JURISDICTION_OID,
    CaPaths,
    Identity,
    Role,
    init_ca,
    issue_coordinator,
    issue_site,
    issue_superlink,
    issue_zone,
    read_identity,
    read_pem,
    reissue,
)
from fedshard.errors import ConfigError, FedshardError, PkiError

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def ca(tmp_path: Path) -> CaPaths:
    return init_ca(tmp_path / "ca", now=T0)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_site_identity_carries_jurisdiction(ca: CaPaths, tmp_path: Path) -> None:
    site = issue_site(ca.cert.parent, "hospital-a", "EU", tmp_path / "site", now=T0)
    identity = read_identity(site.cert.read_bytes(), ca.cert.read_bytes(), now=T0 + timedelta(days=1))
    assert identity.name == "hospital-a"
    assert identity.role is Role.SITE
    assert str(identity.role) == "site"
    assert identity.jurisdiction_or_region == "EU"
    assert len(identity.fingerprint) == 64

    cert = x509.load_pem_x509_certificate(site.cert.read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "jurisdiction=EU"
    ext = cert.extensions.get_extension_for_oid(JURISDICTION_OID)
    assert not ext.critical
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)


def test_zone_identity_carries_region_and_hosts(ca: CaPaths, tmp_path: Path) -> None:
    zone = issue_zone(ca.cert.parent, "eu-central", "EU", tmp_path / "zone", hosts=("zone.example", "::1"), now=T0)
    identity = read_identity(zone.cert.read_bytes(), ca.cert.read_bytes(), now=T0)
    assert identity == Identity("eu-central", Role.ZONE, "EU", identity.fingerprint)

    cert = x509.load_pem_x509_certificate(zone.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["zone.example", zone_host("eu-central", "EU")]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("::1")]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]


def test_default_zone_hosts_are_loopback(ca: CaPaths, tmp_path: Path) -> None:
    zone = issue_zone(ca.cert.parent, "eu-1", "EU", tmp_path, now=T0)
    sans = x509.load_pem_x509_certificate(zone.cert.read_bytes()).extensions
    names = sans.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost", zone_host("eu-1", "EU")]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def test_certificate_from_another_ca_is_refused(ca: CaPaths, tmp_path: Path) -> None:
    rogue = init_ca(tmp_path / "rogue", "rogue CA", now=T0)
    forged = issue_site(rogue.cert.parent, "hospital-a", "EU", tmp_path / "forged", now=T0)
    with pytest.raises(PkiError, match="not issued by the federation CA") as info:
        read_identity(forged.cert.read_bytes(), ca.cert.read_bytes(), now=T0)
    assert isinstance(info.value, PermissionError)
    assert isinstance(info.value, FedshardError)


def test_same_ca_name_different_key_is_refused(ca: CaPaths, tmp_path: Path) -> None:
    twin = init_ca(tmp_path / "twin", now=T0)  # same subject, another key: only the signature tells them apart
    forged = issue_site(twin.cert.parent, "hospital-a", "EU", tmp_path / "forged", now=T0)
    with pytest.raises(PkiError, match="not issued"):
        read_identity(forged.cert.read_bytes(), ca.cert.read_bytes(), now=T0)


def test_expired_and_not_yet_valid_certificates_are_refused(ca: CaPaths, tmp_path: Path) -> None:
    site = issue_site(ca.cert.parent, "bank-1", "US", tmp_path, now=T0, days=30)
    pem, ca_pem = site.cert.read_bytes(), ca.cert.read_bytes()
    assert read_identity(pem, ca_pem, now=T0 + timedelta(days=29)).jurisdiction_or_region == "US"
    with pytest.raises(PkiError, match="expired"):
        read_identity(pem, ca_pem, now=T0 + timedelta(days=31))
    with pytest.raises(PkiError, match="not valid before"):
        read_identity(pem, ca_pem, now=T0 - timedelta(days=1))


def test_a_remembered_certificate_is_refused_outside_its_validity_and_another_cas_never_passes(
    ca: CaPaths, tmp_path: Path
) -> None:
    """What a zone remembers of its callers' certificates answers as read_identity would."""
    checked = CheckedCertificates(ca.cert.read_bytes())
    site = issue_site(ca.cert.parent, "bank-1", "US", tmp_path / "s", now=T0, days=30)
    pem = site.cert.read_bytes()
    first = checked.identity(pem, now=T0 + timedelta(days=1))
    assert checked.identity(pem, now=T0 + timedelta(days=29)) is first  # remembered, not checked again
    with pytest.raises(PkiError, match="expired"):
        checked.identity(pem, now=T0 + timedelta(days=31))
    with pytest.raises(PkiError, match="not valid before"):
        checked.identity(pem, now=T0 - timedelta(days=1))
    rogue = init_ca(tmp_path / "rogue", "rogue CA", now=T0)
    forged = issue_site(rogue.cert.parent, "bank-1", "US", tmp_path / "forged", now=T0)
    for _ in range(2):
        with pytest.raises(PkiError, match="not issued by the federation CA"):
            checked.identity(forged.cert.read_bytes(), now=T0 + timedelta(days=1))


def test_leaf_validity_is_cut_to_the_ca(tmp_path: Path) -> None:
    ca = init_ca(tmp_path / "ca", now=T0, days=10)
    site = issue_site(ca.cert.parent, "s1", "EU", tmp_path, now=T0, days=825)
    cert = x509.load_pem_x509_certificate(site.cert.read_bytes())
    assert cert.not_valid_after_utc == x509.load_pem_x509_certificate(ca.cert.read_bytes()).not_valid_after_utc


def test_expired_ca_cannot_issue(ca: CaPaths, tmp_path: Path) -> None:
    with pytest.raises(PkiError, match="expired"):
        issue_site(ca.cert.parent, "s1", "EU", tmp_path, now=T0 + timedelta(days=3651))


def test_ca_certificate_is_not_an_identity(ca: CaPaths) -> None:
    with pytest.raises(PkiError, match="CA certificate"):
        read_identity(ca.cert.read_bytes(), ca.cert.read_bytes(), now=T0)


def test_leaf_is_not_a_ca(ca: CaPaths, tmp_path: Path) -> None:
    site = issue_site(ca.cert.parent, "s1", "EU", tmp_path, now=T0)
    with pytest.raises(PkiError, match="not a CA"):
        read_identity(site.cert.read_bytes(), site.cert.read_bytes(), now=T0)


def test_certificate_without_jurisdiction_is_refused(ca: CaPaths) -> None:
    """A CA-signed client certificate that lacks fedshard's extension says nothing about residency."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "s1")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(T0)
        .not_valid_after(T0 + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    with pytest.raises(PkiError, match="carries no jurisdiction"):
        read_identity(cert.public_bytes(serialization.Encoding.PEM), ca.cert.read_bytes(), now=T0)


def test_garbage_is_refused(ca: CaPaths) -> None:
    with pytest.raises(PkiError, match="not a PEM"):
        read_identity(b"not a certificate", ca.cert.read_bytes(), now=T0)


def test_no_overwrite_without_force(ca: CaPaths, tmp_path: Path) -> None:
    site = issue_site(ca.cert.parent, "s1", "EU", tmp_path, now=T0)
    before = site.key.read_bytes()
    with pytest.raises(PkiError, match="already exists: pass --force") as info:
        issue_site(ca.cert.parent, "s1", "EU", tmp_path, now=T0)
    assert "\n" not in str(info.value)
    assert site.key.read_bytes() == before
    with pytest.raises(PkiError, match="--force"):
        init_ca(ca.cert.parent, now=T0)

    issue_site(ca.cert.parent, "s1", "UK", tmp_path, now=T0, force=True)
    assert site.key.read_bytes() != before
    assert read_identity(site.cert.read_bytes(), ca.cert.read_bytes(), now=T0).jurisdiction_or_region == "UK"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["s1.key", "s1.pem"]  # no temp files left


def test_key_files_are_private_certificates_readable(tmp_path: Path) -> None:
    old = os.umask(0o077)  # modes are exact, whatever the umask
    try:
        ca = init_ca(tmp_path / "ca", now=T0)
        zone = issue_zone(ca.cert.parent, "eu-1", "EU", tmp_path / "zone", now=T0)
    finally:
        os.umask(old)
    for paths in (ca, zone):
        assert _mode(paths.key) == 0o600
        assert _mode(paths.cert) == 0o644


def test_bad_names_are_config_errors(ca: CaPaths, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="jurisdiction 'eu'"):
        issue_site(ca.cert.parent, "s1", "eu", tmp_path, now=T0)
    with pytest.raises(ConfigError, match="site id"):
        issue_site(ca.cert.parent, "../s1", "EU", tmp_path, now=T0)
    with pytest.raises(ConfigError, match="host"):
        issue_zone(ca.cert.parent, "z", "EU", tmp_path, hosts=("bad host",), now=T0)
    with pytest.raises(ConfigError, match="at least one host"):
        issue_zone(ca.cert.parent, "z", "EU", tmp_path, hosts=(), now=T0)
    assert not list(tmp_path.glob("s1*")) and not list(tmp_path.glob("z.*"))


def test_missing_ca_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PkiError, match="cannot read") as info:
        issue_site(tmp_path / "nowhere", "s1", "EU", tmp_path / "out", now=T0)
    assert "\n" not in str(info.value)
    with pytest.raises(PkiError, match="cannot read"):
        read_pem(tmp_path / "nowhere.pem")


def test_mismatched_ca_key_is_refused(ca: CaPaths, tmp_path: Path) -> None:
    other = init_ca(tmp_path / "other", now=T0)
    ca.key.chmod(0o600)
    ca.key.write_bytes(other.key.read_bytes())
    with pytest.raises(PkiError, match="not the key of"):
        issue_site(ca.cert.parent, "s1", "EU", tmp_path / "out", now=T0)


def test_naive_now_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        init_ca(tmp_path, now=datetime(2030, 1, 1))


# -- roles and zone identities -----------------------------------------------------------------------------


def _role_of(path: Path) -> str | None:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    try:
        value = cert.extensions.get_extension_for_oid(ROLE_OID).value
    except x509.ExtensionNotFound:
        return None
    assert isinstance(value, x509.UnrecognizedExtension)
    return value.value[2:].decode()


def test_every_certificate_names_its_role(ca: CaPaths, tmp_path: Path) -> None:
    issued = {
        Role.SITE: issue_site(ca.cert.parent, "s1", "EU", tmp_path, now=T0),
        Role.ZONE: issue_zone(ca.cert.parent, "eu-1", "EU", tmp_path, now=T0),
        Role.COORDINATOR: issue_coordinator(ca.cert.parent, "EU", tmp_path, now=T0),
        Role.SUPERLINK: issue_superlink(ca.cert.parent, "EU", tmp_path, hosts=("link.example",), now=T0),
    }
    for role, paths in issued.items():
        assert _role_of(paths.cert) == role.value
        identity = read_identity(paths.cert.read_bytes(), ca.cert.read_bytes(), now=T0)
        assert identity.role is role and not identity.legacy
    superlink = x509.load_pem_x509_certificate(issued[Role.SUPERLINK].cert.read_bytes())
    names = superlink.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["link.example"]  # no zone's identity name
    assert list(superlink.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]


def test_zone_hosts_differ_by_name_region_and_case() -> None:
    hosts = {
        zone_host(n, r) for n, r in [("eu-1", "EU"), ("eu-1", "US"), ("EU-1", "EU"), ("eu_1", "EU"), ("eu.1", "EU")]
    }
    assert len(hosts) == 5
    assert all(h.endswith(".zone.fedshard.invalid") and h.count(".") == 3 for h in hosts)
    assert ZoneId("eu-1", "EU").host == zone_host("eu-1", "EU")
    long = zone_host("z" * 63, "ABCDEFGH")
    assert len(long.split(".")[0]) <= 63


def _legacy(ca: CaPaths, tmp_path: Path, name: str, place: str, *, server: bool) -> Path:
    """A certificate as fedshard issued it before roles were written (no ROLE_OID, no zone host)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    eku = (
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        if server
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(T0 - timedelta(days=1))
        .not_valid_after(T0 + timedelta(days=100))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(
            x509.UnrecognizedExtension(REGION_OID if server else JURISDICTION_OID, utf8_string(place)), critical=False
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    )
    path = tmp_path / f"{name}.pem"
    path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def test_legacy_certificates_are_read_by_their_key_usage(ca: CaPaths, tmp_path: Path) -> None:
    site = read_identity(_legacy(ca, tmp_path, "s1", "EU", server=False).read_bytes(), ca.cert.read_bytes(), now=T0)
    zone = read_identity(_legacy(ca, tmp_path, "eu-1", "EU", server=True).read_bytes(), ca.cert.read_bytes(), now=T0)
    assert (site.role, site.legacy) == (Role.SITE, True)
    assert (zone.role, zone.legacy) == (Role.ZONE, True)


def test_reissue_keeps_the_key_adds_role_and_zone_host_and_is_idempotent(ca: CaPaths, tmp_path: Path) -> None:
    path = _legacy(ca, tmp_path, "eu-1", "EU", server=True)
    old = x509.load_pem_x509_certificate(path.read_bytes())
    identity = reissue(ca.cert.parent, path, Role.ZONE, now=T0)
    assert identity is not None and (identity.name, identity.jurisdiction_or_region) == ("eu-1", "EU")
    new = x509.load_pem_x509_certificate(path.read_bytes())
    assert new.public_key() == old.public_key()  # the zone keeps its key: nothing secret moves
    assert new.not_valid_after_utc == old.not_valid_after_utc
    dns = new.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert dns == ["localhost", zone_host("eu-1", "EU")]
    assert _role_of(path) == "zone"
    assert not read_identity(path.read_bytes(), ca.cert.read_bytes(), now=T0).legacy
    before = path.read_bytes()
    assert reissue(ca.cert.parent, path, Role.ZONE, now=T0) is None  # current: left as it is
    assert path.read_bytes() == before


def test_reissue_makes_the_old_superlink_zone_certificate_a_superlink_one(ca: CaPaths, tmp_path: Path) -> None:
    path = _legacy(ca, tmp_path, "superlink", "EU", server=True)
    identity = reissue(ca.cert.parent, path, Role.SUPERLINK, now=T0)
    assert identity is not None and identity.role is Role.SUPERLINK
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert dns == ["localhost"]
    site = issue_site(ca.cert.parent, "s1", "EU", tmp_path / "s", now=T0)
    with pytest.raises(PkiError, match="not of a zone"):
        reissue(ca.cert.parent, site.cert, Role.ZONE, now=T0)


def test_a_certificate_claiming_a_role_against_its_key_usage_is_refused(ca: CaPaths, tmp_path: Path) -> None:
    path = _legacy(ca, tmp_path, "s1", "EU", server=False)
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    for role in ("zone", "superlink", "emperor"):
        builder = x509.CertificateBuilder(
            cert.issuer,
            cert.subject,
            cert.public_key(),
            x509.random_serial_number(),
            cert.not_valid_before_utc,
            cert.not_valid_after_utc,
            [
                *cert.extensions,
                x509.Extension(ROLE_OID, False, x509.UnrecognizedExtension(ROLE_OID, utf8_string(role))),
            ],
        )
        pem = builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        with pytest.raises(PkiError, match="role"):
            read_identity(pem, ca.cert.read_bytes(), now=T0)
        with pytest.raises(PkiError, match="role"):
            claimed_identity(pem)


def test_a_certificate_names_the_hosts_it_was_issued_for_and_no_other(ca: CaPaths, tmp_path: Path) -> None:
    from fedshard.crypto.identity import host_names, names_host

    paths = issue_superlink(ca.cert.parent, "EU", tmp_path, hosts=("Aggregator.example", "10.0.0.2"), now=T0)
    cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
    assert host_names(cert) == ["Aggregator.example", "10.0.0.2"]
    assert names_host(cert, "aggregator.example") and names_host(cert, "aggregator.example.")
    assert names_host(cert, "10.0.0.2")
    assert not names_host(cert, "10.0.0.3") and not names_host(cert, "other.example")
