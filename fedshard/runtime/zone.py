"""The zone aggregator: validates pushed shards and folds them into running means.

Transport-free: the gRPC service (:mod:`fedshard.runtime.grpc.service`) and the
in-process client both drive it. A push is a transaction: frames are checked one by
one as they arrive (known round and token, shard in the manifest and plan, dtype and
shape from the plan, digest from the manifest, finite values, no duplicate) and staged;
only when the whole push is complete and valid is it folded into the sums. A refused
push leaves nothing behind.

Staged pushes are bounded by a byte budget, so peak memory is the float64 sums plus
the budget, however many sites push at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedshard.aggregation import ShardAccumulator, all_finite
from fedshard.errors import AggregateNotFoundError, IntegrityError, PushRejectedError, ZoneError
from fedshard.integrity import Manifest, ShardEntry, ShardHasher, merkle_root, shard_digest
from fedshard.runtime.heap import trim_heap
from fedshard.runtime.rounds import AggregateSummary, PushReceipt, RoundSpec
from fedshard.sharding import ShardPlan, ShardSpec
from fedshard.store import LocalShardStore

__all__ = ["ByteBudget", "PushSession", "ZoneAggregator"]


_TRIM_BYTES = 8 << 20  # pushes at least this large hand their memory back when done


class ByteBudget:
    """A counting semaphore over bytes. A single request larger than the cap is let
    through alone, so it waits instead of deadlocking."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._used = 0
        self._cond = threading.Condition()

    def acquire(self, n: int, timeout: float | None = None) -> bool:
        """Reserve ``n`` bytes; False if that did not happen within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._used == 0 or self._used + n <= self.capacity, timeout) and (
                self._take(n)
            )

    def _take(self, n: int) -> bool:
        self._used += n
        return True

    def release(self, n: int) -> None:
        """Return ``n`` bytes to the budget."""
        with self._cond:
            self._used -= n
            self._cond.notify_all()


@dataclass
class _OpenRound:
    spec: RoundSpec
    plan: ShardPlan
    accumulator: ShardAccumulator = field(default_factory=ShardAccumulator)
    pushing: set[str] = field(default_factory=set)
    counted: list[str] = field(default_factory=list)


class PushSession:
    """One site's push in progress. Feed chunks with :meth:`receive`, then :meth:`commit`.

    Any failure raises :class:`PushRejectedError`; call :meth:`abort` (or use the
    session as a context manager) so the staging budget is returned.
    """

    def __init__(self, zone: ZoneAggregator, state: _OpenRound, manifest: Manifest, budget_bytes: int) -> None:
        self._zone = zone
        self._state = state
        self.manifest = manifest
        self._budget_bytes = budget_bytes
        self._expected = {e.shard_id: e for e in manifest.shards}
        self._staged: dict[str, np.ndarray] = {}
        self._current: tuple[ShardSpec, ShardHasher, bytearray | None, list[bytes]] | None = None
        self._received = 0
        self._done = False

    def __enter__(self) -> PushSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()

    @property
    def site_id(self) -> str:
        """The pushing site."""
        return self.manifest.site_id

    def _reject(self, code: str, reason: str) -> PushRejectedError:
        # A refusal ends the push: what was staged before it can no longer be committed.
        self.abort()
        return PushRejectedError(
            f"zone {self._zone.name}: site {self.site_id} round {self.manifest.round}: {reason}", code
        )

    def receive(self, shard_id: str, data: bytes, *, offset: int, dtype: str = "", shape: tuple[int, ...] = ()) -> None:
        """Take one chunk of shard ``shard_id``. The first chunk (offset 0) carries dtype and shape."""
        if self._done:
            raise self._reject("state", "push already finished")
        if self._current is None or self._current[0].shard_id != shard_id:
            if self._current is not None:
                raise self._reject("truncated", f"shard {self._current[0].shard_id} ended after {self._received} bytes")
            self._start(shard_id, dtype, shape, offset)
        assert self._current is not None
        spec, hasher, buffer, parts = self._current
        if offset != self._received:
            raise self._reject("offset", f"shard {shard_id}: chunk at offset {offset}, expected {self._received}")
        if self._received + len(data) > spec.nbytes:
            raise self._reject("shape", f"shard {shard_id}: more than the plan's {spec.nbytes} bytes")
        hasher.update(data)
        if buffer is None:
            parts.append(data)
        else:
            memoryview(buffer)[self._received : self._received + len(data)] = data
        self._received += len(data)
        if self._received == spec.nbytes:
            self._finish_shard()

    def _start(self, shard_id: str, dtype: str, shape: tuple[int, ...], offset: int) -> None:
        if shard_id in self._staged:
            raise self._reject("duplicate", f"shard {shard_id} sent twice")
        if shard_id not in self._state.plan:
            raise self._reject("unknown-shard", f"shard {shard_id} is not in the round's shard plan")
        if shard_id not in self._expected:
            raise self._reject("unknown-shard", f"shard {shard_id} is not listed in the manifest")
        if offset != 0:
            raise self._reject("offset", f"shard {shard_id} starts at offset {offset}, expected 0")
        spec = self._state.plan.shard(shard_id)
        try:
            dtype_ok = bool(dtype) and np.dtype(dtype) == np.dtype(spec.dtype)
        except TypeError:
            dtype_ok = False
        if not dtype_ok:
            raise self._reject("dtype", f"shard {shard_id} has dtype {dtype or '?'}, the plan says {spec.dtype}")
        if tuple(shape) != spec.shape:
            raise self._reject("shape", f"shard {shard_id} has shape {tuple(shape)}, the plan says {spec.shape}")
        hasher = ShardHasher(spec.dtype, spec.shape)
        # One-chunk shards keep the received bytes as they are (no copy); larger ones
        # are assembled in a buffer of the final size.
        buffer = None if spec.nbytes <= self._zone.chunk_hint else bytearray(spec.nbytes)
        self._current = (spec, hasher, buffer, [])
        self._received = 0

    def _finish_shard(self) -> None:
        assert self._current is not None
        spec, hasher, buffer, parts = self._current
        self._current = None
        self._received = 0
        entry = self._expected[spec.shard_id]
        if hasher.hexdigest() != entry.digest:
            raise self._reject("digest", f"shard {spec.shard_id}: digest does not match the manifest")
        raw = buffer if buffer is not None else (parts[0] if len(parts) == 1 else b"".join(parts))
        values = np.frombuffer(raw, dtype=spec.dtype).reshape(spec.shape)
        if not all_finite(values):
            raise self._reject("non-finite", f"shard {spec.shard_id} contains NaN or infinite values")
        self._staged[spec.shard_id] = values

    def commit(self) -> PushReceipt:
        """Check the push is complete, then fold it into the round's sums."""
        if self._current is not None:
            raise self._reject("truncated", f"shard {self._current[0].shard_id} is incomplete")
        missing = [sid for sid in self._expected if sid not in self._staged]
        if missing:
            raise self._reject("missing", f"{len(missing)} shard(s) of the manifest never arrived, e.g. {missing[0]}")
        receipt = self._zone._commit(self._state, self.manifest, self._staged)
        self._done = True
        self._release()
        return receipt

    def abort(self) -> None:
        """Drop everything staged; nothing of this push is counted."""
        if not self._done:
            self._done = True
            self._staged.clear()
            with self._zone._lock:
                self._state.pushing.discard(self.site_id)
        self._release()

    def _release(self) -> None:
        self._staged = {}
        self._current = None
        if self._budget_bytes:
            self._zone._budget.release(self._budget_bytes)
            if self._budget_bytes >= _TRIM_BYTES:
                trim_heap()
            self._budget_bytes = 0


