"""Publishing a round's aggregates, and the zone's store of them.

At round close each group's running sums become an :class:`~fedshard.protocol.rounds.Aggregate`
(:func:`build_aggregate`): the weighted means of its clear shards, in their original
dtype (a float32 sum becomes its mean in place, so publishing allocates no second
model; the means are within the bound stated in
:mod:`fedshard.aggregation._accumulator`), and the encrypted sums of the others as they
are (sites divide after decrypting), listed in a summary with every shard's digest, its ``encrypted`` flag and
the Merkle root over them (which feeds the model-version chain).

A zone with a key signs each aggregate it publishes (:func:`signed`): a statement of its
round, group, Merkle root, total weight and contributors with their weights, under the
zone's TLS key (:mod:`fedshard.integrity.aggregate_signature`); sites apply nothing
else.

A zone with a store keeps every published aggregate (:class:`AggregateStore`), so it
serves older rounds and survives a restart; what it reads back is checked against its
Merkle root.

Stored format and its contract (``format`` in each snapshot's metadata): a stored
aggregate never changes meaning.

* **3**: clear shards as arrays, ciphertexts as ``(1, n)`` uint8 arrays, and the
  metadata lists the ``encrypted`` shard ids; the root is over BLAKE3 digests. From a
  zone with a key the metadata also holds ``signature``, the zone's signed statement
  (:meth:`AggregateSignature.to_json`), served with the aggregate; one stored without it
  (by a zone without a key, or before zones signed) is served unsigned, and sites under
  mutual TLS refuse to apply it.
* **2** (the same, with SHA-256 digests) and **1** (no ``format`` key, no list):
  written before BLAKE3 (manifest format 3); this version cannot check their roots, so
  it refuses to serve them, in one line (code ``corrupt``), and leaves them as they are.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np

from fedshard.errors import AggregateNotFoundError, IntegrityError, RefusalCode
from fedshard.integrity import ShardEntry, ciphertext_digest, merkle_root, shard_digest
from fedshard.integrity.aggregate_signature import AggregateSignature, AggregateSigner, AggregateStatement
from fedshard.protocol.rounds import Aggregate, AggregateSummary
from fedshard.store import LocalShardStore
from fedshard.zone._state import OpenRound

__all__ = [
    "AGGREGATE_FORMAT",
    "AggregateStore",
    "Contributors",
    "Publications",
    "build_aggregate",
    "missing_noise_shares",
    "signed",
    "summarize",
]

AGGREGATE_FORMAT = 3
"""Format of the aggregates a zone stores (see the module docstring)."""

Contributors = dict[str, list[str]]
"""Shard id → the sites whose shards its aggregate holds (sorted)."""


def summarize(
    zone: str,
    round: int,
    group: str,
    aggregate: tuple[dict[str, np.ndarray], dict[str, bytes]],
    *,
    total_weight: float,
    sites: tuple[str, ...],
) -> AggregateSummary:
    """The summary of an aggregate's ``(means, ciphertexts)``: digests, flags and Merkle root."""
    means, ciphertexts = aggregate
    entries = [ShardEntry(sid, shard_digest(v), int(v.nbytes)) for sid, v in means.items()]
    entries += [ShardEntry(sid, ciphertext_digest(c), len(c), encrypted=True) for sid, c in ciphertexts.items()]
    root = merkle_root({e.shard_id: e.digest for e in entries})
    return AggregateSummary(zone, round, root, total_weight, sites, tuple(entries), group)


def build_aggregate(zone: str, state: OpenRound, group: str) -> tuple[Aggregate, Contributors]:
    """Group ``group`` of a closed round: its aggregate and who contributed to each shard."""
    acc = state.groups.get(group) or state.accumulator()
    means = acc.finalize()
    enc = state.encrypted.get(group)
    ciphertexts = {sid: enc.serialize(sid) for sid in enc.shard_ids()} if enc is not None else {}
    contributors = {sid: sorted(sites) for sid, sites in state.contributors.get(group, {}).items()}
    summary = summarize(
        zone,
        state.spec.round,
        group,
        (means, ciphertexts),
        total_weight=max((acc.weight(sid) for sid in means), default=0.0),
        sites=tuple(sorted({s for sites in contributors.values() for s in sites})),
    )
    return Aggregate(summary, means, ciphertexts), contributors


