"""A run's folder, as every engine and the aggregator host keep it: carrying a run on
(``resume``) and its ``summary.json`` (``summary``). A change waiting in it is
:mod:`fedshard.membership`'s.

``resume``   the config a run ran with, what it recorded, more rounds
``summary``  the ``summary.json`` contract, the same for every engine and for a deployment
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.run_folder.resume import resumable_config, resumable_run, with_rounds
    from fedshard.run_folder.summary import build_summary

__all__ = ["build_summary", "resumable_config", "resumable_run", "with_rounds"]

__getattr__ = lazy_surface(
    __name__,
    {"build_summary": "summary", "resumable_config": "resume", "resumable_run": "resume", "with_rounds": "resume"},
)
