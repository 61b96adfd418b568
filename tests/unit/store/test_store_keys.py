"""Key-encryption keys (loading, refusals) and resumable key rotation."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest

from fedshard.crypto.at_rest import KEK_ENV, KEK_FILE_ENV, Kek, generate_kek_file, load_kek
from fedshard.errors import FedshardError, PkiError, StoreError, StoreKeyError
from fedshard.store import LocalDirBackend, SealedShardStore, rotate_keys
from fedshard.store._backend import Backend
from fedshard.store.catalog import CATALOG
from fedshard.store.rotation import JOURNAL, pending_rotation

STEPS = ["journal", "rewrap", "commit", "done"]
KEYS = "keys/"


# loading KEKs -------------------------------------------------------------------------------
def test_key_file_round_trip_and_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEK_ENV, raising=False)
    monkeypatch.delenv(KEK_FILE_ENV, raising=False)
    path = tmp_path / "keys" / "site.kek"
    kek = generate_kek_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_kek(path) == kek and load_kek(path).source == path
    assert kek.kek_id not in path.read_text() and "Kek(id=" in repr(kek) and path.read_text() not in repr(kek)
    with pytest.raises(PkiError, match="already exists"):
        generate_kek_file(path)
    monkeypatch.setenv(KEK_FILE_ENV, str(path))
    assert load_kek() == kek
    monkeypatch.setenv(KEK_ENV, Kek.generate().to_text().strip())
    assert load_kek() != kek  # the key itself wins over a key file named by the environment


def test_key_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEK_ENV, raising=False)
    monkeypatch.delenv(KEK_FILE_ENV, raising=False)
    with pytest.raises(StoreKeyError, match="no key-encryption key: pass --key-file"):
        load_kek()
    with pytest.raises(StoreKeyError, match="does not exist"):
        load_kek(tmp_path / "nope")
    loose = tmp_path / "loose.kek"
    loose.write_text(Kek.generate().to_text())
    os.chmod(loose, 0o644)
    with pytest.raises(StoreKeyError, match="chmod 600"):
        load_kek(loose)
    bad = tmp_path / "bad.kek"
    bad.write_text("not hex")
    os.chmod(bad, 0o600)
    with pytest.raises(StoreKeyError, match="64 hex digits"):
        load_kek(bad)
    monkeypatch.setenv(KEK_ENV, "abcd")
    with pytest.raises(StoreKeyError, match=r"\$FEDSHARD_STORE_KEK .*64 hex digits"):
        load_kek()


def test_key_inside_the_store_is_refused(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    inside = generate_kek_file(store_dir / "keys" / "site.kek")
    with pytest.raises(StoreKeyError, match="inside the store") as info:
        load_kek(inside.source, store_root=store_dir)
    assert "\n" not in str(info.value)
    with pytest.raises(StoreKeyError, match="inside the store"):
        SealedShardStore.create(store_dir, inside)
    outside = generate_kek_file(tmp_path / "site.kek")
    SealedShardStore.create(store_dir, outside)  # fine


# rotation -------------------------------------------------------------------------------------
def _filled(backend: Backend, kek: Kek, n: int = 12) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    shards = {f"layer{i}.weight#r0c0": rng.standard_normal((16, 8)).astype(np.float32) for i in range(n)}
    SealedShardStore.create(backend, kek).put_many(shards)
    return shards


def _all_readable(backend: Backend, kek: Kek, shards: dict[str, np.ndarray]) -> None:
    store = SealedShardStore.open(backend, kek)
    assert store.kek_id == kek.kek_id
    for sid, want in shards.items():
        np.testing.assert_array_equal(store.get(sid), want)


def test_rotation_rewraps_without_touching_shards_and_retires_the_old_key(backend: Backend) -> None:
    old, new = Kek.generate(), Kek.generate()
    shards = _filled(backend, old)
    untouched = {name: backend.read(name) for name in [*backend.list("blobs/"), CATALOG]}
    table = backend.read(backend.list(KEYS)[0])

    report = rotate_keys(backend, old, new)

    assert report.keys == len(shards) and not report.resumed
    # no shard re-encrypted, the catalog not rewritten: only the key table changed
    assert {name: backend.read(name) for name in [*backend.list("blobs/"), CATALOG]} == untouched
    assert backend.read(backend.list(KEYS)[0]) != table
    _all_readable(backend, new, shards)
    with pytest.raises(StoreKeyError, match="retired by a key rotation"):
        SealedShardStore.open(backend, old)
    assert backend.read(JOURNAL) is None
    with pytest.raises(StoreKeyError, match="retired"):
        rotate_keys(backend, old, Kek.generate())
    with pytest.raises(StoreKeyError, match="is the current key"):
        rotate_keys(backend, new, new)


class CrashError(Exception):
    """A simulated crash."""


class CrashingBackend:
    """Wraps a backend; writing ``target`` leaves a partial temporary (``fraction`` of the bytes) and crashes."""

    def __init__(self, inner: Backend, target: str, fraction: float) -> None:
        self.inner, self.target, self.fraction = inner, target, fraction
        self.location, self.local_root = inner.location, inner.local_root

    def write(self, name: str, data: bytes | memoryview) -> None:
        if name == self.target:
            self.inner.write(f".tmp/{name}.partial", bytes(data)[: int(len(data) * self.fraction)])
            raise CrashError(f"crashed writing {name}")
        self.inner.write(name, data)

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)


@pytest.mark.parametrize("point", [*STEPS, "key-table-write"])
def test_rotation_interrupted_at_any_point_resumes(backend: Backend, point: str) -> None:
    """Crash after each step, or part-way (a random fraction) through the key table's write; resume; every
    shard stays readable throughout, and the old key fails afterwards."""
    rnd = random.Random(point)
    old, new = Kek.generate(), Kek.generate()
    shards = _filled(backend, old, n=rnd.randint(1, 20))

    def crash_after(step: str) -> None:
        if step == point:
            raise CrashError(step)

    with pytest.raises(CrashError):
        if point == "key-table-write":
            table = backend.list(KEYS)[0]
            rotate_keys(CrashingBackend(backend, table, rnd.random()), old, new)  # type: ignore[arg-type]
        else:
            rotate_keys(backend, old, new, hook=crash_after)

    # the store is readable at once with the key its catalog is under
    committed = point in ("commit", "done")
    _all_readable(backend, new if committed else old, shards)
    if not committed:
        journal = pending_rotation(backend)
        assert journal is not None and (journal["from"], journal["to"]) == (old.kek_id, new.kek_id)
        with pytest.raises(StoreKeyError, match=r"rotation to key .* was interrupted"):
            SealedShardStore.open(backend, new)

    if point == "key-table-write":
        assert backend.temporaries() and backend.remove_temporaries() >= 1
    report = rotate_keys(backend, old, new)  # resume
    assert report.resumed == (point != "done")
    _all_readable(backend, new, shards)
    with pytest.raises(StoreKeyError):
        SealedShardStore.open(backend, old)
    assert pending_rotation(backend) is None


def test_rotation_with_the_wrong_key_changes_nothing(tmp_path: Path) -> None:
    backend = LocalDirBackend(tmp_path / "s")
    old = Kek.generate()
    shards = _filled(backend, old)
    before = {name: backend.read(name) for name in backend.list()}
    with pytest.raises(StoreKeyError, match="not this store's key"):
        rotate_keys(backend, Kek.generate(), Kek.generate())
    assert {name: backend.read(name) for name in backend.list()} == before and backend.read(JOURNAL) is None
    _all_readable(backend, old, shards)
    with pytest.raises(StoreError, match="no shard store"):
        rotate_keys(LocalDirBackend(tmp_path / "none"), old, Kek.generate())
    assert issubclass(StoreKeyError, FedshardError)
