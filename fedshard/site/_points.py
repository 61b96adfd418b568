"""Fault points along what a site sends (see :mod:`fedshard.faults`).

The points a train message passes, in order (``FEDSHARD_FAULTS_LOG`` lists them with
their occurrences; ``tests/integration/test_site_crashes.py`` kills a site at 116 of them):

========  ====================================================================================
load      ``site.load.begin``, ``store.read.shard`` (each shard), ``site.load.end``
apply     per missed round: ``site.apply.fetch``, ``site.apply.fetched``, ``site.apply.decrypted``,
          ``site.apply.applied``
ledger    ``site.ledger.open``, ``site.ledger.reserve``, ``site.ledger.anchor`` (after each
          ledger write, before the store commit that anchors it), ``site.ledger.reserved``
save      the caught-up model, in the store commit that anchors the reservation (without DP,
          or refused: right after ``ledger``): ``site.save.begin``, ``store.write.blob`` (each
          shard), ``store.file.written`` and ``store.file.renamed`` (each file, around its
          rename), ``store.commit.keys``, ``store.commit.sync``, ``store.commit.catalog`` (the
          commit), ``store.commit.garbage``, ``site.save.end``; then ``site.ledger.reserved``
train     ``site.train.begin``, ``site.train.dp`` (DP-SGD's steps checked), ``site.train.sealed``
push      per zone: ``site.push.manifest``, ``site.push.shard`` (each shard streamed),
          ``site.push.done``
commit    ``site.ledger.commit``, ``site.ledger.anchor``, ``site.ledger.committed``
========  ====================================================================================

A site's first message (a query) saves its genesis model (the ``save`` points) and
creates its ledger (``site.ledger.anchor``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeVar

from fedshard import faults

__all__ = ["pointed"]

V = TypeVar("V")


class _Pointed(Mapping[str, V]):
    """``values`` as they are, with fault point ``name`` reached before each key is iterated."""

    def __init__(self, name: str, values: Mapping[str, V]) -> None:
        self._name = name
        self._values = values

    def __getitem__(self, key: str) -> V:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        for key in self._values:
            faults.point(self._name)
            yield key

    def __len__(self) -> int:
        return len(self._values)


def pointed(name: str, values: Mapping[str, V]) -> Mapping[str, V]:
    """``values``, reaching fault point ``name`` each time a key is iterated (e.g. each
    shard a push streams: a crash test kills the site between two shards)."""
    return _Pointed(name, values)