class ZoneAggregator:
    """One zone: accepts validated pushes, aggregates, publishes per-round aggregates.

    Parameters
    ----------
    name:
        Zone name, e.g. ``"eu-central"``.
    region:
        Region the zone is in, e.g. ``"EU"``.
    store_dir:
        Where published aggregates are kept; in memory only when None.
    staging_bytes:
        Budget for pushes being received and not yet committed.
    """

    chunk_hint = 1 << 20

    def __init__(
        self,
        name: str,
        region: str = "",
        store_dir: str | Path | None = None,
        staging_bytes: int = 256 << 20,
    ) -> None:
        self.name = name
        self.region = region
        self._store = LocalShardStore(store_dir) if store_dir is not None else None
        self._latest: tuple[AggregateSummary, dict[str, np.ndarray]] | None = None
        self._rounds: dict[int, _OpenRound] = {}
        self._summaries: dict[int, AggregateSummary] = {}
        self._lock = threading.Lock()
        self._budget = ByteBudget(staging_bytes)

    # round lifecycle --------------------------------------------------------------------
    def open_round(self, spec: RoundSpec) -> None:
        """Start accepting pushes for ``spec.round``."""
        plan = ShardPlan.from_json(spec.plan_json)
        with self._lock:
            if spec.round in self._rounds or spec.round in self._summaries:
                raise ZoneError(f"zone {self.name}: round {spec.round} was already opened")
            self._rounds[spec.round] = _OpenRound(spec, plan)

    def begin_push(self, manifest: Manifest, token: str, timeout: float | None = None) -> PushSession:
        """Check a push's manifest and start receiving its shards."""

        def reject(code: str, reason: str) -> PushRejectedError:
            return PushRejectedError(
                f"zone {self.name}: site {manifest.site_id} round {manifest.round}: {reason}", code
            )

        with self._lock:
            state = self._rounds.get(manifest.round)
            if state is None:
                closed = manifest.round in self._summaries
                raise reject("round", "round is closed" if closed else "round is not open at this zone")
            if token != state.spec.token:
                raise reject("token", "round token does not match (stale or replayed push)")
            if manifest.site_id not in state.spec.sites:
                raise reject("site", "site was not selected for this round")
            if manifest.site_id in state.pushing or manifest.site_id in state.counted:
                raise reject("duplicate", "site already pushed in this round")
            if manifest.plan_digest != state.plan.digest:
                raise reject("plan", "manifest's shard plan differs from the round's")
            if manifest.base_version != state.spec.base_version:
                raise reject(
                    "version",
                    f"update computed from model version {manifest.base_version[:12]}…, "
                    f"round expects {state.spec.base_version[:12]}…",
                )
            if manifest.zone != self.name:
                raise reject("zone", f"manifest is addressed to zone {manifest.zone!r}")
            for entry in manifest.shards:
                if entry.shard_id not in state.plan:
                    raise reject("unknown-shard", f"shard {entry.shard_id} is not in the round's shard plan")
                planned = state.plan.shard(entry.shard_id).nbytes
                if entry.nbytes != planned:
                    raise reject(
                        "shape", f"shard {entry.shard_id}: manifest says {entry.nbytes} bytes, the plan {planned}"
                    )
            state.pushing.add(manifest.site_id)
        need = manifest.total_bytes
        if not self._budget.acquire(need, timeout):
            with self._lock:
                state.pushing.discard(manifest.site_id)
            raise ZoneError(f"zone {self.name}: busy, could not stage {need} bytes in time; retry")
        return PushSession(self, state, manifest, need)

    def _commit(self, state: _OpenRound, manifest: Manifest, staged: dict[str, np.ndarray]) -> PushReceipt:
        with self._lock:
            if self._rounds.get(manifest.round) is not state:
                raise PushRejectedError(f"zone {self.name}: round {manifest.round} closed during the push", "round")
            for shard_id, values in staged.items():
                state.accumulator.add(shard_id, values, manifest.weight)
            state.pushing.discard(manifest.site_id)
            state.counted.append(manifest.site_id)
        return PushReceipt(
            self.name, manifest.round, manifest.site_id, len(staged), sum(v.nbytes for v in staged.values())
        )

    def push(self, manifest: Manifest, token: str, shards: dict[str, np.ndarray]) -> PushReceipt:
        """Push a whole update at once (in-process use; the gRPC service streams instead)."""
        with self.begin_push(manifest, token) as session:
            for shard_id, values in shards.items():
                arr = np.ascontiguousarray(values)
                session.receive(shard_id, arr.tobytes(), offset=0, dtype=arr.dtype.str, shape=arr.shape)
            return session.commit()

    def close_round(self, round: int) -> AggregateSummary:
        """Stop accepting pushes for ``round``, publish the weighted means."""
        with self._lock:
            state = self._rounds.pop(round, None)
            if state is None:
                if round in self._summaries:
                    return self._summaries[round]
                raise ZoneError(f"zone {self.name}: round {round} is not open")
        means = state.accumulator.finalize() if state.counted else {}
        total = state.accumulator.weight(next(iter(means))) if means else 0.0
        entries = tuple(ShardEntry(sid, shard_digest(arr), int(arr.nbytes)) for sid, arr in means.items())
        summary = AggregateSummary(
            zone=self.name,
            round=round,
            merkle_root=merkle_root({e.shard_id: e.digest for e in entries}),
            total_weight=total,
            sites=tuple(state.counted),
            shards=entries,
        )
        self._publish(summary, means)
        with self._lock:
            self._summaries[round] = summary
        return summary

    def abort_round(self, round: int) -> None:
        """Discard ``round`` without publishing anything."""
        with self._lock:
            self._rounds.pop(round, None)

    # publication ----------------------------------------------------------------------------
    def _publish(self, summary: AggregateSummary, means: dict[str, np.ndarray]) -> None:
        if self._store is not None:
            meta = {
                "zone": summary.zone,
                "round": summary.round,
                "merkle_root": summary.merkle_root,
                "total_weight": summary.total_weight,
                "sites": list(summary.sites),
            }
            self._store.save(_aggregate_key(summary.round), means, meta)
        self._latest = (summary, means)

    def aggregate(self, round: int) -> tuple[AggregateSummary, dict[str, np.ndarray]]:
        """The published aggregate of ``round``: its summary and shards.

        The latest aggregate is served from memory; older ones (and any after a
        restart) are read from the store and checked against their Merkle root.
        """
        latest = self._latest
        if latest is not None and latest[0].round == round:
            return latest
        if self._store is None or not self._store.exists(_aggregate_key(round)):
            known = round in self._summaries
            raise AggregateNotFoundError(
                f"zone {self.name}: no aggregate for round {round} "
                + ("(this zone keeps only the latest without a store)" if known else "(not closed yet, or unknown)")
            )
        meta, shards = self._store.load(_aggregate_key(round))
        entries = tuple(ShardEntry(sid, shard_digest(arr), int(arr.nbytes)) for sid, arr in shards.items())
        if merkle_root({e.shard_id: e.digest for e in entries}) != meta["merkle_root"]:
            raise IntegrityError(f"zone {self.name}: stored aggregate of round {round} fails its Merkle root")
        summary = AggregateSummary(
            self.name, round, meta["merkle_root"], float(meta["total_weight"]), tuple(meta["sites"]), entries
        )
        with self._lock:
            self._summaries.setdefault(round, summary)
        return summary, shards


def _aggregate_key(round: int) -> str:
    return f"aggregate-{round:06d}"
