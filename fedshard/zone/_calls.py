"""The calls a zone serves, as its audit log and its authorisation name them."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Call"]


class Call(StrEnum):
    """One kind of call to a zone (see :mod:`fedshard.zone.rpc._authority` for who may make it)."""

    OPEN = "open-round"
    CLOSE = "close-round"
    ABORT = "abort-round"
    PUSH = "push"
    FORWARD = "forward"
    FETCH = "fetch"
    INFO = "info"
    RECONFIGURE = "reconfigure"
