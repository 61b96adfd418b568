"""Fixtures of the shard-store tests: keys, a fake clock, and a store on every backend."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from fedshard.crypto.at_rest import Kek
from fedshard.store import FsspecBackend, LocalDirBackend
from fedshard.store._backend import Backend

BACKENDS = ["local-dir", "fsspec-memory", "fsspec-local"]


class FakeClock:
    """A settable clock (seconds)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_backend(kind: str, tmp_path: Path) -> Backend:
    """A fresh, empty backend of ``kind``."""
    if kind == "local-dir":
        return LocalDirBackend(tmp_path / "store")
    if kind == "fsspec-memory":
        return FsspecBackend(f"memory://fedshard-tests/{uuid.uuid4().hex}")
    if kind == "fsspec-local":
        return FsspecBackend(str(tmp_path / "fsstore"))
    raise ValueError(kind)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh backend of each kind in turn."""
    return make_backend(request.param, tmp_path)


@pytest.fixture
def kek() -> Kek:
    return Kek.generate()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sample() -> dict[str, np.ndarray]:
    """A few shards of different dtypes and shapes."""
    rng = np.random.default_rng(0)
    return {
        "fc1.weight#r0c0": rng.standard_normal((64, 32)).astype(np.float32),
        "fc1.weight#r0c1": rng.standard_normal((64, 7)).astype(np.float32),
        "fc1.bias#r0c0": rng.standard_normal((64, 1)).astype(np.float64),
        "emb.weight#r1c0": rng.standard_normal((3, 5)).astype(np.float16),
        "steps#r0c0": np.array([[7]], dtype=np.int64),
    }
