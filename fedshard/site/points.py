"""Fault points along what a site sends (see :mod:`fedshard.faults`)."""

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
