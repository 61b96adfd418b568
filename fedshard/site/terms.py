"""The privacy terms a site takes part under: what its own config promises, and the check
that a coordinator's plan only tightens them.

A site's operator holds its config: a deployed site's copy of the federation config
and its own file (``fedshard site up``), a simulated site's the run's config. That copy,
not the coordinator, decides the site's DP mechanisms and their parameters and its
privacy budget. The coordinator's :class:`~fedshard.protocol.messages.PrivacyPlan` may
only tighten them:

===================================  ===========================================================
the plan may                         the plan may not (refused before anything is reserved)
===================================  ===========================================================
add noise (a larger σ)               leave out a mechanism the site's config turns on
clip harder (smaller clips)          ask for less noise or a larger clip than the site's config
share noise over fewer sites         share noise over more sites than the site's config allows
lower the budget (the stricter wins) (a larger budget is not refused: the site keeps its own)
plan more rounds (calibrates more σ)
turn on a mechanism the site's       run the record-level round with another batch size or
config leaves off                    number of epochs than the plan it accounts
sample each round's step at a rate   name another mechanism than the site's config
(``sample_rate``) the site's config  (``privacy.*.mechanism``), or another sample rate than
leaves unset                         the site's ``privacy.record_level.sample_rate``
                                     sample a step at a rate from a round other than one
                                     epoch of every record
===================================  ===========================================================

A plan that asks for less is never "rounded up": it is refused in one line, because a
site that silently ran other settings than the federation believes would break the
distributed-noise arithmetic of the others, and a coordinator that asks for less is
either misconfigured or breached. The budget is the exception: the stricter of the two
has always applied, so a site with a stricter own cap takes part under its cap.

Fixed σ and calibrated σ mix: where either side calibrates σ to its budget
(``noise_multiplier`` left empty), the site calibrates with the budget it keeps and the
larger number of planned rounds, and runs the largest of that and every fixed σ
(:meth:`PrivacyTerms.noise_floor`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedshard.config import FULL_BATCH, BudgetConfig, FederationConfig, PrivacyConfig, stricter
from fedshard.errors import PrivacyError, RefusalCode
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.mechanisms import check_configured
from fedshard.protocol.messages import PrivacyPlan, RecordPlan, UpdatePlan

__all__ = ["PrivacyTerms"]


def _refuse(site_id: str, what: str) -> PrivacyError:
    return PrivacyError(
        f"site {site_id}: {what}; a coordinator may only tighten a site's own privacy settings, so nothing was "
        "released",
        code=RefusalCode.PRIVACY,
    )


@dataclass(frozen=True)
class PrivacyTerms:
    """A site's own DP mechanisms, budget and calibration horizon.

    Attributes
    ----------
    config:
        The ``privacy`` section of the site's own copy of the federation config: which
        mechanisms are on, their σ, clips, ``distributed_over`` and accountant.
    budget:
        The budget the site's own config gives it: its entry's (or the default) budget,
        and its ``cap``, the stricter of both; None when its config sets none.
    planned_rounds:
        The rounds its config plans (:attr:`FederationConfig.planned_rounds`: its share of
        ``federation.rounds``, or its ``calibration_rounds`` where more): the horizon it
        calibrates σ over when σ is not fixed.
    """

    config: PrivacyConfig = field(default_factory=PrivacyConfig)
    budget: BudgetConfig | None = None
    planned_rounds: int = 0

    def __post_init__(self) -> None:
        """Refuse (:class:`~fedshard.errors.ConfigError`, one line) own mechanisms no one registered."""
        check_configured(self.config)

    @classmethod
    def of(cls, config: FederationConfig, site_id: str, cap: BudgetConfig | None = None) -> PrivacyTerms:
        """The terms ``config`` (the site's own copy) gives ``site_id``, with ``cap`` (its own
        file's cap, if any) as a further limit."""
        budget = stricter(config.listed_budget(site_id), cap)
        return cls(config.privacy, budget, config.planned_rounds)

    @property
    def required(self) -> bool:
        """Whether the site's own config turns any DP mechanism on (a round without a plan is refused)."""
        return self.config.enabled

    def admit(
        self, asked: PrivacyPlan | None, site_id: str, *, batch_size: int | None = None, epochs: int | None = None
    ) -> PrivacyPlan | None:
        """The plan the site runs: ``asked`` checked against its own terms.

        ``batch_size`` and ``epochs``, when given, are the round's training settings (the
        train instruction's): record-level DP must train as its plan accounts.

        Returns
        -------
        PrivacyPlan | None
            ``asked`` with the site's own accountant and at least its own planned rounds;
            None when neither side turns DP on.

        Raises
        ------
        PrivacyError
            ``asked`` is missing while the site's config turns DP on, leaves out one of its
            mechanisms, or asks for less noise, a larger clip or wider noise sharing (one
            line naming the setting; code ``privacy``).
        """
        own = self.config
        if asked is None:
            if own.enabled:
                raise _refuse(site_id, f"the aggregator sent no privacy plan but its own config turns on {self._on}")
            return None
        record = self._record(asked.record, site_id)
        update = self._update(asked.update, site_id)
        if record is not None and (
            (batch_size is not None and batch_size != asked.batch_size)
            or (epochs is not None and epochs != asked.epochs)
        ):
            raise _refuse(
                site_id,
                f"the round trains with batch size {batch_size} for {epochs} epoch(s) but its privacy plan accounts "
                f"batch size {asked.batch_size} for {asked.epochs}",
            )
        rate = record.sample_rate if record is not None else None
        if rate is not None and (asked.batch_size != FULL_BATCH or asked.epochs != 1):
            raise _refuse(
                site_id,
                f"the aggregator asks for one DP-SGD step a round at sample rate {rate:g} but its plan "
                f"trains batch size {asked.batch_size} for {asked.epochs} epoch(s); a sampled step needs every "
                "record (batch size 0) for one epoch",
            )
        try:
            accountant = AccountantKind(own.record_level.accountant) if own.enabled else asked.accountant
        except ValueError as exc:
            raise _refuse(site_id, f"its own config's privacy.record_level.accountant: {exc}") from None
        return asked.model_copy(update={"accountant": accountant, "record": record, "update": update})

    @property
    def _on(self) -> str:
        on = [
            name
            for name, m in (("record_level", self.config.record_level), ("update_level", self.config.update_level))
            if m.enabled
        ]
        return " and ".join(f"privacy.{name}" for name in on)

    def _record(self, asked: RecordPlan | None, site_id: str) -> RecordPlan | None:
        mine = self.config.record_level
        if asked is None:
            if mine.enabled:
                raise _refuse(site_id, "the aggregator's plan has no record-level DP but its own config turns it on")
            return None
        self._check_sharing(
            asked.distributed_over, mine.distributed_over if mine.enabled else None, "record_level", site_id
        )
        if not mine.enabled:
            return asked
        _same_mechanism(asked.mechanism, mine.mechanism, "record_level", site_id)
        if mine.sample_rate is not None and asked.sample_rate != mine.sample_rate:
            asked_rate = "none" if asked.sample_rate is None else f"{asked.sample_rate:g}"
            raise _refuse(
                site_id,
                f"the aggregator asks for record-level sample rate {asked_rate}; its own config's "
                f"privacy.record_level.sample_rate is {mine.sample_rate:g}",
            )
        if asked.max_grad_norm > mine.max_grad_norm:
            raise _refuse(
                site_id,
                f"the aggregator asks for record-level clipping at {asked.max_grad_norm:g}, above its own "
                f"privacy.record_level.max_grad_norm {mine.max_grad_norm:g}",
            )
        fixed = mine.noise_multiplier
        if fixed is not None and asked.noise_multiplier is not None and asked.noise_multiplier < fixed:
            raise _refuse(
                site_id,
                f"the aggregator asks for record-level σ={asked.noise_multiplier:g}, below its own "
                f"privacy.record_level.noise_multiplier {fixed:g}",
            )
        return asked.model_copy(update={"planned_rounds": max(asked.planned_rounds, self.planned_rounds)})

    def _update(self, asked: UpdatePlan | None, site_id: str) -> UpdatePlan | None:
        mine = self.config.update_level
        if asked is None:
            if mine.enabled:
                raise _refuse(site_id, "the aggregator's plan has no update-level DP but its own config turns it on")
            return None
        self._check_sharing(
            asked.distributed_over, mine.distributed_over if mine.enabled else None, "update_level", site_id
        )
        if not mine.enabled:
            return asked
        _same_mechanism(asked.mechanism, mine.mechanism, "update_level", site_id)
        if asked.clip_norm > mine.clip_norm:
            raise _refuse(
                site_id,
                f"the aggregator asks for update-level clipping at {asked.clip_norm:g}, above its own "
                f"privacy.update_level.clip_norm {mine.clip_norm:g}",
            )
        if asked.noise_multiplier < mine.noise_multiplier:
            raise _refuse(
                site_id,
                f"the aggregator asks for update-level σ={asked.noise_multiplier:g}, below its own "
                f"privacy.update_level.noise_multiplier {mine.noise_multiplier:g}",
            )
        return asked

    @staticmethod
    def _check_sharing(asked: int | None, own: int | None, name: str, site_id: str) -> None:
        """A site shares its noise over at most as many sites as its own config allows (a wider
        share means each site adds less)."""
        if asked is not None and (own is None or asked > own):
            raise _refuse(
                site_id,
                f"the aggregator asks it to share its {name} noise over {asked} sites; its own config allows "
                f"{own or 'no sharing'} (privacy.{name}.distributed_over)",
            )

    def noise_floor(self) -> float | None:
        """The σ the site's own config fixes for record-level DP (None: it calibrates σ, or it is off)."""
        mine = self.config.record_level
        return mine.noise_multiplier if mine.enabled else None

    def calibrates(self) -> bool:
        """Whether the site's own config calibrates record-level σ to its budget."""
        mine = self.config.record_level
        return mine.enabled and mine.noise_multiplier is None


def _same_mechanism(asked: str, own: str, name: str, site_id: str) -> None:
    """A site runs the mechanism its own config names, never another the coordinator picks."""
    if asked != own:
        raise _refuse(
            site_id,
            f"the aggregator asks for the {name} mechanism {asked!r}; its own config names {own!r} "
            f"(privacy.{name}.mechanism)",
        )
