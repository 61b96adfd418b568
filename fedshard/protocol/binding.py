"""A node's proof that it speaks for its site: a signature over the coordinator's challenge.

The coordinator sends every node a fresh random challenge with its query
(:attr:`~fedshard.protocol.messages.QueryRequest.challenge`); the site answers with
its :class:`~fedshard.protocol.messages.SiteInfo` and, in ``proof``, an Ed25519
signature made with its manifest-signing key over :func:`binding_payload`: the
challenge, its site id and jurisdiction, and the shard plan and genesis version it
starts from. The coordinator checks it with the site's public key (the one zones check
manifests with) and binds the node to that site id for the run.

The payload starts with its own context line, so no challenge can make a site sign
anything else (a manifest's signed bytes are a JSON object). A proof is good for the
one challenge it answers: replaying it to another query fails.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING

from fedshard.crypto.signing import sign, verify
from fedshard.protocol.messages import SiteInfo

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["BINDING_CONTEXT", "CHALLENGE_BYTES", "binding_payload", "new_challenge", "proves", "with_proof"]

BINDING_CONTEXT = b"fedshard node binding v1\n"
"""The first line of every signed binding payload (domain separation)."""
CHALLENGE_BYTES = 32
"""Random bytes in a challenge (sent as hex)."""


def new_challenge() -> str:
    """A fresh random challenge, hex."""
    return secrets.token_hex(CHALLENGE_BYTES)


def binding_payload(challenge: str, info: SiteInfo) -> bytes:
    """The bytes a site signs to answer ``challenge`` with ``info``."""
    fields = [challenge, info.site_id, info.jurisdiction, info.plan_digest, info.genesis_version]
    return BINDING_CONTEXT + json.dumps(fields, separators=(",", ":")).encode()


def with_proof(info: SiteInfo, challenge: str, key: Ed25519PrivateKey | None) -> SiteInfo:
    """``info`` carrying the site's proof for ``challenge`` (unchanged without a challenge or a key).

    Parameters
    ----------
    info:
        The site's answer to the query.
    challenge:
        The query's challenge (empty: the coordinator asks for no proof).
    key:
        The site's manifest-signing key (None: the site has none, and cannot prove who it is).
    """
    if not challenge or key is None:
        return info
    return info.model_copy(update={"proof": sign(key, binding_payload(challenge, info))})


def proves(info: SiteInfo, challenge: str, public_key: bytes) -> bool:
    """Whether ``info.proof`` is the signature of ``info``'s site key (``public_key``) over ``challenge``.

    Never raises on what the node sent (a missing, malformed or forged proof is False).
    """
    return bool(info.proof) and verify(public_key, binding_payload(challenge, info), info.proof)
