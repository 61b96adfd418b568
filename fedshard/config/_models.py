"""Configuration models. Every default lives here, once.

All models forbid unknown keys, so a typo in a YAML file is an error that names the
key instead of a setting silently ignored.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from fedshard.config._deployment import AggregatorDeployment, SiteDeployment
from fedshard.config._jurisdictions import check_jurisdictions
from fedshard.config.privacy import BudgetConfig, PrivacyConfig, stricter
from fedshard.config.residency import ResidencyConfig

__all__ = [
    "FULL_BATCH",
    "MAX_SITE_WEIGHT_LIMIT",
    "MAX_VALUE_LIMIT",
    "AggregationConfig",
    "BoundRule",
    "FederationConfig",
    "FederationSettings",
    "HeConfig",
    "ShardingConfig",
    "ServerOptimizerConfig",
    "SiteConfig",
    "SiteLocalConfig",
    "SiteLocalSettings",
    "StoreConfig",
    "TaskConfig",
    "TrainingConfig",
    "ZoneConfig",
    "ZoneLimits",
    "local_batch",
]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
Name = Annotated[str, Field(pattern=_NAME)]
Jurisdiction = Annotated[str, Field(pattern=r"^[A-Z]{2,8}$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FederationSettings(_Model):
    """How rounds run."""

    name: Name = "federation"
    seed: int = 0
    rounds: int = Field(10, ge=1, le=100_000)
    min_sites: int = Field(2, ge=1)
    sample_fraction: float = Field(1.0, gt=0.0, le=1.0)
    round_timeout_s: float = Field(300.0, gt=0)
    partitions: int | None = Field(
        None,
        ge=1,
        description="simulation: how many parts the task's data is cut into (default: one per site listed); set "
        "it above the number of sites to let sites join a running federation without re-cutting the others' data",
    )


class TaskConfig(_Model):
    """The task plug-in: ``module:object`` and options passed to it."""

    target: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    options: dict[str, object] = Field(default_factory=dict)


class ServerOptimizerConfig(_Model):
    """How sites apply each published aggregate (post-processing: no privacy cost)."""

    kind: str = Field(
        "avg",
        pattern=r"^[a-z][a-z0-9_-]{0,39}$",
        description="a registered rule (fedshard.aggregation.server_rules): avg, momentum, adam, or one of the task's",
    )
    learning_rate: float = Field(1.0, gt=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.99, ge=0, lt=1)
    tau: float = Field(1e-3, gt=0, description="adam: added to √v")


MAX_SITE_WEIGHT_LIMIT = 1e15
"""The largest ``aggregation.max_site_weight`` a config may set (see :class:`AggregationConfig`)."""
MAX_VALUE_LIMIT = 1e15
"""The largest ``aggregation.max_value`` a config may set (see :class:`AggregationConfig`)."""


class BoundRule(StrEnum):
    """What a zone does with a site's plaintext update that exceeds a bound."""

    CLIP = "clip"
    """Bring it within the bound (values: clipped to ±bound; norm: the update scaled down
    to the bound) after its digests and signature were verified, then fold it."""
    REFUSE = "refuse"
    """Refuse the whole push with code ``bound``; nothing of it is counted."""


