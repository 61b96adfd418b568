"""``fedshard keys init``: every key a deployed federation needs, in one step; ``fedshard keys
upgrade``: a folder of an earlier release brought up to date.

Reuses the PKI (:mod:`fedshard.crypto.pki`), signing and HE helpers; adds the
SuperNode authentication keys Flower's SuperLink checks. Every file is written once,
atomically, with restrictive permissions; without ``force`` nothing is overwritten.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fedshard.config import FederationConfig
from fedshard.config.layout import KeysLayout
from fedshard.crypto.key_files import CERT_MODE, KEY_MODE, refuse_existing, write_files
from fedshard.errors import ConfigError

__all__ = ["ProvisionReport", "Upgraded", "generate_supernode_key", "provision", "upgrade"]


@dataclass
class ProvisionReport:
    """What :func:`provision` wrote."""

    layout: KeysLayout
    files: list[Path] = field(default_factory=list)


def generate_supernode_key(private_path: Path, public_path: Path, *, force: bool = False) -> None:
    """A SuperNode authentication key pair: EC P-384, private key in OpenSSH format (``0600``),
    public key as one OpenSSH line (what ``flwr supernode register`` takes)."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH) + b"\n"
    write_files([(private_path, private, KEY_MODE), (public_path, public, CERT_MODE)], force)


def _superlink_hosts(config: FederationConfig) -> tuple[str, ...]:
    assert config.deployment is not None
    hosts = ["localhost", "127.0.0.1", config.deployment.superlink_host, *config.deployment.hosts]
    return tuple(dict.fromkeys(hosts))


def _zone_hosts(endpoint: str) -> tuple[str, ...]:
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    return tuple(dict.fromkeys(["localhost", "127.0.0.1", *([host] if host not in ("0.0.0.0", "::") else [])]))


def provision(config: FederationConfig, out: Path, *, force: bool = False, add: bool = False) -> ProvisionReport:
    """Write the federation's keys under ``out`` (see :mod:`fedshard.config.layout`).

    With ``add``, only the zones and sites that have no keys under ``out`` yet get them
    (a federation that grows), issued by the CA already there; every existing file is
    kept, and a new site's HE secret context is the federation's (copied from a site's
    bundle). :attr:`ProvisionReport.files` lists what was written.

    Raises
    ------
    ConfigError
        The config has no ``deployment`` section; with ``add``: no CA under ``out``, or
        no site bundle to take the HE secret context from.
    PkiError
        A file exists and ``force`` is false (nothing is written then), or a file cannot be written.
    """
    if add:
        return _provision_added(config, Path(out))
    from fedshard.crypto.he import PUBLIC_CONTEXT_FILE, SECRET_CONTEXT_FILE, he_init
    from fedshard.crypto.pki import CA_CERT_FILE, CA_KEY_FILE, init_ca, issue_coordinator, issue_superlink, issue_zone

    if config.deployment is None:
        raise ConfigError("the config has no `deployment` section; see configs/aggregator.yaml")
    layout = KeysLayout(Path(out))
    agg = layout.aggregator
    encrypting = config.residency.encrypting
    planned = [layout.ca_dir / CA_CERT_FILE, layout.ca_dir / CA_KEY_FILE, agg.ca, agg.superlink.cert, agg.superlink.key]
    planned += [agg.coordinator.cert, agg.coordinator.key]
    for zone in config.zones:
        planned += [agg.zone(zone.name).cert, agg.zone(zone.name).key]
    for site in config.sites:
        bundle = layout.site(site.id)
        planned += [bundle.tls.cert, bundle.tls.key, bundle.supernode_key, bundle.signing_key, bundle.store_kek]
        planned += [agg.site_keys / f"{site.id}.pub", agg.supernode_key(site.id)]
        if encrypting:
            planned.append(bundle.he / SECRET_CONTEXT_FILE)
    if encrypting:
        planned.append(agg.he / PUBLIC_CONTEXT_FILE)
    refuse_existing(planned, force)  # all or nothing: check before the first write

    report = ProvisionReport(layout)
    ca = init_ca(layout.ca_dir, f"{config.federation.name} federation CA", force=force)
    ca_pem = ca.cert.read_bytes()
    write_files([(agg.ca, ca_pem, CERT_MODE)], force)
    region = next(z.region for z in config.zones if z.name == (config.reducing_zone or config.zones[0].name))
    issue_superlink(layout.ca_dir, region, agg.root, hosts=_superlink_hosts(config), force=force)
    issue_coordinator(layout.ca_dir, region, agg.root, name=agg.coordinator.cert.stem, force=force)
    for zone in config.zones:
        issue_zone(
            layout.ca_dir, zone.name, zone.region, agg.root / "zones", hosts=_zone_hosts(zone.endpoint), force=force
        )
    secret_ctx = b""
    if encrypting:
        with tempfile.TemporaryDirectory(dir=layout.root) as tmp:
            secret_path, public_path = he_init(tmp, scheme=config.he.scheme)
            secret_ctx = secret_path.read_bytes()
            write_files([(agg.he / PUBLIC_CONTEXT_FILE, public_path.read_bytes(), CERT_MODE)], force)
    for site in config.sites:
        _site_bundle(layout, site.id, site.jurisdiction, ca_pem, secret_ctx, force=force)
    report.files = sorted(p for p in layout.root.rglob("*") if p.is_file())
    return report


