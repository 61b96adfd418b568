"""Who may make which call at a zone: roles from the caller's certificate, and membership.

Under mutual TLS every call is authorised from what the federation CA signed, never
from what the request says:

=============  ===================================================================
call           who may make it
=============  ===================================================================
OpenRound      the coordinator (its certificate's role, :data:`~fedshard.crypto.identity.ROLE_OID`)
CloseRound     the coordinator (closing and aborting alike)
Push           a site of the federation, for itself (the manifest's ``site_id``)
Forward        a zone of the federation, for itself, and only to the reducing zone
FetchAggregate a site of the federation (residency then decides what it is served)
Info           any party of the federation
=============  ===================================================================

The SuperLink's certificate (role ``superlink``) may make no call at all.

A certificate the CA signed for a party the federation config does not list (a
leaked or mistakenly issued one) is refused with :attr:`~RefusalCode.MEMBER`; a member
calling outside its role with :attr:`~RefusalCode.AUTHORITY`; both are
``PERMISSION_DENIED`` on the wire, and the zone counts and audits every refusal.

Without TLS (``--insecure``) a zone cannot tell who calls: it authorises nothing, and
says so loudly when it starts (:data:`fedshard.crypto.tls.INSECURE_WARNING`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

import grpc

from fedshard.crypto.identity import CheckedCertificates, Identity, Role
from fedshard.crypto.tls import peer_identity
from fedshard.errors import PkiError, PushRejectedError, RefusalCode
from fedshard.zone._calls import Call

__all__ = ["ALLOWED", "Authority", "Call", "Members", "caller_name"]


ALLOWED: MappingProxyType[Call, frozenset[Role]] = MappingProxyType(
    {
        Call.OPEN: frozenset({Role.COORDINATOR}),
        Call.CLOSE: frozenset({Role.COORDINATOR}),
        Call.ABORT: frozenset({Role.COORDINATOR}),
        Call.PUSH: frozenset({Role.SITE}),
        Call.FORWARD: frozenset({Role.ZONE}),
        Call.FETCH: frozenset({Role.SITE}),
        Call.INFO: frozenset({Role.SITE, Role.ZONE, Role.COORDINATOR}),
        Call.RECONFIGURE: frozenset({Role.COORDINATOR}),
    }
)
"""The roles that may make each call (the SuperLink: none)."""


@dataclass(frozen=True)
class Members:
    """The parties of the federation, from its config: site ids and zone names.

    The coordinator is not listed: its role is in its certificate, which only the CA
    (``fedshard keys init`` / ``pki issue-coordinator``) issues.
    """

    sites: frozenset[str]
    zones: frozenset[str]

    @classmethod
    def of(cls, sites: Iterable[str], zones: Iterable[str]) -> Members:
        """Members from site ids and zone names."""
        return cls(frozenset(sites), frozenset(zones))

    def admits(self, identity: Identity) -> bool:
        """Whether ``identity`` is a party of the federation."""
        if identity.role is Role.SITE:
            return identity.name in self.sites
        if identity.role is Role.ZONE:
            return identity.name in self.zones
        return identity.role is Role.COORDINATOR  # the SuperLink is no member of the data plane


class Authority:
    """Decides, per call, whether the caller may make it.

    Parameters
    ----------
    zone:
        This zone's name (for messages).
    ca_pem:
        The federation CA; None: no mTLS, nothing can be checked (insecure mode).
    members:
        The federation's parties; None: any certificate the CA signed, in the right role.
    reducing:
        Whether this zone reduces global partial sums (only then may zones forward to it).
    """

    def __init__(self, zone: str, ca_pem: bytes | None, members: Members | None, *, reducing: bool) -> None:
        self.zone = zone
        self.ca_pem = ca_pem
        self.members = members
        self.reducing = reducing
        self._checked = CheckedCertificates(ca_pem) if ca_pem is not None else None  # every call reads one

    def identify(self, context: grpc.ServicerContext) -> Identity | None:
        """Who calls, from the certificate the CA signed; None without mTLS.

        Raises
        ------
        PushRejectedError
            With code :attr:`~RefusalCode.IDENTITY`: no certificate, or it fails a check.
        """
        if self.ca_pem is None:
            return None
        try:
            return peer_identity(context, self.ca_pem, role=None, checked=self._checked)
        except PkiError as exc:
            raise PushRejectedError(f"zone {self.zone}: {exc}", RefusalCode.IDENTITY) from None

    def check_member(self, identity: Identity | None) -> None:
        """Check ``identity`` is a party of the federation (anyone is without mTLS: None).

        The zone checks this for every call before it reads the call's request, so a
        non-member (or the SuperLink, which may make no call at a zone) never holds a worker.

        Raises
        ------
        PushRejectedError
            With code :attr:`~RefusalCode.MEMBER`, or :attr:`~RefusalCode.AUTHORITY` for the SuperLink.
        """
        if identity is not None and identity.role is Role.SUPERLINK:
            raise PushRejectedError(
                f"zone {self.zone}: {identity.role.value} {identity.name!r} holds the SuperLink's certificate, which "
                "may make no call at a zone",
                RefusalCode.AUTHORITY,
            )
        if identity is not None and self.members is not None and not self.members.admits(identity):
            raise PushRejectedError(
                f"zone {self.zone}: {identity.role.value} {identity.name!r} holds a certificate of the federation CA "
                "but is not a member of the federation (not in its config)",
                RefusalCode.MEMBER,
            )

    def permit(self, identity: Identity | None, call: Call) -> None:
        """Check ``identity`` may make ``call`` (anyone may without mTLS: ``identity`` None).

        Raises
        ------
        PushRejectedError
            With code :attr:`~RefusalCode.MEMBER` (not a party of the federation) or
            :attr:`~RefusalCode.AUTHORITY` (a party outside its role).
        """
        if identity is None:
            return
        self.check_member(identity)
        who = f"{identity.role.value} {identity.name!r}"
        if identity.role not in ALLOWED[call]:
            allowed = " or ".join(sorted(r.value for r in ALLOWED[call]))
            raise PushRejectedError(
                f"zone {self.zone}: {who} may not {call.value}; only a {allowed} certificate may",
                RefusalCode.AUTHORITY,
            )
        if call is Call.FORWARD and not self.reducing:
            raise PushRejectedError(
                f"zone {self.zone}: {who} may not forward partial sums here: this zone does not reduce",
                RefusalCode.AUTHORITY,
            )


def caller_name(identity: Identity | None) -> str:
    """How audit records name a caller: ``role:name``, or ``-`` without mTLS."""
    return f"{identity.role.value}:{identity.name}" if identity is not None else "-"
