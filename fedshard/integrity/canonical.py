"""The one canonical JSON every digest, signature and MAC is computed over: keys sorted, no
spaces, ASCII only, and (unless a format written before said otherwise) no NaN or ∞, which
JSON has no spelling for. Manifests, partial sums, shard plans, the store's catalog and
blobs, the residency policy's digest, audit lines and heads, aggregate signatures and the
ledger's anchor all serialise through here, so "canonical" means one thing."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["canonical_json", "canonical_text"]


def canonical_text(value: Any, *, allow_nan: bool = False) -> str:
    """``value`` as canonical JSON text.

    Raises
    ------
    ValueError
        ``value`` holds NaN or ∞ (unless ``allow_nan``, kept for formats that always allowed them).
    TypeError
        ``value`` holds something JSON has no form for.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=allow_nan)


def canonical_json(value: Any, *, allow_nan: bool = False) -> bytes:
    """``value`` as canonical JSON bytes (see :func:`canonical_text`)."""
    return canonical_text(value, allow_nan=allow_nan).encode("ascii")
