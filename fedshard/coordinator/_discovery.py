"""Who answered the coordinator's first query: the sites bound to their nodes
(:mod:`fedshard.coordinator.binding`) that agree on the model they start from (shard plan
and genesis version), by majority, one vote per site."""

from __future__ import annotations

import logging

from fedshard.coordinator.binding import Binding, NodeRefusal
from fedshard.errors import RefusalCode, RoundError
from fedshard.protocol.messages import SiteInfo

__all__ = ["agreeing_sites"]

log = logging.getLogger(__name__)


def agreeing_sites(binding: Binding) -> tuple[dict[str, SiteInfo], str, str]:
    """Node → site info of the bound sites that start from the plan and genesis most of them
    share; that plan digest and genesis version. The others are refused (added to
    ``binding.refused``, code ``plan``) and logged.

    Raises
    ------
    RoundError
        No site of the config answered (or every one was refused).
    """
    infos = dict(binding.infos)
    if not infos:
        reasons = [f"node {n}: {r}" for n, r in sorted(binding.silent.items())]
        reasons += [f"node {r.node}: {r.reason}" for r in binding.refused]
        raise RoundError(f"no site answered; check that the sites are running and reachable ({'; '.join(reasons[:3])})")
    votes: dict[tuple[str, str], int] = {}
    for info in infos.values():
        key = (info.plan_digest, info.genesis_version)
        votes[key] = votes.get(key, 0) + 1
    plan_digest, genesis = max(sorted(votes), key=lambda k: votes[k])
    for node, info in sorted(infos.items()):
        if (info.plan_digest, info.genesis_version) != (plan_digest, genesis):
            reason = f"site {info.site_id} starts from a different model (plan or seed differs); excluded"
            log.warning("%s", reason)
            binding.refused.append(NodeRefusal(node, info.site_id, RefusalCode.PLAN, reason))
            del infos[node]
    return infos, plan_digest, genesis
