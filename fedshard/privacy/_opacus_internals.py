"""The Opacus 1.6 internals fedshard's DP-SGD replacements rely on (the secure noise source and
per-sample normalisation both swap one method of Opacus's ``DPOptimizer``), checked in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["processed_flags"]


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