def signed(aggregate: Aggregate, signer: AggregateSigner, region: str, state: OpenRound) -> Aggregate:
    """``aggregate`` with the zone's signature over its statement: the zone (in ``region``),
    round, group, Merkle root, total weight and every contributor with the weight ``state``'s
    round fixed for it."""
    s = aggregate.summary
    weights = {site: state.spec.weight_for(site) for site in s.sites}
    statement = AggregateStatement.of(s.zone, region, s.round, s.group, s.merkle_root, s.total_weight, weights)
    return replace(aggregate, summary=replace(s, signature=signer.sign(statement)))


def missing_noise_shares(state: OpenRound, group: str, needed: int) -> str | None:
    """An encrypted shard of ``group`` that holds fewer than ``needed`` sites' noise shares
    (with distributed DP noise it carries less noise than the sites accounted), if any."""
    enc = state.encrypted.get(group)
    short = [sid for sid in (enc.shard_ids() if enc else []) if len(state.contributors[group][sid]) < needed]
    return short[0] if short else None


class AggregateStore:
    """A zone's published aggregates on disk, one snapshot per round and group.

    Parameters
    ----------
    root:
        Directory of the snapshots (a :class:`~fedshard.store.LocalShardStore`).
    """

    def __init__(self, root: str | Path) -> None:
        self._store = LocalShardStore(root)

    @staticmethod
    def key(round: int, group: str) -> str:
        """The snapshot name of aggregate ``group`` of ``round``."""
        return f"aggregate-{round:06d}-{group.replace('/', '-').replace('+', '_')}"

    def save(self, aggregate: Aggregate, contributors: Contributors) -> None:
        """Store ``aggregate`` (atomically; see the module docstring for the format)."""
        summary = aggregate.summary
        arrays = dict(aggregate.means)
        arrays.update({sid: np.frombuffer(c, np.uint8).reshape(1, -1) for sid, c in aggregate.ciphertexts.items()})
        meta = {
            "format": AGGREGATE_FORMAT,
            "zone": summary.zone,
            "round": summary.round,
            "group": summary.group,
            "merkle_root": summary.merkle_root,
            "total_weight": summary.total_weight,
            "sites": list(summary.sites),
            "contributors": contributors,
            "encrypted": sorted(aggregate.ciphertexts),
        }
        if summary.signature is not None:
            meta["signature"] = summary.signature.to_json()
        self._store.save(self.key(summary.round, summary.group), arrays, meta)

    def sync(self) -> None:
        """fsync the folder, so that the aggregates renamed into it survive a power cut."""
        root = self._store.root
        if os.name == "posix" and root.is_dir():
            fd = os.open(root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def load(self, zone: str, round: int, group: str) -> tuple[Aggregate, Contributors] | None:
        """The stored aggregate ``group`` of ``round`` (None if there is none), checked against its root.

        Raises
        ------
        IntegrityError
            With code :attr:`~RefusalCode.CORRUPT`: what is stored fails its Merkle root.
        """
        key = self.key(round, group)
        if not self._store.exists(key):
            return None
        meta, arrays = self._store.load(key)
        if meta.get("format", 1) != AGGREGATE_FORMAT:
            raise IntegrityError(
                f"zone {zone}: stored aggregate {group} of round {round} is of format {meta.get('format', 1)}, "
                f"written before BLAKE3 digests; this version serves format {AGGREGATE_FORMAT} only",
                code=RefusalCode.CORRUPT,
            )
        encrypted = set(meta.get("encrypted", []))
        means = {sid: arr for sid, arr in arrays.items() if sid not in encrypted}
        ciphertexts = {sid: arr.tobytes() for sid, arr in arrays.items() if sid in encrypted}
        summary = summarize(
            zone,
            round,
            group,
            (means, ciphertexts),
            total_weight=float(meta["total_weight"]),
            sites=tuple(meta["sites"]),
        )
        if summary.merkle_root != meta["merkle_root"]:
            raise IntegrityError(
                f"zone {zone}: stored aggregate {group} of round {round} fails its Merkle root",
                code=RefusalCode.CORRUPT,
            )
        if "signature" in meta:
            try:
                summary = replace(summary, signature=AggregateSignature.from_json(meta["signature"]))
            except IntegrityError:
                raise IntegrityError(
                    f"zone {zone}: stored aggregate {group} of round {round} has a malformed signature",
                    code=RefusalCode.CORRUPT,
                ) from None
        contributors = {sid: list(v) for sid, v in meta.get("contributors", {}).items()}
        return Aggregate(summary, means, ciphertexts), contributors


KEEP_IN_MEMORY = 64 << 20
"""Latest aggregates stay in memory while the next round is open, as every site fetches them with
that round's train message (it carries their evaluation); larger ones than this many bytes are
spilled when that round closes, before its sums become its aggregates (:meth:`Publications.spill`)."""


class Publications:
    """What a zone has published: the latest round's aggregates in memory, every
    summary it closed, and (with a store) every aggregate on disk.

    Parameters
    ----------
    zone:
        The zone's name (in messages and rebuilt summaries).
    store_dir:
        Where aggregates are stored; None: only the latest round is kept.
    """

    def __init__(self, zone: str, store_dir: str | Path | None) -> None:
        self.zone = zone
        self._store = AggregateStore(store_dir) if store_dir is not None else None
        self._latest: dict[str, tuple[Aggregate, Contributors]] = {}
        self._latest_round = -1
        self._summaries: dict[tuple[int, str], AggregateSummary] = {}
        self._lock = threading.Lock()
        # aggregates read back from the store while some fetch still holds them; reads one at a time,
        # so that fetches at the same time share one read
        self._in_use: dict[tuple[int, str], tuple[weakref.ref[Aggregate], Contributors]] = {}
        self._reading = threading.Lock()

    def publish(self, aggregate: Aggregate, contributors: Contributors) -> None:
        """Keep ``aggregate`` (stored first, when there is a store) and its summary."""
        summary = aggregate.summary
        if self._store is not None:
            self._store.save(aggregate, contributors)
        with self._lock:
            if summary.round != self._latest_round:
                self._latest, self._latest_round = {}, summary.round
            self._latest[summary.group] = (aggregate, contributors)
            self._summaries[(summary.round, summary.group)] = summary

    def restore(self, summaries: list[AggregateSummary]) -> None:
        """Know the summaries of aggregates stored before a restart (checked by
        :func:`~fedshard.zone.recovery.recover_rounds`), so that closing their round again
        answers with them."""
        with self._lock:
            self._summaries.update({(s.round, s.group): s for s in summaries})

    def sync(self) -> None:
        """Make the names of the stored aggregates durable (fsync the store's folder)."""
        if self._store is not None:
            self._store.sync()

    def spill(self) -> None:
        """Stop holding the latest aggregates in memory when they are stored and larger than
        :data:`KEEP_IN_MEMORY`. A zone calls it when the next round closes: the sites fetched
        them during that round (from memory: no store read per fetch, and the zone held them
        beside that round's sums either way, since sites fetch and push in turn), and the
        published aggregates it is about to build may then take their memory. Later fetches
        read them from the store, checked against their Merkle root. Without a store the
        latest aggregates are their only copy and stay."""
        if self._store is None:
            return
        with self._lock:
            if sum(aggregate.nbytes for aggregate, _ in self._latest.values()) > KEEP_IN_MEMORY:
                self._latest = {}

    def summaries(self, round: int) -> list[AggregateSummary]:
        """The summaries published for ``round``, by group."""
        with self._lock:
            return [s for (r, _), s in sorted(self._summaries.items()) if r == round]

    def load(self, round: int, group: str) -> tuple[Aggregate, Contributors]:
        """Aggregate ``group`` of ``round`` and its contributors: the latest round from
        memory (until the next round closes, when a large one is spilled: :meth:`spill`), others (and any
        after a restart) from the store, checked. Fetches at the same time share one read of the store:
        what was read is kept while a fetch still holds it, never longer.

        Raises
        ------
        AggregateNotFoundError
            There is none (not closed yet, unknown, or not kept without a store).
        IntegrityError
            What is stored fails its Merkle root (code :attr:`~RefusalCode.CORRUPT`).
        """
        key = (round, group)
        with self._lock:
            if round == self._latest_round and group in self._latest:
                return self._latest[group]
            known = key in self._summaries
        with self._reading:
            entry = self._in_use.get(key)
            held = entry[0]() if entry is not None else None
            loaded = (held, entry[1]) if held is not None and entry is not None else None
            if loaded is None and self._store is not None:
                loaded = self._store.load(self.zone, round, group)
                if loaded is not None:
                    self._in_use[key] = (weakref.ref(loaded[0]), loaded[1])
            for gone in [k for k, (ref, _) in self._in_use.items() if ref() is None]:  # no fetch holds them
                del self._in_use[gone]
        if loaded is None:
            raise AggregateNotFoundError(
                f"zone {self.zone}: no {group} aggregate for round {round} "
                + ("(this zone keeps only the latest without a store)" if known else "(not closed yet, or unknown)")
            )
        with self._lock:
            self._summaries.setdefault(key, loaded[0].summary)
        return loaded