class AggregationConfig(_Model):
    """Bounds on what a zone folds into a round's sums, fixed by the federation, not by sites.

    * **Weights.** The coordinator fixes each selected site's aggregation weight when it
      opens a round: the number of training examples the site reported, capped at
      ``max_weight_over_median`` times the federation's median site (the lower median of
      what every site reported: one site cannot move it) and at ``max_site_weight``. Zones
      receive the weights with the round (``OpenRound``), refuse a round with a weight
      above their own cap, and refuse (code ``weight``) a manifest whose weight differs
      from the round's.
    * **Values.** Every plaintext update value must satisfy ``|x| ≤ max_value``; a larger
      one is refused (code ``bound``) or clipped to ``±max_value``, by ``value_rule``.
      A forwarded partial sum ``S = Σ (w/unit)·x`` is refused (never clipped: it is another
      zone's sum) unless every ``|S| ≤ Σ w / unit · max_value`` (``unit``: the round's
      largest fixed weight), and its ``Σ w`` must be the sum of the round's weights of the
      sites it names.
    * **Norm.** The L2 norm of a site's plaintext shards at one zone (a zone sees only its
      own shards) must not exceed ``max_update_norm`` (when set) nor, from the zone's second
      round on, ``max_norm_over_median`` times the lower median of the norms the zone
      accepted in its last three rounds from the sites that push the same shards there:
      ``norm_rule`` scales the update down to the bound (``clip``, the standard defence
      against scaled poisoning) or refuses the push (``refuse``). A zone's first round
      (after it starts) has no such reference: only ``max_update_norm`` bounds it.

    **Sums stay finite by construction.** A zone folds each term as ``(w/unit)·x`` with
    ``unit`` the largest of the round's fixed weights, so every factor is at most 1 and
    ``|(w/unit)·x| ≤ V = max_value ≤ 10^15``; each site is folded into a shard's sum at
    most once, so a sum over ``N`` sites is at most ``N·V ≤ N·10^15`` in magnitude: finite
    in float32 (max ≈ 3.4·10^38, the sums' dtype for float32 models) for any ``N <
    10^23``, whatever ``max_site_weight``. The weighted mean of bounded values lies within
    ``±V`` and within the shard dtype's range. The sums' rounding error is stated (and
    tested) in :mod:`fedshard.aggregation._accumulator`.

    HE-encrypted shards cannot be value- or norm-checked by a zone (it sees only
    ciphertext; their weight is inside it): sites clip them to ``±he.value_range``
    before encrypting, and the encoding's headroom keeps their sums from overflowing.
    """

    max_site_weight: float = Field(
        1e6,
        ge=1,
        le=MAX_SITE_WEIGHT_LIMIT,
        description="cap on a site's aggregation weight (its reported number of training examples)",
    )
    max_value: float = Field(
        1e4, gt=0, le=MAX_VALUE_LIMIT, description="bound on |x| for every plaintext update value a zone folds"
    )
    value_rule: BoundRule = Field(BoundRule.REFUSE, description="a value above max_value: refuse the push, or clip")
    max_update_norm: float | None = Field(
        None, gt=0, description="bound on the L2 norm of a site's plaintext shards at one zone (None: no bound)"
    )
    norm_rule: BoundRule = Field(BoundRule.CLIP, description="an update above max_update_norm: clip (scale), or refuse")

    max_weight_over_median: float | None = Field(
        4.0,
        ge=1,
        description="cap on a site's weight relative to the federation's median site: this many times the lower "
        "median of the examples the sites reported (None: only max_site_weight)",
    )
    max_norm_over_median: float | None = Field(
        10.0,
        gt=1,
        description="bound on a site's update norm at a zone relative to the lower median of the norms the zone "
        "accepted in its last 3 rounds from sites pushing the same shards there (None: only max_update_norm)",
    )

    def fixed_weight(self, num_examples: int, median: float | None = None) -> float:
        """The weight a site that reports ``num_examples`` gets: at least 1, at most ``max_site_weight``
        and, given the federation's ``median`` site (:meth:`weight_cap`), at most its cap."""
        cap = self.max_site_weight if median is None else self.weight_cap(median)
        return float(min(max(num_examples, 1), cap))

    def weight_cap(self, median: float) -> float:
        """The largest weight any site gets when the federation's median site reported ``median``
        examples: ``max_weight_over_median`` × it (at least 1), within ``max_site_weight``."""
        if self.max_weight_over_median is None:
            return self.max_site_weight
        return min(max(self.max_weight_over_median * median, 1.0), self.max_site_weight)


FULL_BATCH = 0
"""``training.batch_size: all`` as a round's instruction and privacy plan carry it: every record
the site holds in one batch (one step per epoch; DP-SGD's sample rate 1)."""


def local_batch(batch_size: int, num_examples: int) -> int:
    """The batch a site with ``num_examples`` records trains with: all of them for :data:`FULL_BATCH`."""
    return max(num_examples, 1) if batch_size == FULL_BATCH else batch_size


