"""A run's folder, as every engine and the aggregator host keep it: carrying a run on
(``resume``) and its ``summary.json`` (``summary``). A change waiting in it is
:mod:`fedshard.membership`'s.

``resume``   the config a run ran with, what it recorded, more rounds
``summary``  the ``summary.json`` contract, the same for every engine and for a deployment
"""
