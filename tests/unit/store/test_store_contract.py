"""Contract tests of the ShardStore protocol, run against every backend (local folder, fsspec memory, fsspec local)."""

from __future__ import annotations

import inspect
import typing

import numpy as np
import pytest

from fedshard.crypto.at_rest import Kek
from fedshard.errors import IntegrityError, ShardIntegrityError, ShardNotFoundError, StoreError, StoreKeyError
from fedshard.integrity.digest import shard_digest
from fedshard.store import SealedShardStore, ShardStore, Tier
from fedshard.store._backend import Backend
from fedshard.store.catalog import CATALOG
from fedshard.store.sealed_store import blob_name
from fedshard.store.verify import check_store


def _blob(store: SealedShardStore, shard_id: str) -> str:
    return blob_name(shard_id, store.stat(shard_id).version)


_PROTOCOL_METHODS = sorted(
    name for name, value in vars(ShardStore).items() if inspect.isfunction(value) and not name.startswith("_")
)


def test_protocol_lists_the_store_methods() -> None:
    assert _PROTOCOL_METHODS == ["delete", "get", "get_meta", "list", "put", "put_many", "set_meta", "stat"]


@pytest.mark.parametrize("name", _PROTOCOL_METHODS)
def test_sealed_store_method_has_the_protocol_signature(name: str) -> None:
    """Same parameters (names, kinds, defaults) and the same types as ShardStore declares."""
    want, got = getattr(ShardStore, name), getattr(SealedShardStore, name)
    want_params = [(p.name, p.kind, p.default) for p in inspect.signature(want).parameters.values()]
    got_params = [(p.name, p.kind, p.default) for p in inspect.signature(got).parameters.values()]
    assert got_params == want_params
    assert typing.get_type_hints(got) == typing.get_type_hints(want)


@pytest.mark.parametrize("missing", _PROTOCOL_METHODS)
def test_a_class_missing_a_method_is_not_a_shard_store(missing: str) -> None:
    methods = {name: getattr(SealedShardStore, name) for name in _PROTOCOL_METHODS if name != missing}
    assert isinstance(type("Complete", (), {**methods, missing: getattr(SealedShardStore, missing)})(), ShardStore)
    assert not isinstance(type("Partial", (), methods)(), ShardStore)


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype.newbyteorder("<") and got.shape == want.shape
    assert got.tobytes() == want.astype(want.dtype.newbyteorder("<")).tobytes()


