"""Per-site Ed25519 keys that sign manifests.

Each site holds one signing key; zones and other sites hold its public key (32 raw
bytes, written as hex to ``<key>.pub``) and check every manifest against it. The
payload is whatever the caller signs — for manifests, :meth:`Manifest.signing_payload`.
Signatures travel as hex text.

:func:`verify` answers ``True`` or ``False`` and never raises on what an attacker
controls (payload, signature); only a malformed *trusted* public key is an error.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedshard.crypto.identity import read_pem
from fedshard.crypto.key_files import CERT_MODE, KEY_MODE, write_files
from fedshard.errors import PkiError

__all__ = [
    "SIGNATURE_HEX_LENGTH",
    "generate_signing_key",
    "load_public_key",
    "load_signing_key",
    "public_key_bytes",
    "public_key_path",
    "sign",
    "verify",
]

_RAW_KEY_BYTES = 32
SIGNATURE_HEX_LENGTH = 128
"""An Ed25519 signature is 64 bytes, 128 hex digits."""


def public_key_path(path: str | os.PathLike[str]) -> Path:
    """Where :func:`generate_signing_key` writes the public key of the key at ``path``: ``<path>.pub``."""
    return Path(f"{os.fspath(path)}.pub")


def generate_signing_key(path: str | os.PathLike[str], *, force: bool = False) -> bytes:
    """Create a site's signing key: private key PEM at ``path`` (``0600``), public key hex at ``<path>.pub``.

    Parameters
    ----------
    path:
        Where to write the private key (PKCS#8 PEM, unencrypted: protect the folder).
    force:
        Overwrite existing files. Manifests signed with the old key no longer verify
        once its public key is replaced at the zones.

    Returns
    -------
    bytes
        The public key, 32 raw bytes (hand these, or ``<path>.pub``, to the zones).

    Raises
    ------
    PkiError
        A file exists and ``force`` is false, or the files cannot be written.
    """
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = public_key_bytes(key.public_key())
    write_files(
        [(Path(path), pem, KEY_MODE), (public_key_path(path), f"{public.hex()}\n".encode("ascii"), CERT_MODE)], force
    )
    return public


def load_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load a signing key written by :func:`generate_signing_key`.

    Raises
    ------
    PkiError
        The file cannot be read or does not hold an Ed25519 private key.
    """
    try:
        key = serialization.load_pem_private_key(read_pem(path), password=None)
    except (ValueError, TypeError):
        raise PkiError(f"{path} is not an unencrypted PEM private key: create one with generate_signing_key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PkiError(f"{path} holds a {type(key).__name__}, not an Ed25519 signing key")
    return key


def public_key_bytes(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of a public key (of the private key's public half when given a private key)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_public_key(data: bytes | str) -> Ed25519PublicKey:
    """Read a trusted public key: 32 raw bytes, 64 hex digits (as in ``<key>.pub``), or a PEM public key.

    Raises
    ------
    PkiError
        ``data`` is none of these.
    """
    raw: bytes | None = None
    if isinstance(data, bytes) and len(data) == _RAW_KEY_BYTES:
        raw = data
    else:
        text = data.decode("ascii", "replace") if isinstance(data, bytes) else data
        text = text.strip()
        if text.startswith("-----BEGIN"):
            try:
                key = serialization.load_pem_public_key(text.encode("ascii"))
            except (ValueError, TypeError, UnicodeEncodeError):
                raise PkiError("public key is not a valid PEM public key") from None
            if not isinstance(key, Ed25519PublicKey):
                raise PkiError(f"public key is a {type(key).__name__}, not an Ed25519 key")
            return key
        if len(text) == 2 * _RAW_KEY_BYTES:
            try:
                raw = bytes.fromhex(text)
            except ValueError:
                raw = None
    if raw is None:
        raise PkiError("public key must be 32 bytes, 64 hex digits or PEM (see the site's <key>.pub)")
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise PkiError("public key is not a valid Ed25519 key") from None


def sign(private_key: Ed25519PrivateKey, payload: bytes) -> str:
    """Sign ``payload``; returns the signature as 128 hex digits.

    Parameters
    ----------
    private_key:
        The site's key (:func:`load_signing_key`).
    payload:
        Exactly the bytes the verifier will check (e.g. ``manifest.signing_payload()``).
    """
    return private_key.sign(bytes(payload)).hex()


def verify(public_key: Ed25519PublicKey | bytes | str, payload: bytes, signature_hex: str) -> bool:
    """Whether ``signature_hex`` is a valid signature of ``payload`` under ``public_key``.

    Never raises on a bad or malformed signature or payload: a forged, truncated,
    non-hex or non-string signature is simply ``False``.

    Parameters
    ----------
    public_key:
        The signer's trusted public key, or its bytes/hex (see :func:`load_public_key`).
    payload:
        The signed bytes.
    signature_hex:
        Signature as produced by :func:`sign`.

    Raises
    ------
    PkiError
        Only when ``public_key`` itself is malformed (a configuration error, not an attack).
    """
    key = public_key if isinstance(public_key, Ed25519PublicKey) else load_public_key(public_key)
    if not isinstance(signature_hex, str) or len(signature_hex) != SIGNATURE_HEX_LENGTH:
        return False
    if not isinstance(payload, bytes | bytearray | memoryview):
        return False
    try:
        key.verify(bytes.fromhex(signature_hex), bytes(payload))
    except (InvalidSignature, ValueError):
        return False
    return True
