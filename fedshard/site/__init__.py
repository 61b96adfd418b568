"""A site: its model held once per process, local training under its DP mechanisms, routing,
sealing, signing, pushing, and applying aggregates.

``site``           the :class:`Site` role: handles the coordinator's messages
``model``          the model a site builds once and holds for its process's life
``resident``       whether the held model is the one in the store (a message may skip the refill)
``base``           the frozen base of a large model, sealed in its own store and streamed through training
``model_store``    where the site keeps its parameter shards between messages (sealed store or snapshot)
``apply``          catching up: fetch, verify, decrypt and apply missed rounds in place
``terms``          the privacy terms the site's own config promises; a plan may only tighten them
``privacy``        the site's privacy ledger, what each round may spend, the round's DP mechanisms
``ledger_anchor``  the ledger's head anchored outside the ledger file (a rollback is caught)
``private_round``  one round with DP on: reserve its cost in the ledger, then commit (or refuse)
``release``        the update: split once, CKKS, signed manifests, pushes
``routes``         where each shard goes and which aggregate it applies; the cached classification
``retry``          retrying a zone call that got no answer (backoff with jitter, within the round)
``points``         the fault points along what a site sends (crash tests)

Nothing heavy is imported here: Flower may start a fresh process per message.
"""

__all__: list[str] = []