def _site_bundle(
    layout: KeysLayout, site_id: str, jurisdiction: str, ca_pem: bytes, secret_ctx: bytes, *, force: bool
) -> None:
    """A site's bundle (client certificate, CA, SuperNode key, signing key, store KEK, the HE
    secret context when ``secret_ctx``) and its public keys on the aggregator's side."""
    from fedshard.crypto.at_rest import Kek
    from fedshard.crypto.he import SECRET_CONTEXT_FILE
    from fedshard.crypto.pki import issue_site
    from fedshard.crypto.signing import generate_signing_key, public_key_path

    agg, bundle = layout.aggregator, layout.site(site_id)
    issue_site(layout.ca_dir, site_id, jurisdiction, bundle.root, force=force)
    write_files([(bundle.root / "ca.pem", ca_pem, CERT_MODE)], force)
    generate_supernode_key(bundle.supernode_key, agg.supernode_key(site_id), force=force)
    generate_signing_key(bundle.signing_key, force=force)
    write_files(
        [(agg.site_keys / f"{site_id}.pub", public_key_path(bundle.signing_key).read_bytes(), CERT_MODE)], force
    )
    write_files([(bundle.store_kek, Kek.generate().to_text().encode(), KEY_MODE)], force)
    if secret_ctx:  # every site holds the one HE secret key; zones only the public context
        write_files([(bundle.he / SECRET_CONTEXT_FILE, secret_ctx, KEY_MODE)], force)


