"""Federation PKI: CA, zone and site certificates, identities read back, files written once."""

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

from fedshard.crypto.pki import (
    JURISDICTION_OID,
    CaPaths,
    Identity,
    Role,
    init_ca,
    issue_site,
    issue_zone,
    read_identity,
    read_pem,
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
    assert sans.get_values_for_type(x509.DNSName) == ["zone.example"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("::1")]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]


def test_default_zone_hosts_are_loopback(ca: CaPaths, tmp_path: Path) -> None:
    zone = issue_zone(ca.cert.parent, "eu-1", "EU", tmp_path, now=T0)
    sans = x509.load_pem_x509_certificate(zone.cert.read_bytes()).extensions
    names = sans.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
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
