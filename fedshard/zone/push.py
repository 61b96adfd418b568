"""A push in progress at a zone: frames checked one by one, staged within a byte budget,
folded into the round only when the whole push is valid (see :class:`PushSession`)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedshard.aggregation import all_finite
from fedshard.crypto.he import load_ciphertexts
from fedshard.errors import IntegrityError, PushRejectedError, RefusalCode
from fedshard.integrity import Manifest, ShardHasher
from fedshard.protocol.rounds import PushReceipt
from fedshard.sharding import ShardSpec
from fedshard.zone.heap import trim_heap

if TYPE_CHECKING:
    from fedshard.zone.state import OpenRound

__all__ = ["ByteBudget", "PushSession", "PushTarget"]


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


class PushTarget(Protocol):
    """What a push session needs of its zone (the :class:`~fedshard.zone.aggregator.ZoneAggregator`)."""

    name: str
    chunk_hint: int
    """Shards up to this size arrive in one chunk and are kept as received."""
    he_context: Any
    """The zone's public CKKS context, or None."""

    def fold_push(
        self,
        state: OpenRound,
        manifest: Manifest,
        staged: dict[str, np.ndarray],
        groups: dict[str, str],
        ciphertexts: dict[str, list[Any]],
    ) -> PushReceipt:
        """Fold a complete, valid push into the round's sums (all or nothing)."""
        ...

    def end_push(self, state: OpenRound, site_id: str, budget_bytes: int, *, counted: bool) -> None:
        """The push is over: forget it as in progress (unless ``counted``) and return its staging bytes."""
        ...


class PushSession:
    """One site's push in progress. Feed chunks with :meth:`receive`, then :meth:`commit`.

    Any failure raises :class:`PushRejectedError`; call :meth:`abort` (or use the
    session as a context manager) so the staging budget is returned.
    """

    def __init__(
        self,
        zone: PushTarget,
        state: OpenRound,
        manifest: Manifest,
        budget_bytes: int,
        groups: dict[str, str] | None = None,
    ) -> None:
        self._zone = zone
        self._state = state
        self.manifest = manifest
        self._groups = groups or {}
        self._budget_bytes = budget_bytes
        self._expected = {e.shard_id: e for e in manifest.shards}
        self._staged: dict[str, np.ndarray] = {}
        self._ciphertexts: dict[str, list[Any]] = {}  # parsed encrypted shards
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

    def _reject(self, code: RefusalCode, reason: str) -> PushRejectedError:
        # A refusal ends the push: what was staged before it can no longer be committed.
        self.abort()
        return PushRejectedError(
            f"zone {self._zone.name} refused {self.site_id}'s push for round {self.manifest.round}: {reason}", code
        )

    def receive(self, shard_id: str, data: bytes, *, offset: int, dtype: str = "", shape: tuple[int, ...] = ()) -> None:
        """Take one chunk of shard ``shard_id``. The first chunk (offset 0) carries dtype and shape."""
        if self._done:
            raise self._reject(RefusalCode.STATE, "push already finished")
        if self._current is None or self._current[0].shard_id != shard_id:
            if self._current is not None:
                raise self._reject(
                    RefusalCode.TRUNCATED, f"shard {self._current[0].shard_id} ended after {self._received} bytes"
                )
            self._start(shard_id, dtype, shape, offset)
        assert self._current is not None
        spec, hasher, buffer, parts = self._current
        if offset != self._received:
            raise self._reject(
                RefusalCode.OFFSET, f"shard {shard_id}: chunk at offset {offset}, expected {self._received}"
            )
        if self._received + len(data) > spec.nbytes:
            raise self._reject(RefusalCode.SHAPE, f"shard {shard_id}: more than the plan's {spec.nbytes} bytes")
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
            raise self._reject(RefusalCode.DUPLICATE, f"shard {shard_id} sent twice")
        if shard_id not in self._state.plan:
            raise self._reject(RefusalCode.UNKNOWN_SHARD, f"shard {shard_id} is not in the round's shard plan")
        if shard_id not in self._expected:
            raise self._reject(RefusalCode.UNKNOWN_SHARD, f"shard {shard_id} is not listed in the manifest")
        if offset != 0:
            raise self._reject(RefusalCode.OFFSET, f"shard {shard_id} starts at offset {offset}, expected 0")
        spec = self._state.plan.shard(shard_id)
        entry = self._expected[shard_id]
        if entry.encrypted:  # ciphertext bytes travel as a (1, n) uint8 array
            spec = ShardSpec(shard_id, spec.tensor, slice(0, 1), slice(0, entry.nbytes), "uint8")
        try:
            dtype_ok = bool(dtype) and np.dtype(dtype) == np.dtype(spec.dtype)
        except TypeError:
            dtype_ok = False
        if not dtype_ok:
            raise self._reject(
                RefusalCode.DTYPE, f"shard {shard_id} has dtype {dtype or '?'}, the plan says {spec.dtype}"
            )
        if tuple(shape) != spec.shape:
            raise self._reject(
                RefusalCode.SHAPE, f"shard {shard_id} has shape {tuple(shape)}, the plan says {spec.shape}"
            )
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
            raise self._reject(RefusalCode.DIGEST, f"shard {spec.shard_id}: digest does not match the manifest")
        raw = buffer if buffer is not None else (parts[0] if len(parts) == 1 else b"".join(parts))
        values = np.frombuffer(raw, dtype=spec.dtype).reshape(spec.shape)
        if entry.encrypted:
            context = self._zone.he_context
            if context is None:
                raise self._reject(
                    RefusalCode.ENCRYPTION, f"shard {spec.shard_id} is encrypted but this zone has no CKKS context"
                )
            try:
                self._ciphertexts[spec.shard_id] = load_ciphertexts(context, spec.shard_id, bytes(raw))
            except IntegrityError as exc:
                raise self._reject(RefusalCode.ENCRYPTION, str(exc)) from None
        elif not all_finite(values):
            raise self._reject(RefusalCode.NON_FINITE, f"shard {spec.shard_id} contains NaN or infinite values")
        self._staged[spec.shard_id] = values

    def commit(self) -> PushReceipt:
        """Check the push is complete, then fold it into the round's sums."""
        if self._current is not None:
            raise self._reject(RefusalCode.TRUNCATED, f"shard {self._current[0].shard_id} is incomplete")
        missing = [sid for sid in self._expected if sid not in self._staged]
        if missing:
            raise self._reject(
                RefusalCode.MISSING, f"{len(missing)} shard(s) of the manifest never arrived, e.g. {missing[0]}"
            )
        receipt = self._zone.fold_push(self._state, self.manifest, self._staged, self._groups, self._ciphertexts)
        self._done = True
        self._release(counted=True)
        return receipt

    def abort(self) -> None:
        """Drop everything staged; nothing of this push is counted."""
        if not self._done:
            self._done = True
            self._release(counted=False)

    def _release(self, *, counted: bool) -> None:
        self._staged = {}
        self._ciphertexts = {}
        self._current = None
        if self._budget_bytes or not counted:
            self._zone.end_push(self._state, self.site_id, self._budget_bytes, counted=counted)
            if self._budget_bytes >= _TRIM_BYTES:
                trim_heap()
            self._budget_bytes = 0
