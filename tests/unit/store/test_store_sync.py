"""A batch's blobs and its key table are made durable with one barrier, before the catalog.

Counted on the local folder (syncfs and fsync calls, patched to count and then do the
real call), and checked in order on a fake backend that models a power loss: only what
was synced, or written with ``write``, survives it.
"""

from __future__ import annotations

import builtins
import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import fedshard.store.local_dir as local_dir
from fedshard._fs import syncfs_supported
from fedshard.crypto.at_rest import Kek
from fedshard.errors import StoreError
from fedshard.store import LocalDirBackend, SealedShardStore
from fedshard.store._backend import TMP_PREFIX, Backend, DeferredWrites, DefersSync, ObjectStat
from fedshard.store._shard_io import BLOBS, blob_name
from fedshard.store.catalog import CATALOG, KEYS_PREFIX
from fedshard.store.verify import check_store

N = 40  # shards per batch, in 4 blob folders: 40 fsyncs per batch would be per blob, 4 per folder
IDS = [sid for sid in (f"layer{i}.weight#r0c0" for i in range(5000)) if blob_name(sid, 1)[len(BLOBS)] == "0"]
IDS = [sid for sid in IDS if blob_name(sid, 1)[len(BLOBS) + 1] in "0123"][:N]


def _shards(value: float, n: int = N) -> dict[str, np.ndarray]:
    return {sid: np.full((16, 16), value + i, np.float32) for i, sid in enumerate(IDS[:n])}