class TrainingConfig(_Model):
    """Local training settings sent to every site each round."""

    local_epochs: int = Field(1, ge=1)
    batch_size: Annotated[int, Field(ge=1)] | Literal["all"] = Field(
        32, description="records per step, or all: every record a site holds in one batch (full-batch training)"
    )
    learning_rate: float = Field(0.05, gt=0)
    server_optimizer: ServerOptimizerConfig = Field(default_factory=ServerOptimizerConfig)

    @property
    def sent_batch_size(self) -> int:
        """``batch_size`` as rounds and privacy plans carry it (:data:`FULL_BATCH` for ``all``)."""
        return FULL_BATCH if self.batch_size == "all" else self.batch_size


class ShardingConfig(_Model):
    """How tensors are cut into shards."""

    tile: tuple[int, int] = (256, 256)

    @field_validator("tile")
    @classmethod
    def _positive(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] < 1 or v[1] < 1:
            raise ValueError("tile sizes must be positive, e.g. [256, 256]")
        return v


class ZoneLimits(_Model):
    """What one caller may hold of a zone's gRPC server (see :mod:`fedshard.zone.rpc._guard`).

    Anyone who reaches the port may open calls and never finish them; these bound
    what that costs the zone, so that the other parties' calls still find a worker.
    Every call is admitted by its caller's certificate before its request is read:
    streams (Push, Forward, FetchAggregate) within ``streams_per_party``, unary calls
    (OpenRound, CloseRound, Info, Reconfigure) within ``calls_per_party``; the
    ``connection_*``, ``keepalive_s`` and ``handshake_s`` settings bound the
    connections under them.
    """

    streams_per_party: int = Field(
        4, ge=1, le=64, description="concurrent Push/Forward/FetchAggregate streams one certificate may hold"
    )
    calls_per_party: int = Field(
        4,
        ge=1,
        le=64,
        description="concurrent OpenRound/CloseRound/Info/Reconfigure calls one certificate may hold (their "
        "request is read under the idle_s watchdog)",
    )
    idle_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="longest wait for a call's request or a stream's next frame (or for the peer to take one)",
    )
    grace_s: float = Field(60.0, ge=0, le=3600, description="waiting every stream may spend before min_rate applies")
    min_rate_kib_s: float = Field(
        64.0, gt=0, description="a stream must move this many KiB per second the zone waits on it, beyond grace_s"
    )
    staging_wait_s: float = Field(
        30.0, gt=0, le=3600, description="longest wait for staging bytes before a push is refused as busy"
    )
    header_mb: int = Field(
        16, ge=1, le=256, description="largest message received (a manifest: ~140 bytes a shard; 16 MiB ≈ 110k shards)"
    )
    workers: int | None = Field(
        None,
        ge=4,
        le=4096,
        description="gRPC worker threads; default: every site and zone's streams and calls, the coordinator's "
        "calls, plus 16",
    )
    connection_idle_s: float = Field(
        300.0, ge=1, le=86400, description="a connection without a call for this long is closed (GOAWAY)"
    )
    connection_age_s: float = Field(
        3600.0,
        ge=10,
        le=604800,
        description="a connection older than this takes no new call (GOAWAY; the client reconnects); its calls in "
        "flight have as long again to finish",
    )
    keepalive_s: float = Field(
        60.0,
        ge=10,
        le=7200,
        description="the zone pings a connection silent for this long, and closes it if the ping is not answered "
        "within as long again",
    )
    handshake_s: float = Field(
        10.0, gt=0, le=300, description="a connection must complete its TLS handshake within this long"
    )


class ZoneConfig(_Model):
    """One cloud aggregation zone."""

    name: Name
    region: Jurisdiction
    endpoint: str = Field("127.0.0.1:0", description="host:port; port 0 picks a free port (embedded runs)")
    store: Path | None = None
    staging_mb: int = Field(256, ge=1)
    limits: ZoneLimits = Field(default_factory=ZoneLimits)
    drain: bool = Field(
        False,
        description="drained: sites push nothing more here (the policy routes them elsewhere, or the change is "
        "refused); the zone still serves the aggregates it published",
    )

    @field_validator("endpoint")
    @classmethod
    def _host_port(cls, v: str) -> str:
        if not re.match(r"^[\w.\-\[\]:]+:\d{1,5}$", v):
            raise ValueError(f"endpoint must be host:port, got {v!r}")
        if int(v.rsplit(":", 1)[1]) > 65535:
            raise ValueError(f"endpoint {v!r}: a port is at most 65535 (0: any free port)")
        return v


