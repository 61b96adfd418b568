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
