"""A site: its model held once per process, local training under its DP mechanisms, routing,
sealing, signing, pushing, and applying aggregates.

``site``           the :class:`Site` role: handles the coordinator's messages
``_model``         the model a site builds once and holds for its process's life
``_resident``      whether the held model is the one in the store (a message may skip the refill)
``base``           the frozen base of a large model, sealed in its own store and streamed through training
``model_store``    where the site keeps its parameter shards between messages (sealed store or snapshot)
``_apply``         catching up: fetch, verify, decrypt and apply missed rounds in place
``terms``          the privacy terms the site's own config promises; a plan may only tighten them
``privacy``        the site's privacy ledger, what each round may spend, the round's DP mechanisms
``ledger_anchor``  the ledger's head anchored outside the ledger file (a rollback is caught)
``_private_round`` one round with DP on: reserve its cost in the ledger, then commit (or refuse)
``_release``       the update: split once, HE, signed manifests, pushes
``routes``         where each shard goes and which aggregate it applies; the cached classification
``_retry``         retrying a zone call that got no answer (backoff with jitter, within the round)
``_points``        the fault points along what a site sends (crash tests)

torch is imported only when a model is built or trained (Flower may start a fresh process
per message): importing the package costs what its public modules' imports cost.
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.site.model_store import ModelStore, SealedModelStore, SnapshotModelStore, stored_module
    from fedshard.site.privacy import SitePrivacy
    from fedshard.site.routes import SiteRouting
    from fedshard.site.site import Site
    from fedshard.site.terms import PrivacyTerms

__all__ = [
    "ModelStore",
    "PrivacyTerms",
    "SealedModelStore",
    "Site",
    "SitePrivacy",
    "SiteRouting",
    "SnapshotModelStore",
    "stored_module",
]

__getattr__ = lazy_surface(
    __name__,
    {
        "ModelStore": "model_store",
        "PrivacyTerms": "terms",
        "SealedModelStore": "model_store",
        "Site": "site",
        "SitePrivacy": "privacy",
        "SiteRouting": "routes",
        "SnapshotModelStore": "model_store",
        "stored_module": "model_store",
    },
)