class HeConfig(_Model):
    """Homomorphic encryption of the shard classes ``residency.encrypt`` names (see fedshard.crypto.he)."""

    scheme: str = Field(
        "bfv",
        pattern=r"^[a-z][a-z0-9_-]{0,39}$",
        description="bfv (exact integer sums, 2.0× float32 bytes) or ckks (4.0×); every party's contexts must be "
        "of this scheme (fedshard keys he-init --scheme)",
    )
    keys: Path | None = Field(
        None, description="folder with secret.ctx (sites) and public.ctx (zones); simulate makes one if empty"
    )
    value_range: float = Field(1.0, gt=0, description="weighted update values are clipped to ± this before packing")
    max_sites: int = Field(16, ge=2, le=1024, description="most sites one encrypted sum may hold (sets headroom)")


class StoreConfig(_Model):
    """How sites keep their parameter shards on-premise (see fedshard.site.model_store)."""

    encrypt: bool = Field(True, description="AES-256-GCM per shard under the site's key-encryption key")
    lookahead: int = Field(2, ge=0, le=64, description="layers the loader decrypts ahead of the one in use")
    base: Literal["resident", "int8", "fp8", "int4"] = Field(
        "resident",
        description=(
            "the model's frozen base (e.g. under LoRA adapters): 'resident' keeps it in memory as the task builds "
            "it; a cold format seals it in the site's store (<state_dir>/base) and streams its Linear and "
            "Embedding weights, dequantised a few layers ahead, through every forward and backward"
        ),
    )
    base_codes: Literal["memory", "store"] = Field(
        "memory",
        description=(
            "with a cold store.base: 'memory' reads the streamed weights' codes once per process, checked, and keeps "
            "them (int8, fp8: 27 % of the fp32 base; int4: 14 %), dequantising them at each use; 'store' reads, "
            "decrypts and dequantises them from the store at every forward and backward (a few layers in memory; "
            "a store read costs some 20 times a dequantisation: bench/llm_stream.py)"
        ),
    )

    @model_validator(mode="after")
    def _base_needs_sealing(self) -> StoreConfig:
        if self.base != "resident" and not self.encrypt:
            raise ValueError(
                f"store.base: {self.base} keeps the base in the sealed store, which needs store.encrypt: true"
            )
        return self


class SiteConfig(_Model):
    """One site of the federation, as the aggregator knows it."""

    id: Name
    jurisdiction: Jurisdiction
    partition: int | None = Field(None, ge=0, description="data partition index; default: position in the list")
    budget: BudgetConfig | None = Field(None, description="this site's budget (default: privacy.budget)")
    cap: BudgetConfig | None = Field(
        None, description="the site's own, stricter cap (what its local config says; simulation only)"
    )


class SiteLocalSettings(_Model):
    """What a site's own config file says about the site (``fedshard budget show --site-config``)."""

    id: Name
    jurisdiction: Jurisdiction
    state_dir: Path = Field(description="the site's on-prem folder (shards, ledger); relative to this file")
    cap: BudgetConfig | None = Field(None, description="the site's own privacy cap; the stricter budget wins")


class SiteLocalConfig(_Model):
    """A site's own config file."""

    site: SiteLocalSettings
    deployment: SiteDeployment | None = Field(None, description="how the site joins a deployed federation")


@dataclass(frozen=True, slots=True)
class _SiteIndex:
    """Lookups over one list of sites (10,000 sites: a scan per lookup would be quadratic)."""

    sites: list[SiteConfig]
    by_id: dict[str, SiteConfig]
    partitions: dict[str, int]

    @classmethod
    def of(cls, sites: list[SiteConfig]) -> _SiteIndex:
        partitions = {s.id: s.partition if s.partition is not None else i for i, s in enumerate(sites)}
        return cls(sites, {s.id: s for s in sites}, partitions)