class TestShardStoreContract:
    """Every backend must give the same behaviour through SealedShardStore."""

    def test_is_a_shard_store(self, backend: Backend, kek: Kek) -> None:
        store = SealedShardStore.create(backend, kek)
        assert isinstance(store, ShardStore)
        assert not isinstance(backend, ShardStore)  # the check tells stores from other objects

    def test_round_trip_of_dtypes_and_shapes(self, backend: Backend, kek: Kek, sample: dict[str, np.ndarray]) -> None:
        store = SealedShardStore.create(backend, kek)
        extra = {
            "scalar": np.array(2.5, dtype=np.float32),
            "empty#r0c0": np.zeros((0, 4), dtype=np.float32),
            "big-endian": np.arange(6, dtype=">f4").reshape(2, 3),
            "flags": np.array([True, False]),
        }
        store.put_many({**sample, **extra})
        for sid, want in {**sample, **extra}.items():
            got = store.get(sid)
            _assert_same(got, want)
            assert got.flags.writeable
        reopened = SealedShardStore.open(backend, kek)
        for sid, want in sample.items():
            _assert_same(reopened.get(sid), want)

    def test_versions_grow_and_superseded_blobs_go(self, backend: Backend, kek: Kek) -> None:
        store = SealedShardStore.create(backend, kek)
        a = np.ones((4, 4), dtype=np.float32)
        assert store.put("a", a).version == 1
        stat = store.put("a", 2 * a)
        assert stat.version == 2 and stat.tier is Tier.HOT and stat.encoding == "full"
        assert stat.digest == stat.source_digest == shard_digest(2 * a)
        assert stat.logical_bytes == 64 and stat.stored_bytes > 64
        assert backend.list("blobs/") == [blob_name("a", 2)]
        np.testing.assert_array_equal(store.get("a"), 2 * a)

    def test_put_many_is_one_commit(self, backend: Backend, kek: Kek, sample: dict[str, np.ndarray]) -> None:
        store = SealedShardStore.create(backend, kek)
        before = store.generation
        stats = store.put_many(sample)
        assert store.generation == before + 1
        assert [s.shard_id for s in stats] == list(sample)
        assert store.list() == sorted(sample) and len(store) == len(sample) and "steps#r0c0" in store

    def test_delete(self, backend: Backend, kek: Kek, sample: dict[str, np.ndarray]) -> None:
        store = SealedShardStore.create(backend, kek)
        store.put_many(sample)
        store.delete("fc1.bias#r0c0")
        assert "fc1.bias#r0c0" not in store.list()
        with pytest.raises(ShardNotFoundError, match=r"no shard 'fc1\.bias#r0c0'"):
            store.get("fc1.bias#r0c0")
        with pytest.raises(LookupError):
            SealedShardStore.open(backend, kek).stat("fc1.bias#r0c0")
        assert len(backend.list("blobs/")) == len(sample) - 1

    def test_metadata_persists(self, backend: Backend, kek: Kek) -> None:
        store = SealedShardStore.create(backend, kek)
        store.set_meta("model", {"version": "ab" * 32, "round": 3})
        assert SealedShardStore.open(backend, kek).get_meta("model") == {"version": "ab" * 32, "round": 3}
        assert store.get_meta("absent", 5) == 5

    def test_failed_batch_changes_nothing(self, backend: Backend, kek: Kek, sample: dict[str, np.ndarray]) -> None:
        store = SealedShardStore.create(backend, kek)
        store.put_many(sample)
        blobs = backend.list("blobs/")
        with pytest.raises(RuntimeError, match="boom"), store.batch():
            store.put("new", np.ones(3))
            store.put("fc1.weight#r0c0", np.zeros((64, 32), dtype=np.float32))
            raise RuntimeError("boom")
        assert "new" not in store and backend.list("blobs/") == blobs
        for s in (store, SealedShardStore.open(backend, kek)):
            _assert_same(s.get("fc1.weight#r0c0"), sample["fc1.weight#r0c0"])
            assert s.stat("fc1.weight#r0c0").version == 1

    def test_opening(self, backend: Backend, kek: Kek) -> None:
        with pytest.raises(StoreError, match="no shard store"):
            SealedShardStore.open(backend, kek)
        SealedShardStore.create(backend, kek)
        with pytest.raises(StoreError, match="already exists"):
            SealedShardStore.create(backend, kek)
        with pytest.raises(StoreKeyError, match="not this store's key"):
            SealedShardStore.open(backend, Kek.generate())

    def test_bad_input_is_refused(self, backend: Backend, kek: Kek) -> None:
        store = SealedShardStore.create(backend, kek)
        with pytest.raises(StoreError, match="invalid shard id"):
            store.put("", np.ones(1))
        with pytest.raises(StoreError, match="numeric"):
            store.put("s", np.array(["x"]))

    def test_nothing_readable_without_the_key(self, backend: Backend, kek: Kek) -> None:
        store = SealedShardStore.create(backend, kek)
        secret = np.full(1000, 1234.5678, dtype=np.float64)
        store.put("secret", secret)
        for name in backend.list():
            raw = backend.read(name)
            assert raw is not None and secret.tobytes()[:16] not in raw

    # read checks: each damage detected with a clear error, nothing else affected ---------------------------
    @pytest.mark.parametrize(
        ("damage", "message"),
        [
            ("tampered", "failed authentication"),
            ("header", "stored file"),
            ("swapped", "holds shard 'fc1.weight#r0c1': files were swapped"),
            ("rolled-back", "holds version 1, the catalog says 2: rolled back"),
            ("truncated", "truncated"),
            ("missing", "is missing"),
        ],
    )
    def test_damaged_shard_is_detected_alone(
        self, backend: Backend, kek: Kek, sample: dict[str, np.ndarray], damage: str, message: str
    ) -> None:
        victim, other = "fc1.weight#r0c0", "fc1.weight#r0c1"
        store = SealedShardStore.create(backend, kek)
        store.put_many(sample)
        old_copy = backend.read(_blob(store, victim))
        store.put(victim, sample[victim] + 1)  # version 2
        name = _blob(store, victim)
        raw = backend.read(name)
        assert raw is not None and old_copy is not None
        if damage == "tampered":
            backend.write(name, raw[:-100] + bytes([raw[-100] ^ 1]) + raw[-99:])
        elif damage == "header":
            backend.write(name, raw.replace(b'"version":2', b'"version":3', 1))
        elif damage == "swapped":
            other_raw = backend.read(_blob(store, other))
            assert other_raw is not None
            backend.write(name, other_raw)
        elif damage == "rolled-back":
            backend.write(name, old_copy)
        elif damage == "truncated":
            backend.write(name, raw[: len(raw) // 2])
        else:
            backend.delete(name)

        for s in (store, SealedShardStore.open(backend, kek)):
            with pytest.raises(ShardIntegrityError, match=message) as info:
                s.get(victim)
            assert info.value.shard_id == victim and victim in str(info.value)
            assert "\n" not in str(info.value)
            assert isinstance(info.value, IntegrityError)
            for sid, want in sample.items():
                if sid != victim:
                    _assert_same(s.get(sid), want)
            report = check_store(s)
            assert [p.shard_id for p in report.problems] == [victim]

    def test_altered_catalog_or_key_table_is_refused(
        self, backend: Backend, kek: Kek, sample: dict[str, np.ndarray]
    ) -> None:
        store = SealedShardStore.create(backend, kek)
        store.put_many(sample)
        raw = backend.read(CATALOG)
        table_name = backend.list("keys/")[0]
        table = backend.read(table_name)
        assert raw is not None and table is not None
        digest = bytes.fromhex(store.stat("fc1.bias#r0c0").digest)
        at = raw.index(digest)
        backend.write(CATALOG, raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :])
        with pytest.raises(StoreError, match="catalog was altered"):
            SealedShardStore.open(backend, kek)
        backend.write(CATALOG, raw)
        backend.write(table_name, table[:-40] + bytes([table[-40] ^ 1]) + table[-39:])
        with pytest.raises(StoreError, match="failed authentication"):
            SealedShardStore.open(backend, kek)
        backend.delete(table_name)
        with pytest.raises(StoreError, match=r"key table .* is missing"):
            SealedShardStore.open(backend, kek)
        backend.write(table_name, table)
        SealedShardStore.open(backend, kek)  # restored


class FailingCatalogWrites:
    """Wraps a backend: writing the catalog fails, before the write (``after=False``) or after it."""

    def __init__(self, inner: Backend, after: bool) -> None:
        self.inner, self.after = inner, after
        self.location, self.local_root = inner.location, inner.local_root

    def write(self, name: str, data: bytes | memoryview) -> None:
        if name == CATALOG:
            if self.after:
                self.inner.write(name, data)
            raise StoreError("disk trouble")
        self.inner.write(name, data)

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)


@pytest.mark.parametrize("after", [False, True])
def test_a_failed_commit_rolls_back_only_if_it_did_not_land(
    backend: Backend, kek: Kek, sample: dict[str, np.ndarray], after: bool
) -> None:
    SealedShardStore.create(backend, kek).put_many(sample)
    store = SealedShardStore.open(FailingCatalogWrites(backend, after), kek)  # type: ignore[arg-type]
    new = np.zeros((64, 32), np.float32)
    if after:  # the catalog was replaced: the commit stands
        store.put("fc1.weight#r0c0", new)
    else:
        with pytest.raises(StoreError, match="disk trouble"):
            store.put("fc1.weight#r0c0", new)
    want = new if after else sample["fc1.weight#r0c0"]
    for s in (store, SealedShardStore.open(backend, kek)):
        np.testing.assert_array_equal(s.get("fc1.weight#r0c0"), want)
        assert s.stat("fc1.weight#r0c0").version == (2 if after else 1)
        assert check_store(s).ok and not s.orphans()
