"""Record-level DP: DP-SGD through Opacus, inside the task's own training loop (mechanisms
``dpsgd``, flat clipping, and ``dpsgd-normalized``, each record's gradient normalised to the
clip: :mod:`fedshard.privacy.clipping`).

A task opts in the way Opacus users do: it builds its model, optimiser and data
loader, then hands them to :meth:`RecordPrivacy.make_private` (Poisson sampling,
per-sample clipping, Gaussian noise). The site reserves the planned cost in its ledger
*before* training and checks afterwards that the task took exactly the planned steps.

The noise comes from a cryptographically secure source keyed by the operating system
(:mod:`fedshard.privacy.secure_noise`: ChaCha20, sampled against the floating-point
attacks on Gaussian samplers), never from the federation's seed: the coordinator knows
that seed, and noise it could predict it could subtract.
"""

from __future__ import annotations

import logging
import math
import secrets
import warnings
from typing import TYPE_CHECKING, Any

from fedshard.config import local_batch
from fedshard.errors import PrivacyError
from fedshard.privacy.clipping import install as install_normalized
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.mechanisms._shares import RoundShape, Sharing, noise_share
from fedshard.privacy.secure_noise import install as install_secure_noise

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["DpSgd", "RecordPrivacy", "check_model", "fix_model", "planned_record_event"]

log = logging.getLogger(__name__)


def planned_record_event(
    num_examples: int, batch_size: int, epochs: int, noise_multiplier: float, sample_rate: float | None = None
) -> DPEvent:
    """The DP event of one round of DP-SGD: Opacus's Poisson loader samples each record
    with rate ``1 / batches_per_epoch`` and takes ``batches_per_epoch`` steps per epoch
    (``batch_size`` :data:`~fedshard.config.FULL_BATCH`: one batch of every record). With
    ``sample_rate`` the round is ``epochs`` steps (one, as the site admits it) of a Poisson
    sample at that rate."""
    if num_examples < 1:
        raise PrivacyError("record-level DP needs at least one training record at the site")
    if sample_rate is not None:
        return DPEvent(Guarantee.RECORD, noise_multiplier, sample_rate, epochs)
    batches = math.ceil(num_examples / local_batch(batch_size, num_examples))
    return DPEvent(Guarantee.RECORD, noise_multiplier, 1.0 / batches, epochs * batches)


def check_model(model: torch.nn.Module) -> None:
    """Raise :class:`PrivacyError` if DP-SGD cannot train ``model`` (e.g. BatchNorm)."""
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        reasons = "; ".join(str(e) for e in errors[:3])
        raise PrivacyError(
            f"the model has layers DP-SGD cannot train ({reasons}); set privacy.record_level."
            "fix_incompatible_layers: true to replace them, or change the model"
        )


def fix_model(model: torch.nn.Module) -> torch.nn.Module:
    """Replace layers DP-SGD cannot train with compatible ones (Opacus's validator:
    BatchNorm becomes GroupNorm), then check the result.

    A model with nothing to replace is returned as it is: Opacus's ``fix`` clones the
    whole model through a pickle round trip first, which doubles its memory (a frozen
    base included) and fails on classes pickle cannot name (one defined in a function).
    """
    from opacus.validators import ModuleValidator

    if ModuleValidator.is_valid(model):
        return model
    fixed: torch.nn.Module = ModuleValidator.fix(model)
    check_model(fixed)
    return fixed


