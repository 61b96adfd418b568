"""The ledger's MAC chain: every stored row authenticated, each over the one before it.

Row ``n`` of the chain (budget, event or commit, in the order they were written) carries
``mac_n = HMAC-SHA256(k, DOMAIN | mac_(n-1) | kind | row)``, where ``row`` is the canonical
encoding of every value of the row (its position included) and ``mac_0`` authenticates
the ledger's identity (format, id, key id, creation time, accountant, what it was
recovered from). So a row edited, inserted, removed from the middle or moved breaks
the chain; removing rows from the *end* (a rollback) or the whole file is what the
anchors outside the file catch (see :class:`~fedshard.privacy.ledger.LedgerHead`).

``k`` is derived with HKDF-SHA-256 from a secret of the site (its store key, see
:func:`fedshard.site.privacy.ledger_key`). A ledger written without a secret
(:data:`UNKEYED`, bare library use) has a chain under a public key: it still catches
accidental corruption, never deliberate edits, and a site with a key refuses it.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedshard.errors import ConfigError
from fedshard.integrity.chain import ChainHash, chain_link

__all__ = ["MAC_BYTES", "UNKEYED", "Field", "LedgerKey"]

MAC_BYTES = 32
_DOMAIN = b"fedshard/privacy-ledger/v2\x00"
_INFO = b"fedshard/privacy-ledger/mac/v1"

Field = int | float | str
"""A value of a row, as the chain encodes it (SQLite INTEGER, REAL or TEXT)."""


def _encode(value: Field) -> bytes:
    if isinstance(value, bool):
        raise TypeError("a ledger value is never a bool")
    if isinstance(value, int):
        return b"i" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"f" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode()
        return b"s" + struct.pack(">I", len(raw)) + raw
    raise TypeError(f"a ledger value is an int, float or str, got {type(value).__name__}")


class LedgerKey:
    """The key that authenticates a ledger's rows, derived from a site secret.

    Parameters
    ----------
    secret:
        At least 32 bytes of a secret the site keeps away from its state folder.

    Raises
    ------
    ConfigError
        If ``secret`` is shorter than 32 bytes.
    """

    __slots__ = ("_key", "key_id")

    def __init__(self, secret: bytes, *, _keyed: bool = True) -> None:
        if len(secret) < 32:
            raise ConfigError(f"a ledger key needs a secret of at least 32 bytes, got {len(secret)}")
        self._key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(secret)
        self.key_id: str = hmac.new(self._key, b"key-id", hashlib.sha256).hexdigest()[:16] if _keyed else ""
        """Names the key without revealing it; empty for :data:`UNKEYED`."""

    @property
    def keyed(self) -> bool:
        """False for :data:`UNKEYED`."""
        return bool(self.key_id)

    def mac(self, previous: bytes, kind: str, values: Sequence[Field]) -> bytes:
        """The MAC of one row (``kind`` and its ``values``) chained onto ``previous``.

        Raises
        ------
        TypeError
            If a value is not an int, float or str (a damaged row).
        """
        row = b"".join([_encode(kind), *(_encode(v) for v in values)])
        return chain_link(previous, row, ChainHash.HMAC_SHA256, key=self._key, domain=_DOMAIN)

    def genesis(self, values: Sequence[Field]) -> bytes:
        """``mac_0``: the MAC of the ledger's identity (its meta values)."""
        return self.mac(b"", "genesis", values)

    def __repr__(self) -> str:  # never the key bytes
        return f"LedgerKey(id={self.key_id or 'unkeyed'})"


UNKEYED = LedgerKey(hashlib.sha256(b"fedshard/privacy-ledger/unkeyed").digest(), _keyed=False)
"""The public key of a ledger written without a site secret: detects accidents, not edits."""
