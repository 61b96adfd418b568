"""Per-sample normalisation for DP-SGD: every record's gradient scaled to the clip, not cut at it.

Flat clipping (Opacus's) multiplies record *i*'s gradient by ``min(1, C / ‖gᵢ‖)``: records
whose gradients are small keep them small, while the noise is always ``σ·C``. When most
gradients sit well below the clip (a well-fitted model, small features, a table the clip
was not chosen on) the noise drowns them, so flat clipping needs ``C`` tuned per data set.

Normalisation (Bu et al., 2023, "Automatic clipping"; De et al., 2022) multiplies it by
``C / (‖gᵢ‖ + γ)`` instead: every record contributes a vector of norm just under ``C``
pointing along its gradient, so the signal-to-noise ratio no longer depends on ``C`` or on
the gradients' scale, only on how well the records agree. ``γ`` (:data:`STABILITY`, the
paper's 0.01) keeps records whose gradient is near zero from being blown up to full size.

Privacy is that of flat clipping at ``C``: one record's contribution has norm below ``C``
either way, and the noise, the sampling and the accounting are untouched. With shared
(distributed) noise every site still clips at the one ``C`` of the plan, so the others'
shares cover any record's contribution as before.

:func:`install` puts this into an Opacus ``DPOptimizer`` in place of its
``clip_and_accumulate``. It relies on Opacus 1.6 internals (the pinned version), which it
checks first; an optimiser they do not fit is refused (:class:`PrivacyError`), since the
site asked for this recipe and would otherwise train on another without knowing.
"""

from __future__ import annotations

from typing import Any

from fedshard.errors import PrivacyError
from fedshard.privacy._opacus_internals import processed_flags

__all__ = ["STABILITY", "install", "normalized_factors"]

STABILITY = 0.01
"""γ of ``C / (‖g‖ + γ)``: Bu et al.'s default."""


def normalized_factors(per_sample_norms: Any, clip: float) -> Any:
    """Each record's scale ``clip / (‖gᵢ‖ + γ)`` (a torch tensor like ``per_sample_norms``):
    every scaled gradient has norm ``clip · ‖gᵢ‖ / (‖gᵢ‖ + γ) < clip``."""
    return clip / (per_sample_norms + STABILITY)


def install(optimizer: Any) -> None:
    """Make an Opacus ``DPOptimizer`` normalise each record's gradient to its ``max_grad_norm``
    (see the module docstring); :class:`PrivacyError` if its internals are not Opacus 1.6's."""
    flags = processed_flags(optimizer, ("params", "grad_samples", "_get_flat_grad_sample", "max_grad_norm"))
    if flags is None:
        raise PrivacyError(
            f"normalised DP-SGD (mechanism dpsgd-normalized): {type(optimizer).__name__} is not the Opacus 1.6 "
            "DPOptimizer fedshard knows; use mechanism dpsgd (flat clipping) with this task"
        )
    check, mark = flags
    import torch

    def clip_and_accumulate() -> None:
        samples = optimizer.grad_samples
        if len(samples[0]) == 0:  # an empty Poisson batch: nothing to add, the noise still is
            factors = torch.zeros((0,), device=samples[0].device)
        else:
            norms = torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in samples], dim=1).norm(2, dim=1)
            factors = normalized_factors(norms, optimizer.max_grad_norm)
        for p in optimizer.params:
            check(p.grad_sample)
            sample = optimizer._get_flat_grad_sample(p).to(p.dtype)
            grad = torch.einsum("i,i...", factors.to(device=sample.device, dtype=p.dtype), sample)
            p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
            mark(p.grad_sample)

    optimizer.clip_and_accumulate = clip_and_accumulate
    optimizer.fedshard_normalized = True
