"""Unit tests of :class:`fedshard.store.LocalShardStore`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedshard.errors import StoreError
from fedshard.store import LocalShardStore


def _shards(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "fc1.weight#r0c0": rng.standard_normal((4, 3)).astype(np.float32),
        "fc1.weight#r0c1": rng.standard_normal((4, 1)).astype(np.float32),
        "conv.2.bias#r1c0": rng.standard_normal((2, 1)).astype(np.float16),
        "head.w#r0c0": rng.standard_normal((1, 1)),
    }


META = {"zone": "eu-1", "round": 4, "sites": ["site-a", "site-b"], "total_weight": 12.5}


def test_save_then_load_round_trips_meta_and_arrays(tmp_path: Path) -> None:
    store = LocalShardStore(tmp_path / "zone")
    shards = _shards()

    path = store.save("aggregate-000004", shards, META)
    meta, loaded = store.load("aggregate-000004")

    assert path == tmp_path / "zone" / "aggregate-000004.npz"
    assert path.is_file()
    assert meta == META
    assert list(loaded) == list(shards)
    for sid, values in shards.items():
        assert loaded[sid].dtype == values.dtype
        assert loaded[sid].shape == values.shape
        assert loaded[sid].tobytes() == values.tobytes()


def test_nan_payloads_survive(tmp_path: Path) -> None:
    store = LocalShardStore(tmp_path)
    values = np.array([0x7FC00001, 0xFFC12345, 0x80000000], dtype=np.uint32).view(np.float32)

    store.save("k", {"x#r0c0": values}, {})
    _, loaded = store.load("k")

    assert loaded["x#r0c0"].view(np.uint32).tolist() == [0x7FC00001, 0xFFC12345, 0x80000000]


def test_empty_snapshot(tmp_path: Path) -> None:
    store = LocalShardStore(tmp_path)

    store.save("empty", {}, {"round": 1})

    assert store.load("empty") == ({"round": 1}, {})


def test_save_overwrites_a_snapshot(tmp_path: Path) -> None:
    store = LocalShardStore(tmp_path)
    store.save("k", _shards(1), {"v": 1})

    store.save("k", {"only#r0c0": np.ones(2)}, {"v": 2})

    meta, loaded = store.load("k")
    assert meta == {"v": 2}
    assert list(loaded) == ["only#r0c0"]


def test_keys_lists_snapshots_sorted(tmp_path: Path) -> None:
    store = LocalShardStore(tmp_path / "not-yet")
    assert store.keys() == []

    for key in ("b-2", "a.1", "c_3"):
        store.save(key, _shards(), {})
    (tmp_path / "not-yet" / "notes.txt").write_text("not a snapshot")

    assert store.keys() == ["a.1", "b-2", "c_3"]
    assert store.exists("b-2")
    assert not store.exists("d")


@pytest.mark.parametrize("key", ["", "a/b", "../escape", "a b", "name#1", "ключ", "a\nb"])
def test_invalid_key_is_a_store_error(tmp_path: Path, key: str) -> None:
    store = LocalShardStore(tmp_path)

    with pytest.raises(StoreError, match="invalid snapshot name"):
        store.save(key, {}, {})
    with pytest.raises(StoreError, match="invalid snapshot name"):
        store.load(key)
    assert list(tmp_path.iterdir()) == []


def test_missing_snapshot_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no snapshot 'nope'"):
        LocalShardStore(tmp_path).load("nope")


def test_store_error_is_an_os_error() -> None:
    assert issubclass(StoreError, OSError)


@pytest.mark.parametrize("keep", [0, 10, 0.5, -1])
def test_truncated_file_is_a_store_error_naming_the_path(tmp_path: Path, keep: float) -> None:
    store = LocalShardStore(tmp_path)
    path = store.save("k", _shards(), META)
    raw = path.read_bytes()
    cut = int(len(raw) * keep) if isinstance(keep, float) else keep
    path.write_bytes(raw[:cut])

    with pytest.raises(StoreError) as info:
        store.load("k")

    message = str(info.value)
    assert str(path) in message
    assert "corrupt" in message
    assert "\n" not in message


def test_every_single_byte_corruption_is_caught_or_harmless(tmp_path: Path) -> None:
    # A flipped byte either leaves the values intact (it hit metadata the reader does not
    # use) or is reported as a StoreError: never another exception, never wrong values.
    store = LocalShardStore(tmp_path)
    shards = {"w#r0c0": np.arange(12, dtype=np.float32).reshape(3, 4)}
    path = store.save("k", shards, {"round": 1})
    raw = path.read_bytes()

    for at in range(len(raw)):
        damaged = bytearray(raw)
        damaged[at] ^= 0x01
        path.write_bytes(bytes(damaged))
        try:
            meta, loaded = store.load("k")
        except StoreError as exc:
            assert str(path) in str(exc)
            continue
        assert meta == {"round": 1}
        assert loaded["w#r0c0"].tobytes() == shards["w#r0c0"].tobytes()


def test_failed_save_keeps_the_previous_snapshot_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalShardStore(tmp_path)
    before = _shards(1)
    store.save("k", before, {"v": 1})

    def broken_savez(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        store.save("k", _shards(2), {"v": 2})

    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.npz"]
    meta, loaded = store.load("k")
    assert meta == {"v": 1}
    for sid, values in before.items():
        np.testing.assert_array_equal(loaded[sid], values)


def test_save_interrupted_mid_write_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalShardStore(tmp_path)
    real_savez = np.savez

    def half_written(file: object, **arrays: object) -> None:
        real_savez(file, **arrays)
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", half_written)
    with pytest.raises(KeyboardInterrupt):
        store.save("k", _shards(), {})

    assert list(tmp_path.iterdir()) == []
    assert store.keys() == []


def test_meta_that_is_not_json_is_refused_before_writing(tmp_path: Path) -> None:
    store = LocalShardStore(tmp_path)
    store.save("k", _shards(1), {"v": 1})

    with pytest.raises(TypeError):
        store.save("k", _shards(2), {"v": object()})

    assert store.load("k")[0] == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.npz"]
