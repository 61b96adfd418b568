"""Where ``fedshard keys init`` puts every key, and where each command finds it.

::

    keys/
      ca/                      ca.pem, ca.key      the federation CA; keep ca.key offline
      aggregator/              stays on the aggregator host
        ca.pem
        superlink.pem/.key     SuperLink server certificate
        coordinator.pem/.key   the coordinator's client certificate: the only one zones let open/close rounds
        zones/<zone>.pem/.key  zone certificates (region inside)
        site-keys/<site>.pub   sites' manifest-signing public keys (zones refuse unsigned manifests)
        supernodes/<site>.pub  sites' SuperNode authentication public keys (registered at the SuperLink)
        he/public.ctx          HE context without the secret key (when residency.encrypt is on)
      sites/<site>/            hand this folder to the site, and nothing else
        ca.pem
        <site>.pem/.key        client certificate (jurisdiction inside) for the zones
        supernode.key          SuperNode authentication private key (OpenSSH, EC P-384)
        signing.key(.pub)      Ed25519 manifest-signing key
        he/secret.ctx          HE context with the secret key (when residency.encrypt is on)
        store.kek              key-encryption key of the site's on-prem shard store
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedshard.crypto.tls import TlsFiles

__all__ = ["AggregatorKeys", "KeysLayout", "SiteBundle"]


@dataclass(frozen=True)
class AggregatorKeys:
    """The aggregator host's keys (``keys/aggregator``)."""

    root: Path

    @property
    def ca(self) -> Path:
        """The federation CA certificate."""
        return self.root / "ca.pem"

    @property
    def superlink(self) -> TlsFiles:
        """The SuperLink's certificate and key."""
        return TlsFiles(self.root / "superlink.pem", self.root / "superlink.key", self.ca)

    @property
    def coordinator(self) -> TlsFiles:
        """The coordinator's client certificate and key (what it shows zones to drive rounds)."""
        return TlsFiles(self.root / "coordinator.pem", self.root / "coordinator.key", self.ca)

    def zone(self, name: str) -> TlsFiles:
        """A zone's certificate and key."""
        return TlsFiles(self.root / "zones" / f"{name}.pem", self.root / "zones" / f"{name}.key", self.ca)

    @property
    def site_keys(self) -> Path:
        """Folder of the sites' manifest-signing public keys (``<site>.pub``)."""
        return self.root / "site-keys"

    def supernode_key(self, site_id: str) -> Path:
        """A site's SuperNode authentication public key (OpenSSH)."""
        return self.root / "supernodes" / f"{site_id}.pub"

    @property
    def he(self) -> Path:
        """Folder of the public HE context."""
        return self.root / "he"


@dataclass(frozen=True)
class SiteBundle:
    """One site's keys (``keys/sites/<site>``): everything the site needs, nothing more."""

    root: Path

    @property
    def tls(self) -> TlsFiles:
        """The site's client certificate for the zones."""
        name = self.root.name
        return TlsFiles(self.root / f"{name}.pem", self.root / f"{name}.key", self.root / "ca.pem")

    @property
    def supernode_key(self) -> Path:
        """The SuperNode authentication private key."""
        return self.root / "supernode.key"

    @property
    def signing_key(self) -> Path:
        """The Ed25519 manifest-signing key."""
        return self.root / "signing.key"

    @property
    def he(self) -> Path:
        """Folder of the secret HE context."""
        return self.root / "he"

    @property
    def store_kek(self) -> Path:
        """The key-encryption key of the site's shard store."""
        return self.root / "store.kek"


@dataclass(frozen=True)
class KeysLayout:
    """The whole folder ``fedshard keys init --out`` writes."""

    root: Path

    @property
    def ca_dir(self) -> Path:
        """The CA's folder (``ca.pem``, ``ca.key``)."""
        return self.root / "ca"

    @property
    def aggregator(self) -> AggregatorKeys:
        """The aggregator's keys."""
        return AggregatorKeys(self.root / "aggregator")

    def site(self, site_id: str) -> SiteBundle:
        """A site's bundle."""
        return SiteBundle(self.root / "sites" / site_id)
