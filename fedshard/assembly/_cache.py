"""The sites a process keeps assembled for its messages (a Flower actor, a warm SuperNode child).

A site's model is built once per process, not once per message: :func:`site_for` and
:func:`deployed_site_for` keep the sites they assembled, least recently used dropped
beyond :data:`SITE_CACHE_SIZE` unless their models fit in :data:`SITE_CACHE_BYTES`. A site
is kept once: assembled again for a changed config or key bundle, it replaces the site it
was (a process that runs one federation after another, as a resumed simulation does, holds
each site once, not once per run).
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard.assembly.sites import deployed_site, load_deployed, make_site
from fedshard.config import FederationConfig
from fedshard.protocol.channels import ZoneConnector
from fedshard.site.site import Site

if TYPE_CHECKING:
    pass

__all__ = [
    "SITE_CACHE_BYTES",
    "SITE_CACHE_SIZE",
    "deployed_site_for",
    "site_for",
]

SITE_CACHE_SIZE = 8
"""Sites a process keeps assembled whatever their size (least recently used beyond that are
dropped with their models, unless they fit in :data:`SITE_CACHE_BYTES`)."""
SITE_CACHE_BYTES = 256 << 20
"""Beyond :data:`SITE_CACHE_SIZE`, sites are kept while their held models total at most this
(a simulation actor serving thousands of small sites keeps them all)."""

_SITES: OrderedDict[str, tuple[str, Site]] = OrderedDict()
"""Which site (its id and state) -> (what it was assembled from, the site)."""
_SITES_LOCK = threading.Lock()


def site_for(
    config: FederationConfig, site_id: str, state_root: str | Path, endpoints: Mapping[str, str] | None = None
) -> Site:
    """The site :func:`make_site` assembles, kept for this process's later messages.

    Kept by the site id and the state folder; assembled from the config's digest and
    ``endpoints`` (the zones' real endpoints in a simulation, see :func:`make_site`): a
    changed config assembles a new site in the old one's place. The sites of one process
    share one channel per zone (:class:`~fedshard.zone.rpc.shared.SharedZoneChannels`:
    plaintext loopback, simulation).
    """
    where = json.dumps(dict(endpoints), sort_keys=True) if endpoints is not None else ""
    key = _digest(site_id, str(Path(state_root).resolve()))
    made_from = _digest(_config_digest(config), where)
    return _kept(
        key, made_from, lambda: make_site(config, site_id, state_root, connect=_shared_channels(), endpoints=endpoints)
    )


_CONFIG_DIGESTS: OrderedDict[int, tuple[FederationConfig, str]] = OrderedDict()


def _config_digest(config: FederationConfig) -> str:
    """The digest of ``config``'s JSON, computed once per config object (a 10,000-site config
    takes milliseconds to dump, and every message of a simulation actor asks)."""
    with _SITES_LOCK:
        known = _CONFIG_DIGESTS.get(id(config))
        if known is not None and known[0] is config:
            return known[1]
    digest = _digest(config.model_dump_json())
    with _SITES_LOCK:
        _CONFIG_DIGESTS[id(config)] = (config, digest)
        while len(_CONFIG_DIGESTS) > 4:
            _CONFIG_DIGESTS.popitem(last=False)
    return digest


@functools.cache
def _shared_channels() -> ZoneConnector:
    from fedshard.zone.rpc.shared import SharedZoneChannels

    return SharedZoneChannels()


def deployed_site_for(site_config: Path, *, site_id: str = "", jurisdiction: str = "") -> Site:
    """The site :func:`make_deployed_site` assembles, kept for this process's later messages.

    Kept by the site id and its state folder; assembled from the site's configs and its
    key bundle's files (names and modification times): rotating a key or editing a config
    assembles a new site in the old one's place.
    """
    loaded = load_deployed(site_config, site_id, jurisdiction)
    local, config, _ = loaded
    assert local.deployment is not None  # load_deployed checked it
    bundle = Path(local.deployment.keys)
    stamps = sorted(f"{p}:{p.stat().st_mtime_ns}" for p in bundle.rglob("*") if p.is_file())
    key = _digest(local.site.id, str(Path(local.site.state_dir).resolve()))
    made_from = _digest(local.model_dump_json(), config.model_dump_json(), *stamps)
    return _kept(key, made_from, lambda: deployed_site(loaded))


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _kept(key: str, made_from: str, make: Callable[[], Site]) -> Site:
    """The site kept under ``key`` if it was assembled from ``made_from``, else one ``make``
    assembles in its place (least recently used sites dropped)."""
    with _SITES_LOCK:
        kept = _SITES.get(key)
        if kept is None or kept[0] != made_from:
            _SITES.pop(key, None)  # the site as it was assembled before goes with its model
            kept = _SITES[key] = (made_from, make())
            while len(_SITES) > SITE_CACHE_SIZE and _held_bytes(site for _, site in _SITES.values()) > SITE_CACHE_BYTES:
                _SITES.popitem(last=False)
        _SITES.move_to_end(key)
        return kept[1]


def _held_bytes(sites: Iterable[Site]) -> int:
    """Memory of the models these sites hold (a model not built yet: nothing)."""
    return sum(site.model.nbytes for site in sites)
