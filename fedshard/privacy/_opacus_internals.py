"""The Opacus 1.6 internals fedshard relies on, checked in one place: the DP-SGD replacements
(the secure noise source and per-sample normalisation both swap one method of Opacus's
``DPOptimizer``) and the accountants' memo of one step's RDP (:func:`memoise_one_step_rdp`)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["memoise_one_step_rdp", "processed_flags"]

_ONE_STEP_RDP_MEMO = 1 << 16
"""(q, σ, order) triples kept: ~100 orders per (σ, q), so hundreds of distinct (σ, q) pairs."""


def processed_flags(optimizer: Any, needs: tuple[str, ...]) -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """Opacus's ``_check_processed_flag`` and ``_mark_as_processed`` if ``optimizer`` is the Opacus 1.6
    ``DPOptimizer`` they belong to and has every attribute of ``needs`` (looked up on its class
    first, so a property is not evaluated); else None."""
    try:
        from opacus.optimizers import optimizer as opacus_optimizer
        from opacus.optimizers.optimizer import DPOptimizer
    except ImportError:  # pragma: no cover - opacus is a dependency
        return None
    check, mark = (getattr(opacus_optimizer, n, None) for n in ("_check_processed_flag", "_mark_as_processed"))
    fits = (
        type(optimizer) is DPOptimizer
        and callable(check)
        and callable(mark)
        and all(hasattr(type(optimizer), a) or hasattr(optimizer, a) for a in needs)
    )
    if not fits:
        return None
    assert check is not None and mark is not None  # what `fits` checked
    return check, mark


@functools.cache
def memoise_one_step_rdp() -> bool:
    """Remember Opacus's RDP of one subsampled Gaussian step at one order (``_compute_rdp(q, sigma,
    alpha)``, a pure function of three numbers) in this process; True where it was installed.

    Every ε a ledger composes with PRV first sizes its grid by RDP (Opacus's
    ``compute_safe_domain_size``), computing the RDP curve of each ``(σ, q)`` of the history
    again, order by order, in Python: half of a private in-process federation's time on a small
    table went there, for the same few ``(σ, q)`` every round and every site. The cache changes
    no result (the same function of the same arguments). An Opacus whose function is not there
    under that signature keeps its own (nothing is installed)."""
    try:
        from opacus.accountants.analysis import rdp as analysis  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - opacus is a dependency
        return False
    original = getattr(analysis, "_compute_rdp", None)
    if not callable(original) or hasattr(original, "cache_info"):
        return hasattr(original, "cache_info")
    try:
        fits = list(inspect.signature(original).parameters) == ["q", "sigma", "alpha"]
    except (TypeError, ValueError):  # pragma: no cover - not a Python function
        fits = False
    if not fits:
        return False
    analysis._compute_rdp = functools.lru_cache(maxsize=_ONE_STEP_RDP_MEMO)(original)
    return True