def _provision_added(config: FederationConfig, out: Path) -> ProvisionReport:
    """:func:`provision` with ``add``: keys for the zones and sites that have none yet."""
    from fedshard.crypto.he import SECRET_CONTEXT_FILE
    from fedshard.crypto.pki import CA_CERT_FILE, CA_KEY_FILE, issue_zone

    layout = KeysLayout(out)
    agg = layout.aggregator
    if not (layout.ca_dir / CA_KEY_FILE).exists():
        raise ConfigError(
            f"{layout.ca_dir / CA_KEY_FILE} is missing: --add issues from the federation's CA; bring its key "
            "back from where it is kept offline (or run `fedshard keys init` for a new federation)"
        )
    ca_pem = (layout.ca_dir / CA_CERT_FILE).read_bytes()
    zones = [z for z in config.zones if not agg.zone(z.name).cert.exists()]
    sites = [s for s in config.sites if not layout.site(s.id).tls.cert.exists()]
    secret_ctx = b""
    if sites and config.residency.encrypting:
        found = [layout.site(s.id).he / SECRET_CONTEXT_FILE for s in config.sites if s not in sites]
        held = next((p for p in found if p.exists()), None)
        if held is None:
            raise ConfigError(
                f"no site bundle under {layout.root / 'sites'} holds the federation's HE secret context to give "
                "the new sites; add sites from the folder `keys init` wrote"
            )
        secret_ctx = held.read_bytes()
    planned = [p for z in zones for p in (agg.zone(z.name).cert, agg.zone(z.name).key)]
    for site in sites:
        bundle = layout.site(site.id)
        planned += [bundle.supernode_key, bundle.signing_key, bundle.store_kek]
        planned += [agg.site_keys / f"{site.id}.pub", agg.supernode_key(site.id)]
    refuse_existing(planned, False)  # all or nothing, as provision
    before = {p for p in layout.root.rglob("*") if p.is_file()}
    for zone in zones:
        issue_zone(layout.ca_dir, zone.name, zone.region, agg.root / "zones", hosts=_zone_hosts(zone.endpoint))
    for site in sites:
        _site_bundle(layout, site.id, site.jurisdiction, ca_pem, secret_ctx, force=False)
    report = ProvisionReport(layout)
    report.files = sorted(p for p in layout.root.rglob("*") if p.is_file() and p not in before)
    return report


@dataclass(frozen=True)
class Upgraded:
    """One certificate :func:`upgrade` looked at.

    Attributes
    ----------
    path:
        The certificate file.
    holder:
        Whom it names, after the upgrade (e.g. ``zone eu-central (EU)``).
    changed:
        Whether it was re-issued (False: it was already current, and left as it was).
    """

    path: Path
    holder: str
    changed: bool


def upgrade(out: Path) -> list[Upgraded]:
    """Re-issue, from the CA key under ``out``, every certificate of the folder that ``fedshard
    keys init`` wrote whose role (or, for a zone, identity name) is missing; one entry per
    certificate.

    Each keeps its key pair, name, place, hosts and expiry (:func:`fedshard.crypto.pki.reissue`);
    the SuperLink's, issued as a zone's before, becomes a SuperLink's. Nothing else is
    rewritten, and running it again changes nothing.

    Raises
    ------
    ConfigError
        ``out`` holds no CA key (or no certificate at all).
    PkiError
        A certificate was not issued by this CA, or has expired (nothing after it is changed).
    """
    from fedshard.crypto.identity import claimed_identity, read_pem
    from fedshard.crypto.pki import CA_KEY_FILE, Role, reissue

    layout = KeysLayout(Path(out))
    agg = layout.aggregator
    if not (layout.ca_dir / CA_KEY_FILE).exists():
        raise ConfigError(
            f"{layout.ca_dir / CA_KEY_FILE} is missing: `keys upgrade` re-issues certificates from the federation's "
            "CA; bring its key back from where it is kept offline, or point --keys at the folder `keys init` wrote"
        )
    found: list[tuple[Path, Role]] = [(agg.superlink.cert, Role.SUPERLINK), (agg.coordinator.cert, Role.COORDINATOR)]
    found += [(p, Role.ZONE) for p in sorted((agg.root / "zones").glob("*.pem"))]
    found += [
        (layout.site(d.name).tls.cert, Role.SITE) for d in sorted((layout.root / "sites").glob("*")) if d.is_dir()
    ]
    found = [(path, role) for path, role in found if path.exists()]
    if not found:
        raise ConfigError(f"{out} holds no certificate `fedshard keys init` writes; point --keys at that folder")
    done = []
    for path, role in found:
        identity = reissue(layout.ca_dir, path, role)
        if identity is None:
            done.append(Upgraded(path, str(claimed_identity(read_pem(path))), changed=False))
        else:
            done.append(Upgraded(path, str(identity), changed=True))
    return done
