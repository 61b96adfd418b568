"""The Site: one organisation's side of a round.

It keeps the model's parameter shards on-premise (a store in the site's state
directory), trains through the task plug-in, and releases only the update, cut into
gradient shards that it pushes straight to a zone; the coordinator only ever sees the
metadata in the reports.

A Site lives as long as its process and builds its model once
(:class:`~fedshard.site._model.HeldModel`); a message refills the model from the store
(verifying every shard), applies the rounds it missed in place (``apply``), saves
once, and a train message splits its update once (``release``). While the store is
as this site last saved or read it (the same catalog file with the same stamp), the
held values are the stored ones and the refill is skipped: a long-lived process (the
in-process engine, a simulation actor) reads its store once, and a store changed
behind its back is read and verified again. Flower may start a process per message:
then all that carries over is the store.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from fedshard import faults
from fedshard.config import LayerPolicy, local_batch
from fedshard.errors import FedshardError, PrivacyError, RoundError, StoreError
from fedshard.integrity import genesis_version
from fedshard.protocol.binding import with_proof
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
)
from fedshard.protocol.timings import Phase, Stopwatch
from fedshard.site._apply import ModelState, apply_rounds, check_chain, decrypt_aggregate, fetch_view, optimizer_for
from fedshard.site._model import HeldModel
from fedshard.site._private_round import Admitted, Refusal, refused, reserve_round
from fedshard.site._release import he_packs, push_update, sealed, update_over
from fedshard.site._resident import RESIDENT_COPY_BYTES, HeldState, OwnWrites, PendingSave, Record
from fedshard.site.ledger_anchor import Anchor, CatalogAnchor
from fedshard.site.model_store import ModelStore, SealedModelStore, SnapshotModelStore
from fedshard.site.privacy import RoundDP, SitePrivacy
from fedshard.site.routes import RouteSource, SiteRouting, single_zone_routing
from fedshard.task import Partition, Task, TaskData, TrainSettings, build_initial_model

if TYPE_CHECKING:
    import numpy as np
    import torch
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedshard.crypto.he import HeCodec
    from fedshard.sharding import ShardPlan
    from fedshard.site.base import SealedBase

__all__ = ["Site", "finish"]

R = TypeVar("R")


def finish(stages: Generator[None, None, R]) -> R:
    """Run a staged message (:meth:`Site.staged`) to its reply, straight through its release point."""
    while True:
        try:
            next(stages)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


log = logging.getLogger(__name__)


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
        Gives the site's residency routes (asked once, when first needed); None:
        every shard goes to the first zone by name and joins one aggregate.
    signing_key:
        The site's Ed25519 key; when given, every manifest is signed with it.
    he:
        Returns the site's HE codec (secret context), for the shard classes the
        policy encrypts; called once, when first needed.
    dp_layers:
        With record-level DP: ``"fix"`` replaces layers DP-SGD cannot train (every
        site does the same, so they share the model), ``"check"`` refuses them, ``"keep"``
        (DP off) leaves the model as the task builds it.
    store:
        Where the model lives between messages (default: a plaintext snapshot in ``state_dir``).
    base:
        Where the frozen base is sealed and streamed from (``store.base``); None: resident.
    endpoints:
        The zones as the site's own config has them (name → endpoint): the only places it
        pushes to and fetches from. A message's ``zones`` only say which of them take part
        in the round; an endpoint in a message is never dialled (but for a zone left on
        port 0 in an embedded run: see :meth:`_endpoints`). None (bare library use without
        a config): the message's endpoints are used.
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
        routing: RouteSource | None = None,
        signing_key: Ed25519PrivateKey | None = None,
        he: Callable[[], HeCodec] | None = None,
        store: ModelStore | None = None,
        base: SealedBase | None = None,
        endpoints: Mapping[str, str] | None = None,
    ) -> None:
        self.site_id = site_id
        self.jurisdiction = jurisdiction
        self.task = task
        self.partition = partition
        self.store: ModelStore = store if store is not None else SnapshotModelStore(Path(state_dir))
        self._connect = connect
        self._own_endpoints = endpoints
        self.privacy = privacy or SitePrivacy(site_id, Path(state_dir))
        self.dp_layers = LayerPolicy(dp_layers)
        self.model = HeldModel(lambda: build_initial_model(task, seed, self.dp_layers), tile, base)
        self._data: TaskData | None = None
        self._route_source = routing
        self._routing: SiteRouting | None = None
        self._signing_key = signing_key
        self._he_factory = he
        self._he: HeCodec | None = None
        self._plan_json = ""
        self._held = HeldState(lambda: self.store)  # whether the held model is the store's (skip the refill)
        self._pending = PendingSave(self._save)  # a caught-up model saved with the round's ledger anchor
        self._anchor: OwnWrites | None = None
        if self.privacy.anchor is not None:  # its anchor writes change the store's catalog, not the shards
            self._anchor = self.privacy.anchor = OwnWrites(self.privacy.anchor, self._held, self._pending)
        self._lock = threading.Lock()  # one message at a time: they share the model

    # dispatch ---------------------------------------------------------------------------
    def handle(self, kind: MessageKind, message: BaseModel) -> BaseModel:
        """Answer one control-plane message."""
        return finish(self.staged(kind, message))

    def staged(self, kind: MessageKind, message: BaseModel) -> Generator[None, None, BaseModel]:
        """:meth:`handle` in two stages: a train message yields once, right before the site releases
        anything (its push), and the caller makes the site's writes so far durable there if it
        deferred them (:class:`fedshard._fs.Barrier`); the reply is the generator's value. Other
        messages release nothing but their reply and never yield. The site's lock is held from
        the first stage to the end, whichever thread runs each. The in-process engine calls this,
        not :meth:`handle`: a wrapper that rewrites a site's replies overrides both."""
        with self._lock:
            if kind is MessageKind.QUERY and isinstance(message, QueryRequest):
                return self.query(message)
            if kind is MessageKind.TRAIN and isinstance(message, TrainInstruction):
                return (yield from self._train(message))
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

    def _codec(self) -> HeCodec:
        if self._he is None:
            if self._he_factory is None:
                raise RoundError(
                    f"site {self.site_id}: the policy encrypts some shard classes but this site has no HE "
                    "context; set he.keys"
                )
            self._he = self._he_factory()
        return self._he

    def _endpoints(self, named: Mapping[str, str], *, every: bool = False) -> dict[str, str]:
        """Where the site reaches the zones ``named`` by a message (``every``: all of its own
        config's zones, for fetching published aggregates): the endpoints of its own config.

        Names its config does not know are left out (the site never dials them). A zone its
        config leaves on port 0 (an embedded run, where one host starts every party and picks
        the ports) is reached where the message says; a deployed site's config never does
        (:func:`fedshard.assembly.deployed_site` refuses it). Without a config of its own
        (bare library use) the message's endpoints are used.
        """
        own = self._own_endpoints
        if own is None:
            return dict(named)
        names = own if every else [n for n in named if n in own]
        out = {}
        for name in names:
            endpoint = own[name]
            if endpoint.endswith(":0"):
                if name not in named:
                    continue
                endpoint = named[name]
            out[name] = endpoint
        return out

    def _model_source(self) -> tuple[ShardPlan, torch.nn.Module]:
        return self.model.plan, self.model.module()

    def _routes(self, zones: Mapping[str, str], plan_digest: str = "") -> SiteRouting:
        """The site's routes; without residency routing, everything to the first zone."""
        if self._routing is None and self._route_source is not None:
            self._routing = self._route_source(plan_digest or self.model.plan.digest, self._model_source)
        if self._routing is not None:
            routes = self._routing.routes
            if self.model.built:  # else the routes were classified for the stored plan (by its digest)
                unknown = next((sid for sid in self.model.plan.shard_ids if sid not in routes), None)
                if unknown is not None:
                    raise RoundError(f"site {self.site_id}: no route for shard {unknown} (model differs from config)")
            return self._routing
        return single_zone_routing(self.site_id, zones, self.model.plan.shard_ids)

    def reroute(self) -> None:
        """Forget the routes (asked again from the route source at the next message): the
        federation's zones changed between rounds."""
        with self._lock:
            self._routing = None

    # the model's state -------------------------------------------------------------------------
    def _plan_text(self) -> str:
        if not self._plan_json:
            self._plan_json = self.model.plan.to_json()
        return self._plan_json

    def _open(self, *, defer: bool = False) -> ModelState:
        """Refill the held model from the store (verifying every shard); on first use, save the genesis
        model (``defer``: leave the save to the site's :class:`~fedshard.site._resident.PendingSave`)."""
        model = self.model
        record = self._held.release()
        held = self._held.current(record) if model.built else None
        if held is not None:
            model.tidy()
            model.initial = False
            return held
        if not self.store.exists():
            if not model.initial:  # it holds other values than the initial ones: build it again
                model.discard()
            plan = model.plan
            if not model.initial:
                raise RoundError(
                    f"site {self.site_id}: the task builds its model without values (on the meta device); "
                    "write its initial weights into the site's store first"
                )
            genesis = genesis_version(plan.digest, model.root())
            state = ModelState(genesis, genesis, 0)
            if defer:
                self._pending.put(state)
            else:
                self._save(state)
            return state
        model.tidy()
        model.initial = False
        meta, extras = self.store.load_into(model.plan, model.tensors())
        return ModelState.from_store(meta, extras)

    def _save(self, state: ModelState, anchor: Anchor | None = None) -> None:
        """Save the held model at ``state``; with ``anchor`` (the site's ledger anchor), record it in
        the same store commit where the store keeps it (its sealed catalog), else right after."""
        model = self.model
        self._held.release()
        meta = state.meta(self._plan_text(), self.site_id)
        store, kept = self.store, self._anchor.inner if self._anchor is not None else None
        if (
            anchor is not None
            and isinstance(store, SealedModelStore)
            and isinstance(kept, CatalogAnchor)
            and kept.joins(store.root)
        ):
            store.save(model.plan, model.shards(), state.extras(), meta, also=CatalogAnchor.entry(anchor))
            anchor = None  # recorded in the same commit
        else:
            store.save(model.plan, model.shards(), state.extras(), meta)
        self._held.hold(state)
        if anchor is not None and self._anchor is not None:
            self._anchor.write_alone(anchor)

    def _kept_copy(self) -> dict[str, np.ndarray] | None:
        """A copy of the held shards to put back after a task used them, when the model is the
        store's and small enough to copy (:data:`~fedshard.site._resident.RESIDENT_COPY_BYTES`)."""
        return self.model.split() if self.model.plan.nbytes <= RESIDENT_COPY_BYTES else None

    def _put_back(self, values: Mapping[str, np.ndarray] | None, record: Record | None) -> None:
        """Put the held shards back to ``values`` and record again that they are the store's."""
        if values is None or record is None:
            return
        shards = self.model.shards()
        for sid, array in values.items():
            shards[sid] = array
        self._held.restore(record)

    def _standing(self, *, defer: bool = False) -> tuple[str, ModelState]:
        """The plan (canonical JSON) and state the store records, without reading shards (a new site's
        genesis model is saved first; ``defer``: by the site's pending save)."""
        if not self.store.exists():
            state = self._open(defer=defer)
            return self._plan_text(), state
        meta = self.store.meta()
        return str(meta["plan"]), ModelState.from_store(meta, {})

    def _catch_up(
        self,
        missed: Sequence[AppliedRound],
        zones: dict[str, str],
        rule: ApplyRule,
        head: str,
        watch: Stopwatch,
        *,
        defer: bool = False,
    ) -> ModelState:
        """Load the model and bring it to ``head``: apply the rounds of ``missed`` it has not
        applied, in order, with the federation's server-side optimiser; save once (``defer``: leave
        the save to the site's :class:`~fedshard.site._resident.PendingSave`; a failure still saves
        the rounds applied whole at once).

        Before anything is fetched, the site checks that its own version, extended by the
        roots announced for those rounds, reaches ``head``: a site that was not sent a
        round it missed, or whose model diverged, refuses and keeps its store as it was.
        Each round the site applies, for every shard, the aggregate its residency route
        names (global, or its regional group's). ``watch`` times the fetches and the rest.
        """
        state = self._open()
        pending = sorted((a for a in missed if a.round > state.applied_round), key=lambda a: a.round)
        try:
            optimizer = optimizer_for(rule, state, bool(pending), self.site_id)
            check_chain(self.site_id, state, pending, head)
        except FedshardError:
            self._held.hold(state)  # nothing was applied: the held model is still the store's
            raise
        if not pending:
            self._held.hold(state)
            return state
        routing = self._routes(zones)
        view = routing.view()
        encrypted = routing.encrypted if self._route_source is not None else None
        packs = he_packs(routing, {s.shard_id: s.size for s in self.model.plan.shards}) if encrypted else None
        model, start = self.model, state.applied_round
        where = self._endpoints(zones, every=True)
        fetch = watch.timed(Phase.FETCH, lambda applied: fetch_view(self.site_id, applied, view, where, self._connect))
        with watch.phase(Phase.APPLY):  # the fetches inside count as fetch
            try:
                apply_rounds(
                    state,
                    pending,
                    optimizer,
                    model.shards(),
                    fetch,
                    lambda shards: decrypt_aggregate(self.site_id, model.plan, shards, self._codec, encrypted, packs),
                    plan=model.plan,
                    site_id=self.site_id,
                    skip=model.aliases(),
                )
            except FedshardError:
                if state.applied_round > start:  # keep the rounds that were applied whole
                    self._save(state)
                raise
            if defer:
                self._pending.put(state)
            else:
                self._save(state)
        return state

    # messages ------------------------------------------------------------------------------
    def close(self) -> None:
        """Release what the site keeps open between messages (its privacy ledger); the next message
        opens it again."""
        self.privacy.discard()

    def query(self, message: QueryRequest) -> SiteInfo:
        """Who this site is and which model it starts from (no model is loaded). A new site saves its
        genesis model in the store commit that anchors its new ledger (one commit, as a train
        message's caught-up model and reservation)."""
        plan_json, state = self._standing(defer=True)
        try:
            report = self._query_privacy(message)
            self._pending.flush()  # no ledger anchored it: saved alone
        finally:
            self._pending.drop()  # never carried into another message
        plan_digest = hashlib.sha256(plan_json.encode()).hexdigest()
        info = SiteInfo(
            site_id=self.site_id,
            jurisdiction=self.jurisdiction,
            num_examples=self.data.num_train,
            plan_digest=plan_digest,
            plan_json=plan_json,
            genesis_version=state.genesis,
            privacy=report,
            view=self._routes(message.zones, plan_digest).view() if message.zones else {},
            version=state.version,
            applied_round=state.applied_round,
        )
        return with_proof(info, message.challenge, self._signing_key)  # binds this node to its site id

    def _query_privacy(self, message: QueryRequest) -> PrivacyReport | None:
        """The site's privacy report for a query (its ledger opened, created if new, and checked);
        None if neither the federation nor its own config asks for DP."""
        asked = message.privacy.get(self.site_id)
        if asked is None and not self.privacy.terms.required:
            return None
        try:
            plan = self.privacy.admit(asked)
            assert plan is not None  # a plan was asked for, or its own config requires one
            expected = message.ledger_heads.get(self.site_id)  # the federation's last view of it
            ledger, note = self.privacy.open_ledger(plan, self.data.num_train, expected)
        except (PrivacyError, StoreError) as exc:  # a weaker plan; a ledger deleted, rolled back or edited
            log.warning("site %s: %s", self.site_id, exc)
            return self.privacy.refusal_report(asked, str(exc))
        try:
            events = self.privacy.round_events(plan, ledger, self.data.num_train)
            return self.privacy.report(ledger, events, note=note)
        finally:
            self.privacy.put_back(ledger)

    def train(self, message: TrainInstruction) -> TrainReport:
        """Catch up, check the privacy budget, train, push the update's shards, report (see :meth:`_train`)."""
        return finish(self._train(message))

    def _train(self, message: TrainInstruction) -> Generator[None, None, TrainReport]:
        """Catch up, check the privacy budget, train, push the update's shards, report; yields once
        before the push (see :meth:`staged`), never for a round the site refuses.

        When the message asks (``evaluate``: the round before, whose evaluate message this one
        carries), the site evaluates the model it caught up to, as an evaluate message would
        have, once it has decided whether it trains, and reports it with the round either way.

        With DP on, the round's cost is reserved in the ledger before training (its anchor and
        the caught-up model in one store commit) and committed after the push; a reservation
        that is never committed (crash, push refused) stays counted as spent.
        """
        watch = Stopwatch()
        try:
            state = self._catch_up(
                message.missed, message.zones, message.apply, message.base_version, watch, defer=True
            )
        except FedshardError as exc:
            return refused(self.site_id, message.round, exc, None, None)
        try:
            admitted = self._admit(message, state)  # a reservation's anchor write saves the caught-up model
            self._pending.flush()  # else it is saved now (a refusal, a round without DP)
        except FedshardError as exc:  # the caught-up model could not be saved: nothing was reserved
            return refused(self.site_id, message.round, exc, None, None)
        finally:
            self._pending.drop()  # never carried into another message (the store is read again instead)
        with admitted.reserved if admitted.reserved is not None else nullcontext():
            evaluation = None if message.evaluate is None else self._evaluated(message.evaluate, state)
            report = admitted.refusal or (yield from self._train_admitted(message, state, admitted, watch))
        return report if evaluation is None else report.model_copy(update={"evaluation": evaluation})

    def _admit(self, message: TrainInstruction, state: ModelState) -> Admitted:
        """Decide whether the site trains this round, once the model is at ``message.base_version``
        (``state``): its routes, its own privacy terms, and its ledger's reservation of the cost."""

        def refuse(error: FedshardError, privacy: PrivacyReport | None = None) -> Admitted:
            return Admitted(refusal=refused(self.site_id, message.round, error, privacy, state.applied_round))

        try:
            routing = self._routes(message.zones)  # a shard no zone may hold: refuse before anything is spent
        except FedshardError as exc:
            return refuse(exc)
        try:  # the site's own terms: a missing or weaker plan is refused before anything is reserved
            plan = self.privacy.admit(message.privacy, batch_size=message.batch_size, epochs=message.epochs)
        except PrivacyError as exc:
            return refuse(exc, self.privacy.refusal_report(message.privacy, str(exc)))
        if plan is None:
            return Admitted(routing=routing)
        reserved = reserve_round(self.privacy, message, plan, self.data.num_train)  # the ledger decides first
        if isinstance(reserved, Refusal):
            return refuse(reserved.error, reserved.privacy)
        return Admitted(routing=routing, reserved=reserved)

    def _train_admitted(
        self, message: TrainInstruction, state: ModelState, admitted: Admitted, watch: Stopwatch
    ) -> Generator[None, None, TrainReport]:
        """Train and push a round :meth:`_admit` admitted; with DP, commit its reservation."""
        reserved, routing = admitted.reserved, admitted.routing
        assert routing is not None  # admitted, not refused

        def refuse(error: FedshardError, privacy: PrivacyReport | None = None) -> TrainReport:
            return refused(self.site_id, message.round, error, privacy, state.applied_round)

        try:
            report = yield from self._train_and_push(message, state, routing, reserved.dp if reserved else None, watch)
        except RoundError as exc:
            return refuse(exc, reserved.refusal() if reserved else None)
        except PrivacyError as exc:
            if reserved is None:
                raise
            return refuse(exc, reserved.refusal())
        return reserved.commit(report) if reserved is not None else report

    def _train_and_push(
        self, message: TrainInstruction, state: ModelState, routing: SiteRouting, dp: RoundDP | None, watch: Stopwatch
    ) -> Generator[None, None, TrainReport]:
        """Train locally, apply update-level DP, push the shards; the report has no privacy part yet.
        Yields once, before the push: everything the site wrote so far must be durable by then.

        Raises :class:`RoundError` (push refused, a routed zone not in the round) or
        :class:`PrivacyError` (training did not spend what was reserved): nothing counted.
        """
        model = self.model
        training = dp.training if dp is not None else None
        batch = local_batch(message.batch_size, self.data.num_train)
        settings = TrainSettings(message.epochs, batch, message.learning_rate, message.seed, training)
        base = model.split()  # the copy of the model a message makes: the update is computed over it
        stored = self._held.release()
        kept = self._kept_copy() if stored is not None else None  # put back after training: no store read next
        faults.point("site.train.begin")
        try:
            with watch.phase(Phase.TRAIN):
                metrics = self.task.train(model.module(), self.data, settings)
            update = update_over(base, model.shards())
        finally:
            model.tidy()
        self._put_back(kept, stored)
        if dp is not None:
            dp.verify()
            if training is not None:
                faults.point("site.train.dp")
        with watch.phase(Phase.SEAL):
            released = dp.release(update) if dp is not None else update
            payload = sealed(released, message, routing, self._codec, self.site_id)
        del base, update, released  # the values of the encrypted shards go now
        faults.point("site.train.sealed")
        yield  # the release point: a caller that deferred the site's writes makes them durable here
        with watch.phase(Phase.PUSH):
            pushes = push_update(
                payload,
                routing,
                message,
                self._endpoints(message.zones),
                site_id=self.site_id,
                plan_digest=model.plan.digest,
                weight=message.weight,
                signing_key=self._signing_key,
                connect=self._connect,
                noise=dp.noise_terms(message.learning_rate) if dp is not None else "",
            )
        return TrainReport(
            site_id=self.site_id,
            round=message.round,
            ok=True,
            num_examples=metrics.num_examples,
            loss=metrics.loss,
            pushes=pushes,
            applied_round=state.applied_round,
            timings=watch.times(),
        )

    def evaluate(self, message: EvaluateInstruction) -> EvaluateReport:
        """Apply the rounds the site missed, then evaluate on local test data."""
        watch = Stopwatch()
        state = self._catch_up(message.missed, message.zones, message.apply, message.version, watch)
        return self._evaluated(message.round, state, watch)

    def _evaluated(self, rnd: int, state: ModelState, watch: Stopwatch | None = None) -> EvaluateReport:
        """The held model (at ``state``) evaluated on local test data, reported as round ``rnd``'s."""
        watch = watch or Stopwatch()
        stored = self._held.release()
        held = self._kept_copy() if stored is not None else None  # a task may touch what it evaluates
        try:
            with watch.phase(Phase.EVALUATE):
                metrics = self.task.evaluate(self.model.module(), self.data)
        finally:
            self.model.tidy()
        self._put_back(held, stored)
        return EvaluateReport(
            site_id=self.site_id,
            round=rnd,
            version=state.version,
            num_examples=metrics.num_examples,
            loss=metrics.loss,
            accuracy=metrics.accuracy if metrics.accuracy is not None else float("nan"),
            applied_round=state.applied_round,
            timings=watch.times(),
        )
