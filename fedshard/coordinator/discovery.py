"""Who answered the coordinator's first query: the sites of the config that agree on the
model they start from (shard plan and genesis version), by majority."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fedshard.errors import RoundError
from fedshard.protocol.messages import SiteInfo

__all__ = ["agreeing_sites"]

log = logging.getLogger("fedshard.coordinator.coordinator")  # the coordinator's log, as before


def agreeing_sites(replies: Mapping[str, object], known: set[str]) -> tuple[dict[str, SiteInfo], str, str]:
    """Node → site info of the replies from sites in ``known`` that start from the plan and
    genesis most of them share; that plan digest and genesis version. Others are logged
    and left out.

    Raises
    ------
    RoundError
        No site of the config answered.
    """
    infos: dict[str, SiteInfo] = {}
    failures: dict[str, str] = {}
    for node, reply in replies.items():
        if isinstance(reply, SiteInfo):
            infos[node] = reply
        else:
            failures[node] = str(getattr(reply, "reason", reply))
            log.warning("node %s did not answer the query: %s", node, failures[node])
    for node, info in list(infos.items()):
        if info.site_id not in known:
            log.warning("site %r is not in the federation config; ignored", info.site_id)
            del infos[node]
    if not infos:
        reasons = "; ".join(f"node {n}: {r}" for n, r in sorted(failures.items())[:3])
        raise RoundError(f"no site answered; check that the sites are running and reachable ({reasons})")
    votes: dict[tuple[str, str], int] = {}
    for info in infos.values():
        key = (info.plan_digest, info.genesis_version)
        votes[key] = votes.get(key, 0) + 1
    plan_digest, genesis = max(votes, key=lambda k: votes[k])
    for node, info in list(infos.items()):
        if (info.plan_digest, info.genesis_version) != (plan_digest, genesis):
            log.warning("site %s starts from a different model (plan or seed differs); excluded", info.site_id)
            del infos[node]
    return infos, plan_digest, genesis
