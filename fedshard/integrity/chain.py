"""One link of a hash chain, for every chain fedshard keeps.

Each link's digest covers the link before it and the entry it adds, so changing, removing,
inserting or moving an entry changes every digest after it. Three chains use it, each with
the hash its stored format names (the formats never change):

* the model-version chain (:func:`fedshard.integrity.version.next_version`): BLAKE3 over
  ``version ‖ aggregate root``;
* a zone's audit log (:func:`fedshard.audit.record_hash`): SHA-256 over ``prev hash ‖
  canonical JSON of the record``;
* a site's privacy ledger (:class:`fedshard.privacy.ledger.chain.LedgerKey`): HMAC-SHA-256
  under the site's ledger key over ``domain ‖ previous MAC ‖ encoded row``, so only the site
  can extend it.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum

from blake3 import blake3

__all__ = ["ChainHash", "chain_link"]


class ChainHash(StrEnum):
    """The hash a chain's stored format names."""

    SHA256 = "sha256"
    BLAKE3 = "blake3"
    HMAC_SHA256 = "hmac-sha256"
    """Keyed: only the key's holder can extend (or re-write) the chain."""


def chain_link(
    previous: bytes, entry: bytes, hash: ChainHash, *, key: bytes | None = None, domain: bytes = b""
) -> bytes:
    """The digest of ``domain ‖ previous ‖ entry`` under ``hash`` (``key``: the HMAC's key, for
    :attr:`ChainHash.HMAC_SHA256` only).

    Raises
    ------
    ValueError
        ``key`` missing for a keyed chain, or given for an unkeyed one.
    """
    if (key is not None) != (hash is ChainHash.HMAC_SHA256):
        raise ValueError(f"a {hash.value} chain takes {'a key' if key is None else 'no key'}")
    body = domain + previous + entry
    if hash is ChainHash.HMAC_SHA256:
        assert key is not None
        return hmac.new(key, body, hashlib.sha256).digest()
    if hash is ChainHash.BLAKE3:
        return blake3(body).digest()
    return hashlib.sha256(body).digest()