class Calls:
    """Counts fsync calls (on files and on folders), syncfs calls, and folders fsync'd."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, syncfs_result: bool | None = None) -> None:
        self.files = self.dirs = self.syncfs = 0
        real_fsync, real_syncfs = os.fsync, local_dir.syncfs

        def fsync(fd: int) -> None:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                self.dirs += 1
            else:
                self.files += 1
            real_fsync(fd)

        def syncfs(fd: int) -> bool:
            self.syncfs += 1
            return real_syncfs(fd) if syncfs_result is None else syncfs_result

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(local_dir, "syncfs", syncfs)


def _store(tmp_path: Path, durable: bool = True) -> tuple[SealedShardStore, Kek]:
    kek = Kek.generate()
    store = SealedShardStore.create(LocalDirBackend(tmp_path / "store", durable=durable), kek)
    store.put_many(_shards(0.0))  # the blob folders exist: the counted batch creates none
    return store, kek


def _blob_dirs(store: SealedShardStore) -> int:
    return len({blob_name(sid, store.stat(sid).version).rsplit("/", 1)[0] for sid in store.list()})


@pytest.mark.skipif(not syncfs_supported(), reason="needs Linux 5.8+ syncfs")
def test_a_batch_costs_one_syncfs_not_an_fsync_per_blob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, kek = _store(tmp_path)
    calls = Calls(monkeypatch)
    store.put_many(_shards(1.0))
    assert calls.syncfs == 1  # the blobs and the key table
    assert calls.files == 1  # the catalog (the commit), on its own after them
    assert calls.dirs == 1  # the root, for the catalog: syncfs wrote back the other folders' entries
    reopened = SealedShardStore.open(tmp_path / "store", kek)
    np.testing.assert_array_equal(reopened.get(IDS[3]), np.full((16, 16), 4.0, np.float32))


def test_without_syncfs_each_file_is_fsynced_and_each_folder_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_dir, "syncfs_supported", lambda: False)
    store, _ = _store(tmp_path)
    calls = Calls(monkeypatch)
    store.put_many(_shards(1.0))
    assert calls.syncfs == 0
    assert calls.files == N + 2
    assert calls.dirs == _blob_dirs(store) + 2 == 6


@pytest.mark.skipif(not syncfs_supported(), reason="needs Linux 5.8+ syncfs")
def test_syncfs_refused_at_run_time_falls_back_to_fsync_of_each_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = _store(tmp_path)
    calls = Calls(monkeypatch, syncfs_result=False)  # as for ENOSYS
    store.put_many(_shards(1.0))
    assert calls.syncfs == 1
    assert calls.files == N + 2


def test_not_durable_fsyncs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = _store(tmp_path, durable=False)
    calls = Calls(monkeypatch)
    store.put_many(_shards(1.0))
    assert (calls.syncfs, calls.files, calls.dirs) == (0, 0, 0)


@pytest.mark.skipif(not syncfs_supported(), reason="needs Linux 5.8+ syncfs")
def test_a_failed_syncfs_fails_the_batch_and_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, kek = _store(tmp_path)

    def failing(fd: int) -> bool:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(local_dir, "syncfs", failing)
    generation = store.generation
    with pytest.raises(StoreError, match=r"cannot make the writes .* durable"):
        store.put_many(_shards(1.0))
    assert store.generation == generation
    for s in (store, SealedShardStore.open(tmp_path / "store", kek)):
        np.testing.assert_array_equal(s.get(IDS[3]), np.full((16, 16), 3.0, np.float32))
        assert not s.orphans() and check_store(s).ok


def test_a_new_folder_is_made_durable_in_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    monkeypatch.setattr(local_dir, "fsync_dir", lambda d: synced.append(os.path.relpath(d, tmp_path)))
    backend = LocalDirBackend(tmp_path / "root")
    backend.write("a/b/c", b"x")
    assert set(synced) == {".", "root", "root/a", "root/a/b"}
    assert backend.read("a/b/c") == b"x" and backend.list() == ["a/b/c"]
    synced.clear()
    backend.write("a/b/d", b"y")  # the folders exist: only the entry's own folder
    assert synced == ["root/a/b"]
    assert not backend.temporaries()


# -- order, and power loss, on a fake backend ------------------------------------------------------------------


class PowerLossBackend:
    """In-memory objects; writes through ``deferred_writes`` are volatile until synced.

    ``log`` records each operation; ``snapshots`` what a power loss right after each one would keep.
    """

    location = "memory:power-loss"
    local_root = None

    def __init__(self, durable: dict[str, bytes] | None = None) -> None:
        self.disk: dict[str, bytes] = dict(durable or {})
        self.volatile: dict[str, bytes] = {}
        self.log: builtins.list[tuple[str, str]] = []
        self.snapshots: builtins.list[dict[str, bytes]] = []

    def _did(self, op: str, name: str) -> None:
        self.log.append((op, name))
        self.snapshots.append(dict(self.disk))

    def write(self, name: str, data: bytes | memoryview) -> None:
        self.volatile.pop(name, None)
        self.disk[name] = bytes(data)
        self._did("write", name)

    def deferred_writes(self) -> DeferredWrites:
        return _Deferred(self)

    def read(self, name: str) -> bytes | None:
        return self.volatile.get(name, self.disk.get(name))

    def delete(self, name: str) -> None:
        self.volatile.pop(name, None)
        self.disk.pop(name, None)
        self._did("delete", name)

    def list(self, prefix: str = "") -> builtins.list[str]:
        return sorted(n for n in {*self.disk, *self.volatile} if n.startswith(prefix))

    def stat(self, name: str) -> ObjectStat | None:
        data = self.read(name)
        return None if data is None else ObjectStat(name, len(data))

    def temporaries(self) -> builtins.list[str]:
        return []

    def remove_temporaries(self) -> int:
        return 0


class _Deferred:
    def __init__(self, backend: PowerLossBackend) -> None:
        self.backend = backend
        self.names: builtins.list[str] = []
        self.closed = False
        backend.log.append(("open", ""))

    def write(self, name: str, data: bytes | memoryview) -> None:
        assert not self.closed
        self.backend.volatile[name] = bytes(data)
        self.names.append(name)
        self.backend._did("deferred", name)

    def sync(self) -> None:
        for name in self.names:
            if name in self.backend.volatile:
                self.backend.disk[name] = self.backend.volatile.pop(name)
        self.backend._did("sync", ",".join(self.names))
        self.names = []

    def close(self) -> None:
        self.closed = True
        self.backend.log.append(("close", ""))


def test_the_fake_is_a_backend_that_defers() -> None:
    backend = PowerLossBackend()
    assert isinstance(backend, Backend) and isinstance(backend, DefersSync)
    assert isinstance(backend.deferred_writes(), DeferredWrites)


def test_every_blob_and_the_key_table_are_synced_before_the_catalog() -> None:
    kek = Kek.generate()
    backend = PowerLossBackend()
    store = SealedShardStore.create(backend, kek)
    store.put_many(_shards(0.0, 5))
    backend.log.clear()
    store.put_many(_shards(1.0, 5))
    ops = [op for op, _ in backend.log]
    blobs = [name for op, name in backend.log if op == "deferred"]
    assert len(blobs) == 6 and all(name.startswith(BLOBS) for name in blobs[:5])
    assert blobs[5].startswith(KEYS_PREFIX)  # the key table joins the batch
    assert ops[:9] == ["open", *["deferred"] * 6, "sync", "write"]
    assert backend.log[7] == ("sync", ",".join(blobs))  # one barrier, every blob of the batch and its key table
    assert backend.log[8] == ("write", CATALOG)  # then the commit
    assert ops[9:] == [*["delete"] * 6, "close"]  # the superseded blobs and key table, after the commit
    assert not [name for op, name in backend.log if op == "write" and name.startswith(BLOBS)]


def test_a_power_loss_at_any_point_leaves_the_old_or_the_new_generation() -> None:
    kek = Kek.generate()
    backend = PowerLossBackend()
    store = SealedShardStore.create(backend, kek)
    store.put_many(_shards(0.0, 5))
    backend.snapshots.clear()
    store.put_many(_shards(1.0, 5))
    seen = set()
    for disk in backend.snapshots:  # the power fails right after this operation
        survivor = SealedShardStore.open(PowerLossBackend(disk), kek)
        values = {float(survivor.get(sid)[0, 0]) - i for i, sid in enumerate(_shards(0.0, 5))}
        assert values in ({0.0}, {1.0}), "a mixed or torn commit"
        seen.add(values.pop())
    assert seen == {0.0, 1.0}


def test_the_test_sees_a_catalog_written_before_its_blobs_are_synced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The power-loss check can fail: sync after the catalog, and a survivor names a lost key table or blob."""
    kek = Kek.generate()
    backend = PowerLossBackend()
    store = SealedShardStore.create(backend, kek)
    store.put_many(_shards(0.0, 5))
    backend.snapshots.clear()
    late_sync = _Deferred.sync
    monkeypatch.setattr(_Deferred, "sync", lambda self: None)
    monkeypatch.setattr(_Deferred, "close", lambda self: late_sync(self))  # syncs after the commit
    store.put_many(_shards(1.0, 5))
    with pytest.raises(StoreError, match=r"key table .* is missing"):
        for disk in backend.snapshots:
            SealedShardStore.open(PowerLossBackend(disk), kek).get(IDS[0])


