"""A site: its model held once per process, local training, update DP, routing,
sealing, signing, pushing, and applying aggregates.

``site``         the :class:`Site` role: handles the coordinator's messages
``model``        the model a site builds once and holds for its process's life
``apply``        catching up: fetch, verify, decrypt and apply missed rounds in place
``release``      the update: split once, update-level DP, CKKS, signed manifests, pushes
``routes``       where each shard goes and which aggregate it applies; the cached classification
``privacy``      the site's privacy ledger and what each round may spend
``model_store``  where the site keeps its parameter shards between messages (sealed store or snapshot)

Nothing heavy is imported here: Flower may start a fresh process per message.
"""

__all__: list[str] = []
