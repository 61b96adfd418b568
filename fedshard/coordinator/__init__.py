"""The coordinator: drives rounds over a :class:`~fedshard.protocol.channels.SiteGateway`
and the zones' lifecycle calls. It sees metadata only, never parameters or updates.

``coordinator``  selection, round driving
``groups``       residency groups: one version chain each, and the rounds each site has not applied
``results``      what a round and a run produced (refusals with their codes), and the observer of them
``events``       the JSON-lines event log a run writes (and replays for status and summaries)
``recovery``     resuming a run from its event log: version chains, finished rounds, the next round
``plans``        what sites are asked: each site's privacy plan, the server-side optimiser
``binding``      which node speaks for which site: each proves its site id, one node per id
``replies``      what the coordinator takes from a site's reply, and what makes it the site's failure
"""

__all__: list[str] = []
