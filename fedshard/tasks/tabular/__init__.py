"""Records in a table as a fedshard task: an outcome predicted from a user's own table.

* :mod:`~fedshard.tasks.tabular.task`: ``task.target: fedshard.tasks.tabular:classification``;
* :mod:`~fedshard.tasks.tabular.columns`: how columns become inputs (scaled numbers, one-hot categories).
"""

from __future__ import annotations

from fedshard.tasks.tabular.task import Classification, classification

__all__ = ["Classification", "classification"]
