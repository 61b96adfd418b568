"""Which node speaks for which site: one node per site id, proven with the site's key.

At discovery, and when sites join a running federation, the coordinator sends each
node a fresh random challenge with its query and checks every answer
(:func:`bind_nodes`):

* the site id is one of the config's, with the config's jurisdiction;
* the answer carries a valid proof (:mod:`fedshard.protocol.binding`): a signature by
  that site's manifest-signing key over the node's own challenge, the site id and
  jurisdiction, and the plan and genesis version the site starts from;
* the shard plan the site sends is the one its digest names (SHA-256 of its canonical
  JSON, as :attr:`~fedshard.sharding.ShardPlan.digest`);
* no other node is bound to that site id (the first node to prove it, in node order,
  keeps it; one already bound keeps it for the run).

A node that fails any of these is refused for the run: one log line and a
:class:`NodeRefusal`, which the event log records (``node-refused``) and the report
shows; the federation goes on with the others.

Where the coordinator has no public keys (``site_keys`` None: bare library use, tests),
no proof is asked and the first node per site id is kept, the others refused: a node
can then claim any free site id (SECURITY.md says so).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fedshard.config import FederationConfig
from fedshard.coordinator._replies import MAX_EXAMPLES, check_privacy, clean_privacy, one_line
from fedshard.errors import FedshardError, RefusalCode
from fedshard.protocol.binding import proves
from fedshard.protocol.messages import SiteInfo

__all__ = ["Binding", "NodeRefusal", "SiteKeys", "bind_nodes"]

log = logging.getLogger(__name__)

SiteKeys = Callable[[], Mapping[str, bytes]]
"""Returns the sites' manifest-signing public keys (32 raw bytes) by site id, read afresh at
each discovery and join (sites added mid-run bring theirs)."""


@dataclass(frozen=True)
class NodeRefusal:
    """A node that answered the coordinator's query and was refused for the run."""

    node: str
    site_id: str  # the id it claimed (one line, cut short)
    code: RefusalCode
    reason: str

    def as_event(self) -> dict[str, str]:
        """What the event log records of it."""
        return {"node": self.node, "site_id": self.site_id, "code": self.code.value, "reason": self.reason}


@dataclass
class Binding:
    """The outcome of one query: the nodes bound (node → their site's info), the nodes refused,
    and why the others did not answer (node → reason)."""

    infos: dict[str, SiteInfo] = field(default_factory=dict)
    refused: list[NodeRefusal] = field(default_factory=list)
    silent: dict[str, str] = field(default_factory=dict)


def bind_nodes(
    replies: Mapping[str, object],
    challenges: Mapping[str, str],
    config: FederationConfig,
    keys: Mapping[str, bytes] | None,
    taken: Mapping[str, str] | None = None,
) -> Binding:
    """Check every node's answer (see the module docstring).

    Parameters
    ----------
    replies:
        Node → its answer to the query (a :class:`SiteInfo`, or a failure).
    challenges:
        Node → the challenge it was sent.
    config:
        The federation config (its sites and their jurisdictions).
    keys:
        The sites' public keys by site id; None: no proof is asked (bare library use).
    taken:
        Site id → node of the sites already bound (when sites join a running federation).
    """
    out = Binding()
    bound = dict(taken or {})  # site id -> node
    for node in sorted(replies):
        reply = replies[node]
        if not isinstance(reply, SiteInfo):
            out.silent[node] = one_line(getattr(reply, "reason", reply), 200)
            log.warning("node %s did not answer the query: %s", node, out.silent[node])
            continue
        why = _refusal(node, reply, challenges.get(node, ""), config, keys, bound)
        if why is not None:
            code, reason = why
            refusal = NodeRefusal(node, one_line(reply.site_id, 64), code, reason)
            out.refused.append(refusal)
            log.warning("node %s refused: %s", node, reason)
            continue
        bound[reply.site_id] = node
        privacy = reply.privacy
        if privacy is not None and check_privacy(privacy) is not None:  # its ledger decides; we show nothing
            privacy = None
        out.infos[node] = reply.model_copy(update={"privacy": clean_privacy(privacy) if privacy else None})
    return out


def _refusal(
    node: str,
    info: SiteInfo,
    challenge: str,
    config: FederationConfig,
    keys: Mapping[str, bytes] | None,
    bound: Mapping[str, str],
) -> tuple[RefusalCode, str] | None:
    """Why ``node``'s answer ``info`` is refused (None: it may be bound)."""
    site_id = info.site_id
    known = next((s for s in config.sites if s.id == site_id), None)
    name = repr(one_line(site_id, 64))
    if known is None:
        return RefusalCode.MEMBER, f"it answers as site {name}, which is not in the federation config"
    if info.jurisdiction != known.jurisdiction:
        return RefusalCode.IDENTITY, (
            f"it answers as site {site_id} of jurisdiction {one_line(info.jurisdiction, 16)!r}; the config says "
            f"{known.jurisdiction}"
        )
    if keys is not None:
        key = keys.get(site_id)
        if key is None:
            return RefusalCode.IDENTITY, f"no public key of site {site_id} to check its proof (site-keys/{site_id}.pub)"
        try:
            proven = proves(info, challenge, key)
        except FedshardError as exc:  # a malformed key on the coordinator's side: not the node's doing
            return RefusalCode.IDENTITY, f"site {site_id}'s public key cannot be used: {exc}"
        if not proven:
            return RefusalCode.SIGNATURE, (
                f"it answers as site {site_id} without a valid proof (a signature by that site's key over this "
                "query's challenge)"
            )
    holder = bound.get(site_id)
    if holder is not None and holder != node:
        return RefusalCode.DUPLICATE, f"site {site_id} is already bound to node {holder}"
    if not 0 <= info.num_examples <= MAX_EXAMPLES:
        return RefusalCode.BOUND, f"site {site_id} reports {info.num_examples} records"
    if hashlib.sha256(info.plan_json.encode()).hexdigest() != info.plan_digest:  # canonical JSON (ShardPlan.digest)
        return RefusalCode.PLAN, f"site {site_id} sent a shard plan that does not match its digest"
    return None
