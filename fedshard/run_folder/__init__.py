"""A run's folder, as every engine and the aggregator host keep it: carrying a run on
(``resume``), its ``summary.json`` (``summary``), and the change waiting for it (``changes``).

``resume``   the config a run ran with, what it recorded, more rounds
``summary``  the ``summary.json`` contract, the same for every engine and for a deployment
``changes``  a new config checked against the run's and left for it to take before its next round
"""
