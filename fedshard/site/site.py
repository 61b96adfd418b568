"""The Site: one organisation's side of a round.

It keeps the model's parameter shards on-premise (a local store in the site's state
directory), trains through the task plug-in, and releases only the update, cut into
gradient shards that it pushes straight to a zone; the coordinator only ever sees the
metadata in the reports. Every message may arrive in a fresh process (Flower starts
one ClientApp process per message), so all state lives in the store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel

from fedshard.aggregation import ServerOptimizer, ServerOptimizerKind
from fedshard.config import LayerPolicy
from fedshard.errors import BudgetExhaustedError, FedshardError, IntegrityError, PrivacyError, RoundError
from fedshard.integrity import build_manifest, genesis_version, merkle_root, next_version, shard_digest
from fedshard.privacy.dpsgd import RecordPrivacy
from fedshard.privacy.events import Guarantee
from fedshard.privacy.update_dp import clip_and_noise
from fedshard.protocol.channels import ZoneConnector
from fedshard.protocol.messages import (
    AppliedRound,
    ApplyRule,
    EvaluateInstruction,
    EvaluateReport,
    MessageKind,
    PrivacyReport,
    QueryRequest,
    SiteInfo,
    TrainInstruction,
    TrainReport,
    UpdatePlan,
)
from fedshard.protocol.rounds import DEFAULT_GROUP
from fedshard.residency import RouteDecision
from fedshard.sharding import ShardPlan
from fedshard.site.model_store import ModelStore, SnapshotModelStore
from fedshard.site.privacy import SitePrivacy
from fedshard.site.routes import SiteRouting, view_key
from fedshard.task import Partition, Task, TaskData, TrainSettings, build_initial_model

if TYPE_CHECKING:
    import torch
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedshard.crypto.he import HeCodec

__all__ = ["Site"]

log = logging.getLogger(__name__)

_OPT = "optimizer/"  # prefix of server-optimiser state in the snapshot


@dataclass(frozen=True)
class _RoundDP:
    """The DP mechanisms of one round: DP-SGD inside training, noise on the update."""

    record: RecordPrivacy | None
    update: UpdatePlan | None


@dataclass
class _ModelState:
    version: str
    genesis: str
    applied_round: int
    shards: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)  # server optimiser state (m, v)
    rule: str = ""  # the server optimiser that produced these parameters


class Site:
    """A site's round logic.

    Parameters
    ----------
    site_id, jurisdiction:
        Who the site is.
    task:
        The task plug-in (model, data, training).
    partition:
        Which slice of the task's data is local to this site.
    tile:
        Shard tile size; every party must use the same.
    seed:
        Federation seed: all sites build the same initial model from it.
    state_dir:
        On-prem directory for the site's parameter shards.
    connect:
        Makes a zone client from ``(zone name, endpoint)``.
    privacy:
        The site's privacy bookkeeping (its own cap, its ledger).
    routing:
        Returns the site's residency routes (called once, when first needed); None:
        every shard goes to the first zone by name and joins one aggregate.
    signing_key:
        The site's Ed25519 key; when given, every manifest is signed with it.
    he:
        Returns the site's CKKS codec (secret context), for the shard classes the
        policy encrypts; called once, when first needed.
    dp_layers:
        With record-level DP: ``"fix"`` replaces layers DP-SGD cannot train (every
        site does the same, so they share the model), ``"check"`` refuses them, ``"keep"``
        (DP off) leaves the model as the task builds it.
    store:
        Where the model lives between messages (default: a plaintext snapshot in
        ``state_dir``; deployments and the demo use the encrypted store).
    """

    def __init__(
        self,
        site_id: str,
        jurisdiction: str,
        task: Task,
        partition: Partition,
        *,
        tile: tuple[int, int],
        seed: int,
        state_dir: str | Path,
        connect: ZoneConnector,
        privacy: SitePrivacy | None = None,
        dp_layers: LayerPolicy = LayerPolicy.KEEP,
        routing: Callable[[], SiteRouting] | None = None,
        signing_key: Ed25519PrivateKey | None = None,
        he: Callable[[], HeCodec] | None = None,
        store: ModelStore | None = None,
    ) -> None:
        self.site_id = site_id
        self.jurisdiction = jurisdiction
        self.task = task
        self.partition = partition
        self.tile = tile
        self.seed = seed
        self.store: ModelStore = store if store is not None else SnapshotModelStore(Path(state_dir))
        self._connect = connect
        self.privacy = privacy or SitePrivacy(site_id, Path(state_dir))
        self.dp_layers = LayerPolicy(dp_layers)
        self._data: TaskData | None = None
        self._plan: ShardPlan | None = None
        self._routing_factory = routing
        self._routing: SiteRouting | None = None
        self._signing_key = signing_key
        self._he_factory = he
        self._he: HeCodec | None = None

    # dispatch ---------------------------------------------------------------------------
    def handle(self, kind: MessageKind, message: BaseModel) -> BaseModel:
        """Answer one control-plane message."""
        if kind is MessageKind.QUERY and isinstance(message, QueryRequest):
            return self.query(message)
        if kind is MessageKind.TRAIN and isinstance(message, TrainInstruction):
            return self.train(message)
        if kind is MessageKind.EVALUATE and isinstance(message, EvaluateInstruction):
            return self.evaluate(message)
        raise RoundError(f"site {self.site_id}: cannot handle {kind.value} message {type(message).__name__}")

    # local resources ------------------------------------------------------------------------
    @property
    def data(self) -> TaskData:
        """Local data, loaded on first use."""
        if self._data is None:
            self._data = self.task.load_data(self.partition)
        return self._data

    def _fresh_model(self) -> torch.nn.Module:
        return build_initial_model(self.task, self.seed, self.dp_layers)

    def _codec(self) -> HeCodec:
        if self._he is None:
            if self._he_factory is None:
                raise RoundError(
                    f"site {self.site_id}: the policy encrypts some shard classes but this site has no CKKS "
                    "context; set he.keys"
                )
            self._he = self._he_factory()
        return self._he

    def _routes(self, plan: ShardPlan, zones: Mapping[str, str]) -> SiteRouting:
        """The site's routes; without residency routing, everything to the first zone."""
        if self._routing is None and self._routing_factory is not None:
            self._routing = self._routing_factory()
        if self._routing is not None:
            unknown = [sid for sid in plan.shard_ids if sid not in self._routing.routes]
            if unknown:
                raise RoundError(f"site {self.site_id}: no route for shard {unknown[0]} (model differs from config)")
            return self._routing
        if not zones:
            raise RoundError(f"site {self.site_id}: the round names no zone to push to")
        zone = sorted(zones)[0]
        routes = {
            sid: RouteDecision(sid, "", "no residency routing", "", ["*"], zone, group=DEFAULT_GROUP)
            for sid in plan.shard_ids
        }
        return SiteRouting(routes, "")

    def _load_state(self) -> tuple[ShardPlan, _ModelState]:
        if self.store.exists():
            meta, stored = self.store.load(self._plan)
            plan = self._plan or ShardPlan.from_json(meta["plan"])
            self._plan = plan
            shards = {k: v for k, v in stored.items() if not k.startswith(_OPT)}
            opt = {k[len(_OPT) :]: v for k, v in stored.items() if k.startswith(_OPT)}
            state = _ModelState(meta["version"], meta["genesis"], int(meta["applied_round"]), shards)
            state.optimizer, state.rule = opt, meta.get("rule", "")
            return plan, state
        model = self._fresh_model()
        plan = ShardPlan.from_state_dict(model.state_dict(), self.tile)
        shards = plan.split(model.state_dict())
        root = merkle_root({sid: shard_digest(a) for sid, a in shards.items()})
        genesis = genesis_version(plan.digest, root)
        state = _ModelState(genesis, genesis, 0, shards)
        self._plan = plan
        self._save_state(plan, state)
        return plan, state

    def _save_state(self, plan: ShardPlan, state: _ModelState) -> None:
        meta = {
            "version": state.version,
            "genesis": state.genesis,
            "applied_round": state.applied_round,
            "plan": plan.to_json(),
            "site_id": self.site_id,
            "rule": state.rule,
        }
        arrays = dict(state.shards)
        arrays.update({_OPT + k: v for k, v in state.optimizer.items()})
        self.store.save(arrays, meta)

    def _catch_up(
        self, history: list[AppliedRound], zones: dict[str, str], rule: ApplyRule
    ) -> tuple[ShardPlan, _ModelState]:
        """Apply every published aggregate this site has not applied yet, in order, with
        the federation's server-side optimiser (the same rule at every site).

        Each round the site applies, for every shard, the aggregate its residency
        route names (global, or its regional group's); the root over those shards
        extends its model-version chain.
        """
        plan, state = self._load_state()
        optimizer = ServerOptimizer(
            ServerOptimizerKind(rule.kind), rule.learning_rate, rule.beta1, rule.beta2, rule.tau
        )
        if state.rule and state.rule != optimizer.describe() and history and history[-1].round > state.applied_round:
            raise RoundError(
                f"site {self.site_id}: the server optimiser changed mid-federation ({state.rule} → "
                f"{optimizer.describe()}); sites would no longer hold the same model"
            )
        view = self._routes(plan, zones).view() if history and history[-1].round > state.applied_round else {}
        version = state.genesis
        for applied in history:
            version = next_version(version, applied.merkle_root)
            if applied.round <= state.applied_round:
                continue
            aggregate = self._fetch_view(applied, view, zones)
            for shard_id in aggregate:
                plan.shard(shard_id)  # refuses shards outside the plan
            root = merkle_root({sid: shard_digest(arr) for sid, arr in aggregate.items()})
            if root != applied.merkle_root:
                raise IntegrityError(
                    f"site {self.site_id}: the aggregates of round {applied.round} give root {root[:12]}… for this "
                    f"site's shards, the coordinator announced {applied.merkle_root[:12]}…"
                )
            self._decrypt(plan, aggregate)
            optimizer.apply(state.shards, aggregate, state.optimizer)
            state.rule = optimizer.describe()
            state.version = version
            state.applied_round = applied.round
            self._save_state(plan, state)
        if state.version != version:
            raise IntegrityError(
                f"site {self.site_id}: local model version {state.version[:12]}… does not follow the announced history"
            )
        return plan, state

    def _decrypt(self, plan: ShardPlan, aggregate: dict[str, np.ndarray]) -> None:
        """Replace encrypted sums in ``aggregate`` by the weighted means they hold."""
        encrypted = [sid for sid, arr in aggregate.items() if arr.dtype == np.uint8]
        if not encrypted:
            return
        routing = self._routing
        codec = self._codec()
        for sid in encrypted:
            if routing is not None and sid not in routing.encrypted:
                raise IntegrityError(
                    f"site {self.site_id}: shard {sid} arrived encrypted, the policy sends it in clear"
                )
            spec = plan.shard(sid)
            mean = codec.decrypt_mean(aggregate[sid].tobytes(), spec.size)
            aggregate[sid] = mean.reshape(spec.shape).astype(spec.dtype)

    def _fetch_view(
        self, applied: AppliedRound, view: dict[str, list[str]], zones: dict[str, str]
    ) -> dict[str, np.ndarray]:
        """Download the round's aggregates this site applies; its shards from each."""
        out: dict[str, np.ndarray] = {}
        for published in applied.aggregates:
            wanted = view.get(view_key(published.zone, published.group))
            if not wanted:
                continue
            endpoint = zones.get(published.zone)
            if endpoint is None:
                raise RoundError(
                    f"site {self.site_id}: no endpoint for zone {published.zone!r} of round {applied.round}"
                )
            client = self._connect(published.zone, endpoint)
            try:
                summary, aggregate = client.fetch_aggregate(applied.round, published.group, self.site_id)
            finally:
                client.close()
            if summary.merkle_root != published.merkle_root:
                raise IntegrityError(
                    f"site {self.site_id}: aggregate {published.group} of round {applied.round} from zone "
                    f"{published.zone} has root {summary.merkle_root[:12]}…, the coordinator announced "
                    f"{published.merkle_root[:12]}…"
                )
            out.update({sid: aggregate[sid] for sid in wanted if sid in aggregate})
        return out

    def _model_from(self, plan: ShardPlan, shards: dict[str, np.ndarray]) -> torch.nn.Module:
        import torch

        model = self._fresh_model()
        tensors = {name: torch.from_numpy(np.array(arr)) for name, arr in plan.join(shards).items()}
        model.load_state_dict(tensors, strict=False)
        return model

    # messages ------------------------------------------------------------------------------
    def query(self, message: QueryRequest) -> SiteInfo:
        """Who this site is and which model it starts from."""
        plan, state = self._load_state()
        report = None
        plan_for_me = message.privacy.get(self.site_id)
        if plan_for_me is not None:
            ledger, note = self.privacy.open_ledger(plan_for_me, self.data.num_train)
            with ledger:
                events = self.privacy.round_events(plan_for_me, ledger, self.data.num_train)
                report = self.privacy.report(ledger, events, note=note)
        return SiteInfo(
            site_id=self.site_id,
            jurisdiction=self.jurisdiction,
            num_examples=self.data.num_train,
            plan_digest=plan.digest,
            plan_json=plan.to_json(),
            genesis_version=state.genesis,
            privacy=report,
            view=self._routes(plan, message.zones).view() if message.zones else {},
        )

    def train(self, message: TrainInstruction) -> TrainReport:
        """Catch up, check the privacy budget, train, push the update's shards, report.

        With DP on, the round's cost is reserved in the ledger before training and
        committed after the push; a reservation that is never committed (crash, push
        refused) stays counted as spent.
        """

        def refuse(reason: str, privacy: PrivacyReport | None = None) -> TrainReport:
            log.warning("site %s refuses round %d: %s", self.site_id, message.round, reason)
            return TrainReport(site_id=self.site_id, round=message.round, ok=False, reason=reason, privacy=privacy)

        try:
            plan, state = self._catch_up(message.history, message.zones, message.apply)
        except FedshardError as exc:
            return refuse(str(exc))
        if state.version != message.base_version:
            return refuse(f"model version {state.version[:12]}… differs from the round's {message.base_version[:12]}…")
        try:
            self._routes(plan, message.zones)  # a shard no zone may hold: refuse before anything is spent
        except FedshardError as exc:
            return refuse(str(exc))
        if message.privacy is None:
            return self._train_and_push(message, plan, state, None)
        ledger, note = self.privacy.open_ledger(message.privacy, self.data.num_train)
        with ledger:
            events = self.privacy.round_events(message.privacy, ledger, self.data.num_train)
            try:
                reservation = ledger.reserve(message.round, events)
            except BudgetExhaustedError as exc:
                return refuse(str(exc), self.privacy.report(ledger, events, status="exhausted", note=note))
            record = next((e for e in events if e.guarantee is Guarantee.RECORD), None)
            dp = _RoundDP(
                RecordPrivacy(record, message.privacy.record.max_grad_norm)
                if record is not None and message.privacy.record is not None
                else None,
                message.privacy.update,
            )
            try:
                report = self._train_and_push(message, plan, state, dp)
            except PrivacyError as exc:
                return refuse(str(exc), self.privacy.report(ledger, events, status="refused", note=note))
            if report.ok:
                ledger.commit(reservation)
            privacy = self.privacy.report(ledger, events, status=None if report.ok else "refused", note=note)
            return report.model_copy(update={"privacy": privacy})

    def _train_and_push(
        self, message: TrainInstruction, plan: ShardPlan, state: _ModelState, dp: _RoundDP | None
    ) -> TrainReport:
        """Train locally, apply update-level DP, push the shards; the report has no privacy part yet."""
        model = self._model_from(plan, state.shards)
        record = dp.record if dp is not None else None
        settings = TrainSettings(message.epochs, message.batch_size, message.learning_rate, message.seed, record)
        metrics = self.task.train(model, self.data, settings)
        if record is not None:
            record.verify()
        trained = plan.split(model.state_dict())
        update = {sid: trained[sid] - state.shards[sid] for sid in plan.shard_ids}
        if dp is not None and dp.update is not None:
            # With distributed noise (HE on every shard) each site adds its share σ/√n;
            # the decrypted aggregate of ≥ n sites carries σ, which the ledger accounts.
            update, _ = clip_and_noise(update, dp.update.clip_norm, dp.update.noise_multiplier * dp.update.noise_share)
        routing = self._routes(plan, message.zones)
        payload: dict[str, np.ndarray] = dict(update)
        if routing.encrypted:
            codec = self._codec()
            weight = metrics.num_examples / (message.weight_scale or metrics.num_examples)
            blobs, clipped = codec.encrypt_many({sid: update[sid] for sid in routing.encrypted}, min(weight, 1.0))
            payload.update({sid: np.frombuffer(b, dtype=np.uint8).reshape(1, -1) for sid, b in blobs.items()})
            if clipped:
                log.warning(
                    "site %s round %d: %d update value(s) exceeded he.value_range=%g and were clipped to encrypt them",
                    self.site_id,
                    message.round,
                    clipped,
                    codec.value_range,
                )
        receipts = []
        roots = []
        for zone, shard_ids in routing.by_zone().items():
            if zone not in message.zones:
                reason = (
                    f"the round names no endpoint for zone {zone}, where residency routes {len(shard_ids)} shard(s)"
                )
                log.warning("site %s refuses round %d: %s", self.site_id, message.round, reason)
                return TrainReport(site_id=self.site_id, round=message.round, ok=False, reason=reason)
            part = {sid: payload[sid] for sid in shard_ids}
            manifest = build_manifest(
                site_id=self.site_id,
                round=message.round,
                plan_digest=plan.digest,
                base_version=state.version,
                zone=zone,
                weight=metrics.num_examples,
                shards=part,
                classes={sid: routing.routes[sid].shard_class for sid in shard_ids},
                policy_digest=routing.policy_digest,
                encrypted=frozenset(shard_ids) & routing.encrypted,
            )
            if self._signing_key is not None:
                manifest = manifest.signed(self._signing_key)
            client = self._connect(zone, message.zones[zone])
            try:
                receipts.append(client.push(manifest, message.token, part))
            except FedshardError as exc:
                reason = f"push to zone {zone} failed: {exc}"
                log.warning("site %s refuses round %d: %s", self.site_id, message.round, reason)
                return TrainReport(site_id=self.site_id, round=message.round, ok=False, reason=reason)
            finally:
                client.close()
            roots.append(manifest.merkle_root)
        return TrainReport(
            site_id=self.site_id,
            round=message.round,
            ok=True,
            num_examples=metrics.num_examples,
            loss=metrics.loss,
            bytes_up=sum(r.bytes for r in receipts),
            shards=sum(r.shards for r in receipts),
            zone=",".join(r.zone for r in receipts),
            merkle_root=",".join(roots),
        )

    def evaluate(self, message: EvaluateInstruction) -> EvaluateReport:
        """Apply the announced aggregates, then evaluate on local test data."""
        plan, state = self._catch_up(message.history, message.zones, message.apply)
        if state.version != message.version:
            raise IntegrityError(
                f"site {self.site_id}: model version {state.version[:12]}… differs from the announced "
                f"{message.version[:12]}…"
            )
        model = self._model_from(plan, state.shards)
        metrics = self.task.evaluate(model, self.data)
        return EvaluateReport(
            site_id=self.site_id,
            round=message.round,
            version=state.version,
            num_examples=metrics.num_examples,
            loss=metrics.loss,
            accuracy=metrics.accuracy if metrics.accuracy is not None else float("nan"),
        )