def test_a_failed_batch_syncs_nothing_and_removes_its_blobs() -> None:
    kek = Kek.generate()
    backend = PowerLossBackend()
    store = SealedShardStore.create(backend, kek)
    backend.log.clear()
    with pytest.raises(RuntimeError), store.batch():
        store.put_many(_shards(1.0, 3))
        raise RuntimeError("stop")
    ops = [op for op, _ in backend.log]
    assert ops == ["open", "deferred", "deferred", "deferred", "delete", "delete", "delete", "close"]
    assert not backend.list(BLOBS) and len(store) == 0


def test_a_blob_written_outside_a_batch_is_written_at_once() -> None:
    kek = Kek.generate()
    backend = PowerLossBackend()
    store = SealedShardStore.create(backend, kek)
    backend.log.clear()
    store._tx.write_blob(f"{BLOBS}00/x.v1", b"blob")
    assert backend.log == [("write", f"{BLOBS}00/x.v1")]


def test_temporaries_do_not_linger_after_deferred_writes(tmp_path: Path) -> None:
    backend = LocalDirBackend(tmp_path / "store")
    writes = backend.deferred_writes()
    try:
        writes.write("blobs/aa/x.v1", b"1")
        writes.write("blobs/ab/y.v1", b"2")
        writes.sync()
    finally:
        writes.close()
    assert backend.list() == ["blobs/aa/x.v1", "blobs/ab/y.v1"]
    assert not backend.temporaries() and (tmp_path / "store" / TMP_PREFIX).is_dir()


@pytest.mark.skipif(not syncfs_supported(), reason="barriers need syncfs")
def test_under_a_barrier_a_commit_s_superseded_blobs_go_on_the_barrier_s_helper_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer goes on while the superseded blobs and key table are unlinked; the barrier's sync
    waits for that, and outside a barrier the commit removes them itself."""
    import threading

    from fedshard._fs import Barrier, deferred_to

    store, _ = _store(tmp_path)
    removed_by: dict[str, str] = {}
    real_unlink = os.unlink

    def unlink(path: str, *args: object, **kwargs: object) -> None:
        removed_by[os.path.relpath(path, tmp_path / "store")] = threading.current_thread().name
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    def superseded() -> set[str]:  # what writing the first four shards again leaves behind
        return {store.named_objects()[0], *(blob_name(sid, store.stat(sid).version) for sid in IDS[:4])}

    monkeypatch.setattr(os, "unlink", unlink)
    before = superseded()
    barrier = Barrier.over([tmp_path])
    assert barrier is not None
    try:
        with deferred_to(barrier):
            store.put_many(_shards(1.0, 4))
        barrier.sync()
    finally:
        barrier.close()
    assert set(removed_by) == before
    assert all(name.startswith("fedshard-remove") for name in removed_by.values())
    assert store.orphans() == []
    removed_by.clear()
    before = superseded()
    store.put_many(_shards(2.0, 4))  # no barrier: removed by the writer, before the commit returns
    assert set(removed_by) == before and set(removed_by.values()) == {threading.current_thread().name}
    assert store.orphans() == []
