"""A zone's audit log: every decision it takes (a push accepted or refused, a round opened,
a partial sum forwarded, an aggregate served), one hash-chained line each, its head signed
by the zone's key.

``_log``   the append-only log: :class:`AuditLog` writes it, :func:`verify_audit_log` checks it
``_lines`` the line format, the hash rule, and how a log file is scanned
``_head``  the signed head beside the log (what a chain alone cannot show: lines appended or cut)
"""

from fedshard.audit._log import (
    GENESIS,
    Adoption,
    AuditLog,
    AuditRecord,
    AuditVerdict,
    Decision,
    HeadSignature,
    HeadSigner,
    HeadVerifier,
    lock_path,
    record_hash,
    verify_audit_log,
)

__all__ = [
    "GENESIS",
    "Adoption",
    "AuditLog",
    "AuditRecord",
    "AuditVerdict",
    "Decision",
    "HeadSignature",
    "HeadSigner",
    "HeadVerifier",
    "lock_path",
    "record_hash",
    "verify_audit_log",
]
