"""Building the runtime parts of a federation from its config.

Shared by every engine: the in-process demo, the Flower ServerApp/ClientApp and the
``fedshard zone up`` command all assemble sites and zones here, the same way.

* :mod:`~fedshard.assembly.sites`: a site from the federation config (simulation) or
  from its own config file (deployment), with its store, ledger, keys and routes;
* :mod:`~fedshard.assembly._cache`: the sites a process keeps for its messages, so a
  site's model is built once per process, not once per message;
* :mod:`~fedshard.assembly._zones`: a zone from the config, and zones served in this
  process (simulation, tests), to which more can be added while a federation runs;
* :mod:`~fedshard.assembly._connectors`: how parts reach the zones (gRPC, mutual TLS);
* :mod:`~fedshard.assembly.coordination`: the coordinator, wired the same way for the
  in-process engine and the Flower ServerApp;
* :mod:`~fedshard.assembly.routing`: the federation's residency facts from its config:
  each shard's class, each site's routes, each zone's policy;
* :mod:`~fedshard.assembly.parts`: the registered parts a config names (server
  optimiser, accountant, DP mechanisms), checked before anything runs.
"""

from fedshard.assembly._cache import SITE_CACHE_BYTES, SITE_CACHE_SIZE, deployed_site_for, site_for
from fedshard.assembly._connectors import grpc_connector, tls_connector
from fedshard.assembly._zones import AUDIT_FILE, ServedZones, make_zone, running_zones, serving_zones, streaming_parties
from fedshard.assembly.sites import (
    LEDGER_ANCHOR_FILE,
    SIGNING_KEY_FILE,
    STORE_KEYS_DIR,
    check_privacy,
    he_keys,
    load_site_keys,
    make_deployed_site,
    make_site,
)

__all__ = [
    "AUDIT_FILE",
    "LEDGER_ANCHOR_FILE",
    "SIGNING_KEY_FILE",
    "SITE_CACHE_BYTES",
    "SITE_CACHE_SIZE",
    "STORE_KEYS_DIR",
    "ServedZones",
    "check_privacy",
    "deployed_site_for",
    "grpc_connector",
    "he_keys",
    "load_site_keys",
    "make_deployed_site",
    "make_site",
    "make_zone",
    "running_zones",
    "serving_zones",
    "site_for",
    "streaming_parties",
    "tls_connector",
]
