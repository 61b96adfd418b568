"""Encryption at rest: the site's key-encryption key (KEK), data keys, AES-256-GCM envelopes.

Two levels of keys, as in every envelope scheme:

* each stored shard version is sealed with AES-256-GCM under its **own random data key**
  (32 bytes from ``os.urandom``; never reused, so a fixed nonce would do, a random one
  is used anyway);
* the data keys of a store are kept in one **key table**, sealed as a whole with
  AES-256-GCM under a key derived (HKDF-SHA-256, fresh random salt per write) from the
  site's **KEK**. Sealing the table in one call, instead of wrapping 32 bytes at a time,
  is what makes re-wrapping a million data keys take milliseconds: rotation decrypts
  the table under the old KEK and encrypts it under the new one, and no shard is touched.

The KEK comes from a key file (64 hex digits, mode 600) or an environment variable
holding the same text; it is never written next to the data, and a key file inside the
store's folder is refused. A KEK is named by its *key id*, a hash that identifies it
without revealing it; stores record the id of the KEK that seals them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedshard.crypto.key_files import loose_key
from fedshard.errors import StoreError, StoreKeyError

__all__ = [
    "DATA_KEY_BYTES",
    "KEK_ENV",
    "KEK_FILE_ENV",
    "NEW_KEK_ENV",
    "NONCE_BYTES",
    "TAG_BYTES",
    "Kek",
    "check_key_location",
    "generate_kek_file",
    "load_kek",
    "new_data_key",
    "open_envelope",
    "open_key_table",
    "seal_envelope",
    "seal_key_table",
]

KEK_ENV = "FEDSHARD_STORE_KEK"  # the KEK itself, 64 hex digits
KEK_FILE_ENV = "FEDSHARD_STORE_KEK_FILE"  # a path to a KEK file
NEW_KEK_ENV = "FEDSHARD_STORE_NEW_KEK"  # the rotation target, 64 hex digits

DATA_KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
_SALT_BYTES = 32
_TABLE_INFO = b"fedshard/at-rest/key-table/v1"
_ID_DOMAIN = b"fedshard/at-rest/kek-id/v1\x00"


class Kek:
    """A site's key-encryption key (32 bytes) and where it came from.

    Parameters
    ----------
    key:
        The 32 key bytes.
    source:
        The key file it was read from, if any (used to refuse a key kept inside a store).
    """

    __slots__ = ("_key", "kek_id", "source")

    def __init__(self, key: bytes, source: Path | None = None) -> None:
        if len(key) != 32:
            raise StoreKeyError(f"a key-encryption key is 32 bytes (64 hex digits), got {len(key)} bytes")
        self._key = bytes(key)
        self.kek_id: str = hashlib.sha256(_ID_DOMAIN + self._key).hexdigest()[:16]
        self.source = source

    @classmethod
    def generate(cls) -> Kek:
        """A fresh random KEK (from ``os.urandom``)."""
        return cls(os.urandom(32))

    @classmethod
    def from_text(cls, text: str, source: Path | None = None, what: str = "key") -> Kek:
        """Parse the 64 hex digits of a key file or environment variable."""
        try:
            key = bytes.fromhex(text.strip())
        except ValueError:
            raise StoreKeyError(f"{what} is not a key-encryption key: expected 64 hex digits") from None
        if len(key) != 32:
            raise StoreKeyError(f"{what} is not a key-encryption key: expected 64 hex digits, got {len(key) * 2}")
        return cls(key, source)

    def to_text(self) -> str:
        """The key as a key file holds it (64 hex digits and a newline)."""
        return self._key.hex() + "\n"

    def _table_key(self, salt: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=_TABLE_INFO).derive(self._key)

    def __repr__(self) -> str:  # never the key bytes
        return f"Kek(id={self.kek_id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kek) and other.kek_id == self.kek_id

    def __hash__(self) -> int:
        return hash(self.kek_id)


# loading and creating KEKs ----------------------------------------------------------------
def check_key_location(key_file: Path | None, store_root: Path | None) -> None:
    """Refuse a key file kept inside the store it protects (:class:`StoreKeyError`, one line)."""
    if key_file is None or store_root is None:
        return
    try:
        key_file.resolve().relative_to(store_root.resolve())
    except ValueError:
        return
    raise StoreKeyError(
        f"key file {key_file} is inside the store {store_root}: keep the key-encryption key away from the data "
        "it protects (move it out, e.g. to /etc/fedshard/)"
    )


def load_kek(path: Path | None = None, *, env: str = KEK_ENV, store_root: Path | None = None) -> Kek:
    """Load a KEK from ``path``, else from the environment.

    Order: the key file ``path``; the variable ``env`` (64 hex digits); for the default
    ``env``, a key file named by ``FEDSHARD_STORE_KEK_FILE``.

    Parameters
    ----------
    path:
        A key file written by :func:`generate_kek_file` (mode 600).
    env:
        The environment variable that may hold the key itself.
    store_root:
        The store folder; a key file inside it is refused (the key must not sit next
        to the data it protects).

    Raises
    ------
    StoreKeyError
        No key given, a key file readable by others, inside the store, or malformed.
    """
    if path is None and env in os.environ:
        return Kek.from_text(os.environ[env], what=f"${env}")
    if path is None and env == KEK_ENV and os.environ.get(KEK_FILE_ENV):
        path = Path(os.environ[KEK_FILE_ENV])
    if path is None:
        raise StoreKeyError(
            f"no key-encryption key: pass --key-file FILE, or set ${env}"
            + (f" (64 hex digits) or ${KEK_FILE_ENV}" if env == KEK_ENV else " (64 hex digits)")
        )
    check_key_location(path, store_root)
    try:
        loose = loose_key([path])
        text = path.read_text()
    except FileNotFoundError:
        raise StoreKeyError(
            f"key file {path} does not exist: give the key this store (or ledger) was sealed with; only a new, "
            "empty store takes a new key (`fedshard store keygen`)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreKeyError(f"cannot read key file {path}: {exc}") from None
    if loose is not None:
        raise StoreKeyError(loose)
    return Kek.from_text(text, source=path, what=f"key file {path}")


def generate_kek_file(path: Path, *, force: bool = False) -> Kek:
    """Create a new random KEK in ``path`` (mode 600, written atomically); return it.

    Refuses to replace an existing file unless ``force``.
    """
    from fedshard.crypto.key_files import KEY_MODE, write_files

    kek = Kek.generate()
    write_files([(path, kek.to_text().encode(), KEY_MODE)], force)
    return Kek(kek._key, source=path)


# data keys and shard envelopes --------------------------------------------------------------
def new_data_key() -> bytes:
    """A fresh random 256-bit data key."""
    return os.urandom(DATA_KEY_BYTES)


def seal_envelope(data_key: bytes, nonce: bytes, plaintext: bytes | memoryview, aad: bytes) -> bytes:
    """AES-256-GCM: ``ciphertext ‖ tag`` of ``plaintext`` bound to ``aad``."""
    return AESGCM(data_key).encrypt(nonce, plaintext, aad)


def open_envelope(data_key: bytes, nonce: bytes, sealed: bytes | memoryview, aad: bytes, out: memoryview) -> bool:
    """Decrypt ``sealed`` into ``out`` (``len(sealed) - 16`` bytes); False if authentication fails."""
    try:
        AESGCM(data_key).decrypt_into(nonce, sealed, aad, out)
    except InvalidTag:
        return False
    return True


# the key table -------------------------------------------------------------------------------
def seal_key_table(kek: Kek, table: bytes, aad: bytes) -> bytes:
    """Seal a store's packed data keys under ``kek``: ``salt ‖ nonce ‖ ciphertext ‖ tag``.

    The sealing key is derived from the KEK with a fresh random salt each time, so the
    KEK itself never encrypts twice with one nonce however often the table is written.
    """
    salt, nonce = os.urandom(_SALT_BYTES), os.urandom(NONCE_BYTES)
    return salt + nonce + AESGCM(kek._table_key(salt)).encrypt(nonce, table, aad)


def open_key_table(kek: Kek, sealed: bytes | memoryview, aad: bytes) -> bytes:
    """Open a table sealed by :func:`seal_key_table`.

    Raises
    ------
    StoreError
        The table or anything its ``aad`` covers was altered (or it is sealed under another key).
    """
    view = memoryview(sealed)
    head = _SALT_BYTES + NONCE_BYTES
    if len(view) < head + TAG_BYTES:
        raise StoreError("the store's key table is truncated; restore the catalog from a backup")
    salt, nonce = bytes(view[:_SALT_BYTES]), bytes(view[_SALT_BYTES:head])
    try:
        return AESGCM(kek._table_key(salt)).decrypt(nonce, view[head:], aad)
    except InvalidTag:
        raise StoreError(
            "the store's catalog failed authentication: it was altered, or sealed under another key; "
            "restore it from a backup"
        ) from None