class FederationConfig(_Model):
    """A whole federation: the file ``fedshard simulate --config`` reads."""

    federation: FederationSettings = Field(default_factory=FederationSettings)
    task: TaskConfig
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    sharding: ShardingConfig = Field(default_factory=ShardingConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    residency: ResidencyConfig = Field(default_factory=ResidencyConfig)
    he: HeConfig = Field(default_factory=HeConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    zones: list[ZoneConfig] = Field(min_length=1)
    reducing_zone: Name | None = Field(None, description="the zone that reduces shards allowed to leave their region")
    sites: list[SiteConfig] = Field(min_length=1)
    deployment: AggregatorDeployment | None = Field(None, description="the aggregator host (`fedshard aggregator up`)")
    _site_index: _SiteIndex | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _consistent(self) -> FederationConfig:
        ids = Counter(s.id for s in self.sites)
        dupes = sorted(i for i, n in ids.items() if n > 1)
        if dupes:
            raise ValueError(f"site ids must be unique; repeated: {', '.join(dupes)}")
        names = [z.name for z in self.zones]
        if len(set(names)) != len(names):
            raise ValueError("zone names must be unique")
        if self.reducing_zone is not None and self.reducing_zone not in names:
            raise ValueError(f"reducing_zone {self.reducing_zone!r} is not one of the zones ({', '.join(names)})")
        if self.reducing_zone is not None and any(z.drain for z in self.zones if z.name == self.reducing_zone):
            raise ValueError(f"the reducing zone {self.reducing_zone} cannot be drained; it reduces every round")
        for rule in self.residency.rules:
            if rule.preferred_zone is not None and rule.preferred_zone not in names:
                raise ValueError(
                    f"residency rule prefers zone {rule.preferred_zone!r}, which is not one of the zones "
                    f"({', '.join(names)})"
                )
        check_jurisdictions(
            ((s.id, s.jurisdiction) for s in self.sites),
            (z.region for z in self.zones),
            self.residency.named_codes(),
        )
        undefined = self.residency.undefined_classes()
        if undefined:
            where, name = undefined[0]
            raise ValueError(
                f"{where}: no shard can have class {name!r} (built in: public, restricted, personal; a class of "
                "your own needs a residency.classes entry that assigns it); check the spelling"
            )
        if self.federation.min_sites > len(self.sites):
            raise ValueError(
                f"federation.min_sites is {self.federation.min_sites} but only {len(self.sites)} sites are listed"
            )
        if not self.privacy.enabled:
            configured = [s.id for s in self.sites if s.budget is not None or s.cap is not None]
            if configured:
                raise ValueError(
                    f"site {configured[0]} has a privacy budget but no DP mechanism is enabled; "
                    "turn on privacy.record_level or privacy.update_level"
                )
        self._check_distributed_noise()
        self._check_sample_rate()
        if self.residency.encrypting and len(self.sites) > self.he.max_sites:
            raise ValueError(
                f"{len(self.sites)} sites but he.max_sites is {self.he.max_sites}: encrypted sums would overflow; "
                "raise he.max_sites"
            )
        parts = self._partitions
        cut = self.federation.partitions
        if cut is not None and max(parts.values()) >= cut:
            site = max(parts, key=lambda s: parts[s])
            raise ValueError(
                f"site {site} reads data partition {parts[site]} but federation.partitions is {cut}; "
                f"raise federation.partitions to at least {parts[site] + 1}"
            )
        if len(set(parts.values())) != len(parts):
            raise ValueError("two sites share a data partition index")
        return self

    def _check_sample_rate(self) -> None:
        """A round at a sample rate is one DP-SGD step over a Poisson sample of all of a site's records."""
        rate = self.privacy.record_level.sample_rate
        if rate is None or not self.privacy.record_level.enabled:
            return
        if self.training.batch_size != "all" or self.training.local_epochs != 1:
            raise ValueError(
                f"privacy.record_level.sample_rate ({rate:g}) makes each round one DP-SGD step over a Poisson "
                f"sample of all of a site's records: set training.batch_size: all and training.local_epochs: 1 "
                f"(got {self.training.batch_size} and {self.training.local_epochs})"
            )

    def _check_distributed_noise(self) -> None:
        """Distributed DP noise holds only where no zone sees one site's share and every
        aggregate sums at least ``n`` of them; record-level DP-SGD must then take one step a round."""
        shared, needed = self.privacy.shared_noise, self.privacy.shares_needed
        if not shared:
            return
        widest = f"privacy.{max(shared, key=shared.__getitem__)}.distributed_over"
        if self.residency.encrypt != "all":
            raise ValueError(
                f"{widest} needs residency.encrypt: all (a zone must never see one site's update with only its "
                "share of the noise)"
            )
        if needed > self.federation.min_sites:
            raise ValueError(
                f"{widest} is {needed} but federation.min_sites is {self.federation.min_sites}: rounds with fewer "
                "sites would carry less noise than accounted"
            )
        record = self.privacy.record_level
        if record.enabled and record.distributed_over and record.noise_multiplier is None:
            budgets = {s.id: self.listed_budget(s.id) for s in self.sites}
            default = self.privacy.budget
            odd = next((sid for sid, b in budgets.items() if b != default), None)
            if odd is not None:
                raise ValueError(
                    f"privacy.record_level.distributed_over with σ calibrated to the budget needs one budget for every "
                    f"site, but site {odd} has {_budget_text(budgets[odd])} against privacy.budget's "
                    f"{_budget_text(default)}: "
                    "each site would size its noise share to its own budget, and the others' shares cover a record "
                    "only at the smallest σ; give every site the same budget, or fix "
                    "privacy.record_level.noise_multiplier"
                )
        if record.distributed_over and self.training.local_epochs != 1:
            raise ValueError(
                f"privacy.record_level.distributed_over needs training.local_epochs: 1 (got "
                f"{self.training.local_epochs}): one DP-SGD step per round keeps a site's update linear in its "
                "noise share, so the shares add up in the aggregate"
            )

    @property
    def _index(self) -> _SiteIndex:
        """Sites by id and their partitions, built once per ``sites`` list (a copy with other sites rebuilds it)."""
        index = self._site_index
        if index is None or index.sites is not self.sites:
            index = self._site_index = _SiteIndex.of(self.sites)
        return index

    @property
    def _partitions(self) -> dict[str, int]:
        return self._index.partitions

    def site(self, site_id: str) -> SiteConfig:
        """The site with ``site_id``."""
        return self._index.by_id[site_id]

    def budget_of(self, site_id: str) -> BudgetConfig | None:
        """The budget the aggregator assigns to a site (its own entry, else the default)."""
        site = self.site(site_id)
        return site.budget if site.budget is not None else self.privacy.budget

    def listed_budget(self, site_id: str) -> BudgetConfig | None:
        """The budget this config gives a site: :meth:`budget_of` within its entry's ``cap``."""
        return stricter(self.budget_of(site_id), self.site(site_id).cap)

    @property
    def planned_rounds(self) -> int:
        """The rounds a calibrated record-level σ spends a budget over: those a site takes part in
        (``federation.rounds`` × ``sample_fraction``, rounded up), or
        ``privacy.record_level.calibration_rounds`` where that is more."""
        taken = math.ceil(self.federation.rounds * self.federation.sample_fraction)
        return max(taken, self.privacy.record_level.calibration_rounds or 0)

    def partition_of(self, site_id: str) -> int:
        """Data partition index of a site (explicit, or its position in the list)."""
        return self._partitions[site_id]

    @property
    def num_partitions(self) -> int:
        """How many partitions the data is cut into (``federation.partitions``, else one per site index)."""
        return self.federation.partitions or max(self._partitions.values()) + 1


def _budget_text(budget: BudgetConfig | None) -> str:
    """``ε=3, δ=1e-05`` (or ``none``), for one config error line."""
    return "none" if budget is None else f"ε={budget.epsilon:g}, δ={budget.delta:g}"
