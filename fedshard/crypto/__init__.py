"""Cryptography recipes of fedshard: the federation PKI, mTLS for gRPC, manifest signing.

The modules here are *recipes*: each does one safe thing with fixed algorithms
(ECDSA P-256 certificates, TLS 1.2+/1.3 with mutual authentication, Ed25519
signatures) and offers no knobs to weaken it. The primitives they are built on
(:mod:`cryptography.hazmat`, :mod:`grpc` credentials) stay behind them.

* :mod:`fedshard.crypto.pki` issues and reads the federation's certificates; a
  site's certificate carries its jurisdiction, a zone's its region.
* :mod:`fedshard.crypto.tls` turns those certificates into gRPC credentials and tells
  a zone who is calling.
* :mod:`fedshard.crypto.signing` signs and verifies manifests with per-site Ed25519 keys.
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.crypto.at_rest import Kek, load_kek
    from fedshard.crypto.he import HeCodec, he_init
    from fedshard.crypto.identity import Identity, Role, ZoneKey, read_identity
    from fedshard.crypto.signing import sign, verify
    from fedshard.crypto.tls import TlsFiles

__all__ = [
    "HeCodec",
    "Identity",
    "Kek",
    "Role",
    "TlsFiles",
    "ZoneKey",
    "he_init",
    "load_kek",
    "read_identity",
    "sign",
    "verify",
]

__getattr__ = lazy_surface(
    __name__,
    {
        "HeCodec": "he",
        "Identity": "identity",
        "Kek": "at_rest",
        "Role": "identity",
        "TlsFiles": "tls",
        "ZoneKey": "identity",
        "he_init": "he",
        "load_kek": "at_rest",
        "read_identity": "identity",
        "sign": "signing",
        "verify": "signing",
    },
)
