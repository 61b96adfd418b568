"""Growing a running federation between rounds (hot-plug): zones added or drained, sites
joining, more rounds. Every part of it lives here but for the two it rests on:
:mod:`fedshard.config.changes` (what a running federation may change, and the digest of a
membership) and :mod:`fedshard.coordinator.membership` (the :class:`Membership` port the
coordinator asks before each round, and how it admits the sites that joined).

``offer``        a new config checked against the run's and left in its folder (``reconfigure.yaml``)
``in_process``   the in-process engine takes it: new zones started, every zone told, new sites built
``deployed``     a deployment: the aggregator's request, and the run's membership that hands the
                 change to every zone before the coordinator takes it
``zone_reload``  a served zone re-reads its own config and site keys when the coordinator asks

A change flows: ``fedshard reconfigure`` / ``fedshard aggregator reconfigure`` →
:func:`~fedshard.membership.offer.offer_change` → (deployed: the aggregator host starts new
zones, registers new SuperNodes, marks it ready) → before the next round the run's
membership applies it → the coordinator takes the new config and admits the new sites.
"""