class RecordPrivacy:
    """Record-level DP settings for one round, handed to the task in ``TrainSettings``.

    Parameters
    ----------
    planned:
        The event the site reserved in its ledger for this round.
    max_grad_norm:
        Per-sample gradient clipping bound.
    noise_share:
        The multiple of the planned σ this site adds itself (1 unless the noise is
        distributed over several sites' encrypted shares, see
        :func:`~fedshard.privacy.mechanisms._shares.noise_share`).
    distributed:
        The noise is distributed: the round must be one DP-SGD step of plain SGD, for only
        then is the released update linear in the noise, so that the shares add up in the
        aggregate.
    normalized:
        Each record's gradient is normalised to ``max_grad_norm`` instead of cut at it
        (:mod:`fedshard.privacy.clipping`; the same privacy).
    """

    def __init__(
        self,
        planned: DPEvent,
        max_grad_norm: float,
        noise_share: float = 1.0,
        *,
        distributed: bool = False,
        normalized: bool = False,
    ) -> None:
        if not (noise_share > 0.0 and math.isfinite(noise_share)):
            raise PrivacyError(f"a site's noise share must be a positive number, got {noise_share}")
        if distributed and planned.steps != 1:
            raise PrivacyError(
                f"distributed record-level DP needs one DP-SGD step per round, but this round plans {planned.steps} "
                f"(sample rate {planned.sample_rate:.3g}); set training.local_epochs: 1 and training.batch_size: all "
                "(every record of the site in one batch)"
            )
        self.planned = planned
        self.max_grad_norm = max_grad_norm
        self.noise_share = noise_share
        self.distributed = distributed
        self.normalized = normalized
        self._engine: Any = None

    @property
    def training(self) -> RecordPrivacy:
        """What the task trains through: this object (handed to it in ``TrainSettings``)."""
        return self

    def release(self, update: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The update as it is: the noise went in during training."""
        return update

    @property
    def noise_multiplier(self) -> float:
        """σ of this round (what the ledger accounts)."""
        return self.planned.noise_multiplier

    @property
    def added_noise_multiplier(self) -> float:
        """The σ this site adds itself: ``noise_multiplier × noise_share``."""
        return self.planned.noise_multiplier * self.noise_share

    def make_private(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, data_loader: Any
    ) -> tuple[Any, Any, Any]:
        """Wrap the task's training objects for DP-SGD; returns ``(model, optimizer, loader)``.

        Train through the returned objects: the model's parameters are shared with the
        original, so the site reads the trained weights from the model it built.
        """
        import torch
        from opacus import PrivacyEngine

        check_model(model)
        if self._engine is not None:
            raise PrivacyError("make_private was called twice in one round; call it once per round")
        if self.distributed and type(optimizer) is not torch.optim.SGD:
            raise PrivacyError(
                f"distributed record-level DP needs the task's optimiser to be torch.optim.SGD (its one step is "
                f"linear in the noise), got {type(optimizer).__name__}; nothing was released"
            )
        # Opacus's hooks make torch say this on every backward pass; it is expected.
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Secure RNG turned off", category=UserWarning)
            engine = PrivacyEngine(accountant="prv")
        generator = torch.Generator().manual_seed(secrets.randbits(63))
        wrapped = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=data_loader,
            noise_multiplier=self.added_noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            poisson_sampling=True,
            noise_generator=generator,
        )
        install_secure_noise(wrapped[1])  # the torch generator above stays only where Opacus's internals differ
        if self.normalized:
            install_normalized(wrapped[1])
        self._engine = engine
        if not math.isclose(self.planned.sample_rate, 1.0 / len(data_loader), rel_tol=1e-9):
            wrapped = (wrapped[0], wrapped[1], self._at_planned_rate(wrapped[2], wrapped[1], engine))
        return wrapped  # type: ignore[no-any-return]

    def _at_planned_rate(self, loader: Any, optimizer: Any, engine: Any) -> Any:
        """Opacus takes the sample rate from the loader (one over its batches an epoch); a round
        planned at another rate (``privacy.record_level.sample_rate``: one step over a Poisson sample
        of every record) gets a loader that samples at the planned rate for the planned steps, an
        optimiser that averages over the expected sample (rate × records, not Opacus's rounded
        count: a site's share of the pooled step must weigh what its records do), and the
        accountant's hook at that rate, so that :meth:`spent` reads what was planned."""
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler
        from torch.utils.data import DataLoader

        rate, records = self.planned.sample_rate, len(loader.dataset)
        sampler = UniformWithReplacementSampler(
            num_samples=records, sample_rate=rate, generator=loader.batch_sampler.generator, steps=self.planned.steps
        )
        optimizer.expected_batch_size = rate * records
        optimizer.attach_step_hook(engine.accountant.get_optimizer_hook_fn(sample_rate=rate))
        return DataLoader(loader.dataset, batch_sampler=sampler, collate_fn=loader.collate_fn)

    def spent(self) -> DPEvent | None:
        """What training actually spent, from Opacus's record of noisy steps (None if
        the task never called :meth:`make_private`)."""
        if self._engine is None:
            return None
        history = self._engine.accountant.history
        steps = sum(int(s) for _, _, s in history)
        if steps == 0:
            return None
        sigmas = {float(n) for n, _, _ in history}
        rates = {float(q) for _, q, _ in history}
        if len(sigmas) != 1 or len(rates) != 1:
            raise PrivacyError("training changed σ or the sample rate within a round")
        return DPEvent(Guarantee.RECORD, sigmas.pop(), rates.pop(), steps)

    def verify(self) -> None:
        """Check training spent exactly what was reserved; return the event.

        Raises :class:`PrivacyError` if the task skipped DP-SGD or took other steps than
        planned (nothing may then be released)."""
        spent = self.spent()
        if spent is None:
            raise PrivacyError(
                "record-level DP is on but the task did not train through RecordPrivacy.make_private; "
                "nothing was released"
            )
        p, added = self.planned, self.added_noise_multiplier
        same = (
            spent.steps == p.steps
            and math.isclose(spent.sample_rate, p.sample_rate, rel_tol=1e-9)
            and math.isclose(spent.noise_multiplier, added, rel_tol=1e-9)
        )
        if not same:
            raise PrivacyError(
                f"training spent {spent.steps} steps at q={spent.sample_rate:.4g}, σ={spent.noise_multiplier:.4g}; "
                f"the ledger reserved {p.steps} steps at q={p.sample_rate:.4g} with this site adding "
                f"σ={added:.4g}; nothing was released"
            )


class DpSgd:
    """DP-SGD (Opacus): Poisson-sampled batches, per-sample clipping, Gaussian noise on every step.

    ``normalized``: each record's gradient is scaled to the clip rather than cut at it
    (registered as ``dpsgd-normalized``; :mod:`fedshard.privacy.clipping`).
    """

    guarantee = Guarantee.RECORD

    def __init__(self, *, normalized: bool = False) -> None:
        self.normalized = normalized
        self.name = "dpsgd-normalized" if normalized else "dpsgd"

    def event(self, shape: RoundShape, noise_multiplier: float) -> DPEvent:
        """:func:`planned_record_event` of ``shape``."""
        return planned_record_event(
            shape.num_examples, shape.batch_size, shape.epochs, noise_multiplier, shape.sample_rate
        )

    def start(self, planned: DPEvent, clip: float, sharing: Sharing) -> RecordPrivacy:
        """The round's :class:`RecordPrivacy`.

        With distributed noise a site adds its share of σ times its records over its
        aggregation weight (≥ 1 when the weight is capped): DP-SGD divides the noisy sum by
        the records, the aggregate multiplies by the weight, so this keeps every site's
        share as large as the uncapped sites' in the weighted sum, against which any one
        record's influence is measured. A weight above the records (< 1) would let a record
        move the sum by more than that: refused.
        """
        if not sharing.distributed:
            return RecordPrivacy(planned, clip, normalized=self.normalized)
        per_weight = sharing.examples / sharing.weight
        if per_weight < 1.0:  # a record would move the sum more than the others' shares cover
            raise PrivacyError(
                f"distributed record-level DP: the aggregator weighs this site above its number of records "
                f"(records / weight = {per_weight:.3g} < 1); nothing was released"
            )
        share = noise_share(sharing.distributed_over) * per_weight
        return RecordPrivacy(planned, clip, share, distributed=True, normalized=self.normalized)
